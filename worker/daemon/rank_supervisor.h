// RankSupervisor: starts child processes (rank processes), reads their output and report pipes,
// stops them (SIGTERM, then SIGKILL after a grace period) and reaps them.
//
// One supervisor thread does every fork, kill and waitpid, so a pid is never signalled after it
// was reaped, and children get PR_SET_PDEATHSIG tied to a thread that lives as long as the
// supervisor (children die with the daemon). Children are reaped by waitpid on their own pids
// (never waitpid(-1): other children of the process are left alone), polled every few tens of ms,
// so no SIGCHLD handler is needed. An ended child is seen without reaping it (waitid WNOWAIT) and
// reaped only after on_exit returned: while the daemon has not handed its end over (the rank
// manager journals it), the zombie still shows it.
//
// Each child runs in its own process group (stop signals reach its whole tree), with stdin from
// /dev/null, stdout and stderr on one pipe (lines to on_output, bytes appended to log_path, capped
// and rotated to log_path.1: rank_log_file.h), and optionally fd 3 as the report pipe (lines to
// on_report). Signal dispositions and the signal mask are reset to defaults in the child before
// exec. The pipes are drained whatever becomes of the log file: a child never blocks on it.
#ifndef DROPLESS_WORKER_DAEMON_RANK_SUPERVISOR_H_
#define DROPLESS_WORKER_DAEMON_RANK_SUPERVISOR_H_

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/daemon/rank_log_file.h"

namespace dropless {

struct ChildSpec {
  std::string path;               // executable to exec
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // "KEY=VALUE" set on top of this process's environment
  std::string log_path;           // output bytes are appended here too; empty: no file
  // Cap of log_path before it is rotated to log_path.1 (RankLogFile); 0: none.
  int64_t log_max_bytes = kDefaultRankLogMaxBytes;
  bool report_pipe = false;       // give the child fd 3 as a report pipe
};

struct ChildExit {
  int exit_code = 0;            // when signal == 0
  int signal = 0;               // terminating signal, 0 when the child exited
  bool stop_requested = false;  // Stop() was called before it ended

  bool success() const { return signal == 0 && exit_code == 0; }
  // Shell convention: exit code, or 128 + signal.
  int shell_status() const { return signal != 0 ? 128 + signal : exit_code; }
  // "exit code 3" or "signal 9 (Killed)".
  std::string Describe() const;
};

class RankSupervisor {
 public:
  using ChildId = uint64_t;  // chosen by the caller, unique among its live children

  // Called on the supervisor thread, in order for one child: its lines, then exactly one on_exit.
  // They may call Stop() but not Start() (Start waits for the supervisor thread).
  struct Callbacks {
    std::function<void(ChildId, absl::string_view line)> on_output;
    std::function<void(ChildId, absl::string_view line)> on_report;
    std::function<void(ChildId, const ChildExit&)> on_exit;
  };

  // Longest line passed to a callback; longer output is split.
  static constexpr size_t kMaxLineBytes = 16 * 1024;

  // How long the destructor waits for children to be reaped after their SIGKILL by default.
  static constexpr absl::Duration kShutdownReapTimeout = absl::Seconds(10);

  explicit RankSupervisor(Callbacks callbacks,
                          absl::Duration shutdown_reap_timeout = kShutdownReapTimeout);
  // SIGKILLs every child still alive and reaps it (on_exit is still called). A child that cannot
  // be reaped within shutdown_reap_timeout of that (stuck in uninterruptible sleep: a GPU driver,
  // a hard-mounted volume) is left behind, its pid logged as an error, without an on_exit: its
  // end is not known. The supervisor thread has ended and touches nothing once this returns.
  ~RankSupervisor();
  RankSupervisor(const RankSupervisor&) = delete;
  RankSupervisor& operator=(const RankSupervisor&) = delete;

  // Forks and execs; returns the pid once exec succeeded (an exec failure is an error here, not
  // an on_exit). `id` must not belong to a live child.
  absl::StatusOr<pid_t> Start(ChildId id, const ChildSpec& spec);

  // SIGTERM to the child's process group now, SIGKILL after `grace` if it is still alive.
  // Unknown or already-ended ids are ignored; a second Stop never extends the first deadline.
  void Stop(ChildId id, absl::Duration grace);
  void StopAll(absl::Duration grace);
  // SIGKILL to every child now, whatever grace a Stop gave it (a stop escalated: the daemon exits
  // at once). From then on the destructor gives up on a child it cannot reap after `reap_timeout`
  // rather than shutdown_reap_timeout, also when it is already waiting.
  void KillAll(absl::Duration reap_timeout);

  // Children started and not yet reaped.
  int live_children() const;
  // True once no child is live and every on_exit has returned, false after `timeout`.
  bool WaitUntilIdle(absl::Duration timeout) const;

 private:
  struct StartRequest;
  struct StopRequest {
    bool all = false;
    ChildId id = 0;
    absl::Duration grace;
  };
  struct Child;
  struct LineBuffer {
    std::string text;             // bytes read, not yet emitted as lines
    bool split_at_limit = false;  // the last line emitted was cut at kMaxLineBytes
  };

  void Loop();
  void Wake();
  void HandleStart(StartRequest* request);
  void HandleStop(const StopRequest& stop);
  void ReadOutput(Child& child, bool drain);
  void Reap();
  void EnforceDeadlines();
  void EmitLines(ChildId id, LineBuffer* lines, bool report, bool flush_partial);

  // Shutting down with children left at `deadline`: gives up on them (logged), true then.
  bool AbandonUnreapedChildren(absl::Time deadline);

  const Callbacks callbacks_;
  int wake_fd_ = -1;  // eventfd: requests for the supervisor thread

  mutable absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration shutdown_reap_timeout_ ABSL_GUARDED_BY(mu_);  // KillAll may shorten it
  absl::Time shutdown_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::deque<StartRequest*> starts_ ABSL_GUARDED_BY(mu_);
  std::deque<StopRequest> stops_ ABSL_GUARDED_BY(mu_);
  int live_ ABSL_GUARDED_BY(mu_) = 0;

  std::vector<Child> children_;  // supervisor thread only
  std::thread thread_;
};

}  // namespace dropless

#endif  // DROPLESS_WORKER_DAEMON_RANK_SUPERVISOR_H_
