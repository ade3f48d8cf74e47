// Coordinator: retention of finished jobs. A thread of its own (never an RPC thread) deletes the
// jobs that ended longer than --job-retention ago, then the cluster-wide events as old, at start
// and then every JobRetentionSweepPeriod, one bounded batch per hold of the coordinator's lock.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "coordinator/controller/coordinator.h"
#include "coordinator/util/clock.h"

namespace dropless::coordinator {
namespace {

// The pause between two batches of one sweep: the calls that waited for the lock go first.
constexpr absl::Duration kPauseBetweenBatches = absl::Milliseconds(5);

}  // namespace

absl::Duration JobRetentionSweepPeriod(absl::Duration retention) {
  return std::max(absl::Minutes(1), std::min(absl::Minutes(10), retention / 10));
}

bool Coordinator::RetentionOn() const {
  return options_.job_retention > absl::ZeroDuration() &&
         options_.job_retention != absl::InfiniteDuration();
}

absl::StatusOr<int64_t> Coordinator::ExpireFinishedJobs(int64_t now_ms) {
  if (!RetentionOn()) return 0;
  const int64_t ended_before_ms = now_ms - absl::ToInt64Milliseconds(options_.job_retention);
  int64_t expired = 0;
  int64_t cluster_events = 0;
  bool jobs_done = false;
  int batches = 0;
  absl::Status status;
  // The finished jobs first, then the cluster-wide events (those of no job) as old.
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) break;
      // Only jobs that are in the store alone are deleted: the finished ones leave memory (their
      // watchers and log followers end), and the unfinished ones, the only ones left, are never
      // candidates. While memory holds changes the store has not taken, the store's idea of which
      // jobs are finished may be stale (and kept-aside rows may name a job): nothing is deleted.
      jobs_.RetireFinished();
      if (jobs_.HasUnstoredChanges()) {
        status = absl::UnavailableError(
            "the job store has not taken every change yet (commits are failing); retried with "
            "the next sweep");
        break;
      }
      if (!jobs_done) {
        absl::StatusOr<std::vector<std::string>> deleted =
            store_->DeleteJobsEndedBefore(ended_before_ms);
        if (!deleted.ok()) {
          status = deleted.status();
          break;
        }
        jobs_done = deleted->empty();
        if (!jobs_done) {
          expired += static_cast<int64_t>(deleted->size());
          ++batches;
          if (metrics_ != nullptr) {
            metrics_->CountJobsExpired(static_cast<int64_t>(deleted->size()));
          }
        }
      }
      if (jobs_done) {
        // No event of these names a job: nothing in memory refers to them.
        absl::StatusOr<int64_t> deleted = store_->DeleteClusterEventsBefore(ended_before_ms);
        if (!deleted.ok()) {
          status = deleted.status();
          break;
        }
        if (*deleted == 0) break;
        cluster_events += *deleted;
        ++batches;
      }
    }
    if (stop_.WaitForNotificationWithTimeout(kPauseBetweenBatches)) break;
  }
  if (expired > 0 || cluster_events > 0) {
    LogInfo(absl::StrFormat(
        "job retention: deleted %d finished job%s and %d cluster-wide event%s from before %s "
        "(--job-retention %s), in %d batch%s",
        expired, expired == 1 ? "" : "s", cluster_events, cluster_events == 1 ? "" : "s",
        absl::FormatTime(absl::FromUnixMillis(ended_before_ms), absl::UTCTimeZone()),
        absl::FormatDuration(options_.job_retention), batches, batches == 1 ? "" : "es"));
  }
  if (!status.ok()) return status;
  return expired;
}

void Coordinator::RetentionLoop() {
  const absl::Duration period = JobRetentionSweepPeriod(options_.job_retention);
  LogInfo(absl::StrCat(
      "job retention: finished jobs are deleted ", absl::FormatDuration(options_.job_retention),
      " after they end (checked at start and every ", absl::FormatDuration(period), ")"));
  do {
    absl::StatusOr<int64_t> expired = ExpireFinishedJobs(NowMs());
    if (!expired.ok()) {
      LogWarning(absl::StrCat("job retention: sweep stopped: ", expired.status().ToString()));
    }
  } while (!stop_.WaitForNotificationWithTimeout(period));
}

}  // namespace dropless::coordinator
