// Coordinator: forgetting lost workers (--lost-worker-expiry). A worker away (LOST) for longer
// than the expiry leaves the registry and the store, so that a node that died for good, or that
// the cluster replaced under another name, is neither listed for ever nor counted as capacity a
// job could wait for (WorkerRegistry::KnownCapacity); the PENDING jobs that waited for larger
// GPUs only such workers had then fail. Run by the ticker, after the leases: a scan of the
// registry that finds nothing due costs no store access.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "coordinator/controller/coordinator.h"

namespace dropless::coordinator {

bool Coordinator::LostWorkerExpiryOn() const {
  return options_.lost_worker_expiry > absl::ZeroDuration() &&
         options_.lost_worker_expiry != absl::InfiniteDuration();
}

int64_t Coordinator::ForgetLostWorkers(int64_t now_ms) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return 0;
  return ForgetLostWorkersLocked(now_ms);
}

int64_t Coordinator::ForgetLostWorkersLocked(int64_t now_ms) {
  if (!LostWorkerExpiryOn()) return 0;
  const int64_t expiry_ms = absl::ToInt64Milliseconds(options_.lost_worker_expiry);
  const std::vector<WorkerEntry*> due = workers_.ForgettableWorkers(now_ms, expiry_ms);
  if (due.empty()) return 0;
  // A worker that a rank of an active attempt is placed on, ended or not, is still needed: a
  // Hello of it reconciles that attempt (or has its Assignment sent again), and a peer's failure
  // names it. Its attempt ends first (its lease expired: the attempt failed; or its peers end).
  std::set<std::string> placed;
  for (const auto& [id, job] : jobs_.jobs()) {
    if (!job.attempt.has_value() || IsTerminal(job.record.job.state())) continue;
    for (const RankRecord& rank : job.attempt->ranks) placed.insert(rank.worker_id);
  }
  std::vector<std::string> forget;
  for (const WorkerEntry* worker : due) {
    if (placed.count(worker->info.id()) == 0) forget.push_back(worker->info.id());
  }
  if (forget.empty()) return 0;
  StoreWrite write;
  for (const std::string& id : forget) workers_.Forget(id, now_ms, expiry_ms, write);
  // The capacity a job waiting for larger GPUs counted on may have gone with them.
  const int failed = jobs_.FailJobsWaitingForMissingDevices(write);
  if (failed > 0) {
    LogInfo(
        absl::StrFormat("%d pending job%s waiting for larger GPUs failed: no known worker "
                        "has them any more",
                        failed, failed == 1 ? "" : "s"));
  }
  // Without fsync for the deletions alone (one that a power loss undoes is done again by the
  // next pass); a failed job's state is stored with fsync whoever commits it (Commit). A failed
  // commit keeps the deletions and events for the next one.
  write.durable = false;
  (void)jobs_.Commit(write);
  if (metrics_ != nullptr) metrics_->CountWorkersForgotten(static_cast<int64_t>(forget.size()));
  jobs_.RetireFinished();
  return static_cast<int64_t>(forget.size());
}

}  // namespace dropless::coordinator
