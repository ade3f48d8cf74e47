// DaemonStop: how the worker daemon stops on SIGTERM or SIGINT.
//
// The first signal stops it gracefully (Run): the coordinator hears why (Goodbye), the ranks get
// SIGTERM and, after the grace period, SIGKILL, and their final statuses are flushed to the
// coordinator: at most about grace + 5 s, and kShutdownReapTimeout more for a rank that cannot be
// reaped after its SIGKILL (stuck in a GPU driver or on a hung mount), which is then given up on.
//
// A second signal meanwhile (WatchForSecondSignal, on a thread of its own) escalates: it is
// logged ("... again: stopping now"), the ranks get SIGKILL at once instead of after the grace
// period, and each wait still ahead ends at most kEscalatedWait after the escalation or its own
// start, whichever is later: the final statuses that reach the coordinator in that time are
// flushed (the outbound journal keeps the rest for the next run), and the daemon exits within
// about two seconds of the second signal, whatever the grace period.
#ifndef DROPLESS_WORKER_DAEMON_DAEMON_STOP_H_
#define DROPLESS_WORKER_DAEMON_DAEMON_STOP_H_

#include <signal.h>

#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/daemon/rank_manager.h"

namespace dropless {

class DaemonStop {
 public:
  static constexpr absl::Duration kEscalatedWait = absl::Milliseconds(500);
  static constexpr absl::Duration kGoodbyeTimeout = absl::Seconds(1);
  static constexpr absl::Duration kFlushTimeout = absl::Seconds(2);

  // What the coordinator session does on the way out.
  struct SessionHooks {
    // Tells the coordinator why the daemon stops (Goodbye), waiting up to `timeout` for it to be
    // written.
    std::function<void(absl::Duration timeout)> say_goodbye;
    // Nothing is left to send, or there is no session to send it on.
    std::function<bool()> flushed;
  };

  // `ranks` outlives this object; `why` is what the ranks' final statuses say ("stopped: why").
  DaemonStop(RankManager* ranks, std::string why, absl::Duration grace);

  // The graceful stop. Returns once every rank ended (or was given up on) and their statuses were
  // flushed (or the flush ran out of time); earlier after an escalation.
  void Run(const SessionHooks& session);

  // The second signal: SIGKILL to every rank now, every wait of Run cut short. Thread-safe; only
  // the first call does anything.
  void Escalate(int signal);
  bool escalated() const;

  // Waits for a signal of `signals` and Escalate()s on it, until Finish(). The signals must be
  // blocked in every thread (RunWorkerDaemon blocks them before starting any); this blocks them in
  // the calling thread too. A SIGTERM the daemon sent itself (its session ended with an error) is
  // not a second signal.
  void WatchForSecondSignal(const sigset_t& signals);
  // Ends WatchForSecondSignal within about 100 ms.
  void Finish();

 private:
  // Polls `done` until it holds (true), or `timeout` passed, or kEscalatedWait after the later of
  // an escalation and the start of this wait (false).
  bool WaitFor(const std::function<bool()>& done, absl::Duration timeout) const;

  RankManager* const ranks_;
  const std::string why_;
  const absl::Duration grace_;

  mutable absl::Mutex mu_;
  absl::Time escalated_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dropless

#endif  // DROPLESS_WORKER_DAEMON_DAEMON_STOP_H_
