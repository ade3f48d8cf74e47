#include "worker/daemon/daemon_stop.h"

#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "worker/daemon/rank_supervisor.h"

namespace dropless {
namespace {

// How often the waits look at what they wait for, and WatchForSecondSignal at Finish().
constexpr absl::Duration kPollInterval = absl::Milliseconds(20);
constexpr absl::Duration kSignalPollInterval = absl::Milliseconds(100);

}  // namespace

DaemonStop::DaemonStop(RankManager* ranks, std::string why, absl::Duration grace)
    : ranks_(ranks), why_(std::move(why)), grace_(grace) {}

void DaemonStop::Run(const SessionHooks& session) {
  // The coordinator hears why before the ranks' peers elsewhere lose them, so that their failure
  // ("connection closed by peer") is reported with this as the cause.
  session.say_goodbye(escalated() ? kEscalatedWait : kGoodbyeTimeout);
  ranks_->StopAll(why_);
  const auto stopped = [this] { return ranks_->WaitUntilStopped(absl::ZeroDuration()); };
  // SIGKILL goes out at the end of the grace period; the 2 s after it are for the exits to be
  // handed over (their final statuses queued).
  if (!WaitFor(stopped, grace_ + absl::Seconds(2))) {
    LogWarning("some ranks did not end in time");
    // Still there after their SIGKILL: stuck in uninterruptible sleep. They get what the rank
    // supervisor's destructor would give them, then nobody waits for them any more.
    if (!WaitFor(stopped, RankSupervisor::kShutdownReapTimeout)) {
      ranks_->KillAll(absl::ZeroDuration());
    }
  }
  (void)WaitFor(session.flushed, kFlushTimeout);  // the ranks' final statuses, when connected
}

void DaemonStop::Escalate(int signal) {
  {
    absl::MutexLock lock(&mu_);
    if (escalated_at_ != absl::InfiniteFuture()) return;
    escalated_at_ = absl::Now();
  }
  const char* name = strsignal(signal);
  LogWarning(absl::StrCat("got ", name != nullptr ? name : absl::StrCat("signal ", signal),
                          " again: stopping now: SIGKILL to the ranks without waiting for the "
                          "grace period, then what can be flushed within ",
                          absl::FormatDuration(kEscalatedWait), " and exit"));
  // StopAll first: the ranks end as stopped by the daemon (KILLED), even if the escalation came
  // before Run stopped them.
  ranks_->StopAll(why_);
  ranks_->KillAll(kEscalatedWait);
}

bool DaemonStop::escalated() const {
  absl::MutexLock lock(&mu_);
  return escalated_at_ != absl::InfiniteFuture();
}

void DaemonStop::WatchForSecondSignal(const sigset_t& signals) {
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  const timespec poll = absl::ToTimespec(kSignalPollInterval);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
    }
    siginfo_t info;
    const int sig = sigtimedwait(&signals, &info, &poll);
    if (sig <= 0) continue;  // timeout or EINTR
    // RunWorkerDaemon's session thread kill()s its own process with SIGTERM when the session
    // ends with an error; while stopping that is no second request to stop.
    if (info.si_code == SI_USER && info.si_pid == getpid()) continue;
    Escalate(sig);
  }
}

void DaemonStop::Finish() {
  absl::MutexLock lock(&mu_);
  finished_ = true;
}

bool DaemonStop::WaitFor(const std::function<bool()>& done, absl::Duration timeout) const {
  const absl::Time start = absl::Now();
  while (!done()) {
    absl::Time deadline = start + timeout;
    {
      absl::MutexLock lock(&mu_);
      if (escalated_at_ != absl::InfiniteFuture()) {
        deadline = std::min(deadline, std::max(start, escalated_at_) + kEscalatedWait);
      }
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    absl::SleepFor(std::min(kPollInterval, deadline - now));
  }
  return true;
}

}  // namespace dropless
