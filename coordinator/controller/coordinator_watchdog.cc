// Coordinator: the hang watchdog (hang_watchdog.h) applied to the ranks' progress in heartbeats.
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/utf8.h"
#include "coordinator/controller/coordinator.h"
#include "common/log.h"

namespace dropless::coordinator {

void Coordinator::CheckProgressLocked(WorkerEntry& worker, const v1::Heartbeat& heartbeat,
                                      StoreWrite& write) {
  for (const v1::RankStatus& status : heartbeat.ranks()) {
    if (status.phase().empty() || status.phase_since_ms() <= 0) continue;
    ActiveJob* job = jobs_.FindActiveAttempt(status.job_id(), status.attempt());
    if (job == nullptr) continue;
    bool placed_here = false;
    for (const RankRecord& r : job->attempt->ranks) {
      placed_here |= r.rank == status.rank() && r.worker_id == worker.info.id();
    }
    if (!placed_here) continue;
    // The worker's text goes into an event, the job's message and the log: no control characters
    // (a terminal escape, a newline forging a line), as for a RankStatus's message.
    job->progress[status.rank()] = RankProgress{
        status.attempt(), SanitizedText(status.phase(), 32),
        status.step(), status.phase_since_ms(), worker.info.node(), worker.info.id()};

    const std::optional<double> median = job->step_times.Median();
    const std::optional<int64_t> limit = StallLimitMs(options_.hang, median);
    if (!limit.has_value()) return;
    // Both times are the worker's clock: no skew between hosts enters.
    if (heartbeat.time_ms() - status.phase_since_ms() <= *limit) continue;

    // The ranks of a collective wait for the one that stopped: blame it (BlameKey), which is
    // often not the rank whose heartbeat noticed.
    int32_t stuck_rank = status.rank();
    const RankProgress* stuck = &job->progress[status.rank()];
    for (const auto& [rank, progress] : job->progress) {
      if (progress.attempt != status.attempt()) continue;
      if (BlameKey(progress.step, progress.phase, progress.since_ms) <
          BlameKey(stuck->step, stuck->phase, stuck->since_ms)) {
        stuck_rank = rank;
        stuck = &progress;
      }
    }
    const double stalled_s =
        static_cast<double>(heartbeat.time_ms() - stuck->since_ms) / 1000.0;
    const std::string reason =
        absl::StrFormat("rank %d on node %s stuck in %s (step %d) for %.1f s", stuck_rank,
                        stuck->node, stuck->phase, stuck->step, stalled_s);
    AddEvent(write, status.job_id(), status.attempt(), "RankStuck",
             absl::StrFormat("rank %d on node %s (%s) made no progress for %.1f s in phase %s of "
                             "step %d (limit %.1f s: %s); aborting attempt %d",
                             stuck_rank, stuck->node, stuck->worker_id, stalled_s, stuck->phase,
                             stuck->step, static_cast<double>(*limit) / 1000.0,
                             DescribeStallLimit(options_.hang, median), status.attempt()));
    job->progress.clear();
    jobs_.FailAttempt(*job, reason, write);
  }
}

}  // namespace dropless::coordinator
