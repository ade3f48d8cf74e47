#include "coordinator/metrics/coordinator_metrics.h"

#include <vector>

namespace dropless::coordinator {
namespace {

// Control-plane latencies: from a millisecond to several minutes.
const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> buckets = {0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1,
                                              5,     10,    30,   60,   300, 1800};
  return buckets;
}

const std::vector<double>& RpcBuckets() {
  static const std::vector<double> buckets = {0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05,
                                              0.1,    0.5,    1,     5,     30,   300};
  return buckets;
}

}  // namespace

std::string JobStateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_PENDING:
      return "PENDING";
    case v1::JOB_STATE_SCHEDULED:
      return "SCHEDULED";
    case v1::JOB_STATE_RUNNING:
      return "RUNNING";
    case v1::JOB_STATE_SUCCEEDED:
      return "SUCCEEDED";
    case v1::JOB_STATE_FAILED:
      return "FAILED";
    case v1::JOB_STATE_CANCELLED:
      return "CANCELLED";
    default:
      return "UNSPECIFIED";
  }
}

CoordinatorMetrics::CoordinatorMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      collectable_(std::make_shared<LockedCollectable>(registry_, &mu_)),
      jobs_(prometheus::BuildGauge()
                .Name("dropless_coordinator_jobs")
                .Help("Jobs known to the coordinator, by state")
                .Register(*registry_)),
      workers_(prometheus::BuildGauge()
                   .Name("dropless_coordinator_workers")
                   .Help("Registered workers, by state")
                   .Register(*registry_)),
      slots_(prometheus::BuildGauge()
                 .Name("dropless_coordinator_slots")
                 .Help("Slots (GPUs or CPU slots) of READY workers, busy or free")
                 .Register(*registry_)),
      scheduling_latency_(prometheus::BuildHistogram()
                              .Name("dropless_coordinator_scheduling_latency_seconds")
                              .Help("Time from submit or requeue until the job attempt is placed")
                              .Register(*registry_)
                              .Add({}, LatencyBuckets())),
      pending_(prometheus::BuildHistogram()
                   .Name("dropless_coordinator_job_pending_seconds")
                   .Help("Time a job spent PENDING, observed when it leaves PENDING")
                   .Register(*registry_)
                   .Add({}, LatencyBuckets())),
      lease_expiries_(prometheus::BuildCounter()
                          .Name("dropless_coordinator_lease_expiries_total")
                          .Help("Workers whose lease expired (no message within the lease timeout)")
                          .Register(*registry_)
                          .Add({})),
      store_commits_(prometheus::BuildCounter()
                         .Name("dropless_coordinator_store_commits_total")
                         .Help("Transactions of job state (jobs, attempts, workers, events) "
                               "committed to the job store, by sync: full (fsync) or normal")
                         .Register(*registry_)),
      store_commit_failures_(
          prometheus::BuildCounter()
              .Name("dropless_coordinator_store_commit_failures_total")
              .Help("Transactions of job state the job store failed to commit (e.g. a full "
                    "disk); what they held is retried with the next commit")
              .Register(*registry_)
              .Add({})),
      jobs_finished_(prometheus::BuildCounter()
                         .Name("dropless_coordinator_jobs_finished_total")
                         .Help("Jobs that reached a terminal state, by state")
                         .Register(*registry_)),
      jobs_expired_(prometheus::BuildCounter()
                        .Name("dropless_coordinator_jobs_expired_total")
                        .Help("Finished jobs deleted from the job store, with their attempts, "
                              "events, logs and step metrics, because they ended longer than "
                              "--job-retention ago")
                        .Register(*registry_)
                        .Add({})),
      workers_forgotten_(prometheus::BuildCounter()
                             .Name("dropless_coordinator_workers_forgotten_total")
                             .Help("Workers removed from the registry and the job store because "
                                   "they were LOST for longer than --lost-worker-expiry")
                             .Register(*registry_)
                             .Add({})),
      rpcs_(prometheus::BuildCounter()
                .Name("dropless_coordinator_rpcs_total")
                .Help("gRPC calls handled, by method and status code")
                .Register(*registry_)),
      rpc_duration_(prometheus::BuildHistogram()
                        .Name("dropless_coordinator_rpc_duration_seconds")
                        .Help("gRPC call duration (streams: until the stream ends), by method")
                        .Register(*registry_)) {
  // Every label value exists from the start, so dashboards see zeros rather than gaps.
  for (v1::JobState state : {v1::JOB_STATE_PENDING, v1::JOB_STATE_SCHEDULED,
                             v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED,
                             v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    jobs_.Add({{"state", JobStateName(state)}});
    if (IsTerminalForMetrics(state)) jobs_finished_.Add({{"state", JobStateName(state)}});
  }
  workers_.Add({{"state", "READY"}});
  workers_.Add({{"state", "LOST"}});
  store_commits_.Add({{"sync", "full"}});
  store_commits_.Add({{"sync", "normal"}});
  slots_.Add({{"state", "busy"}});
  slots_.Add({{"state", "free"}});
}

bool CoordinatorMetrics::IsTerminalForMetrics(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

void CoordinatorMetrics::SetJobCounts(const std::map<v1::JobState, int64_t>& counts) {
  absl::MutexLock lock(&mu_);
  for (v1::JobState state : {v1::JOB_STATE_PENDING, v1::JOB_STATE_SCHEDULED,
                             v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED,
                             v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    auto it = counts.find(state);
    jobs_.Add({{"state", JobStateName(state)}})
        .Set(it == counts.end() ? 0.0 : static_cast<double>(it->second));
  }
}

void CoordinatorMetrics::SetWorkerCounts(int64_t ready, int64_t lost) {
  absl::MutexLock lock(&mu_);
  workers_.Add({{"state", "READY"}}).Set(static_cast<double>(ready));
  workers_.Add({{"state", "LOST"}}).Set(static_cast<double>(lost));
}

void CoordinatorMetrics::SetSlots(int64_t busy, int64_t free) {
  absl::MutexLock lock(&mu_);
  slots_.Add({{"state", "busy"}}).Set(static_cast<double>(busy));
  slots_.Add({{"state", "free"}}).Set(static_cast<double>(free));
}

void CoordinatorMetrics::ObserveSchedulingLatency(double seconds) {
  scheduling_latency_.Observe(seconds);
}

void CoordinatorMetrics::ObservePending(double seconds) { pending_.Observe(seconds); }

void CoordinatorMetrics::CountLeaseExpiry() { lease_expiries_.Increment(); }

void CoordinatorMetrics::CountStoreCommit(bool fsync) {
  store_commits_.Add({{"sync", fsync ? "full" : "normal"}}).Increment();
}

void CoordinatorMetrics::CountStoreCommitFailure() { store_commit_failures_.Increment(); }

void CoordinatorMetrics::CountJobFinished(v1::JobState state) {
  jobs_finished_.Add({{"state", JobStateName(state)}}).Increment();
}

void CoordinatorMetrics::CountJobsExpired(int64_t jobs) {
  jobs_expired_.Increment(static_cast<double>(jobs));
}

void CoordinatorMetrics::CountWorkersForgotten(int64_t workers) {
  workers_forgotten_.Increment(static_cast<double>(workers));
}

void CoordinatorMetrics::RecordRpc(const std::string& method, absl::string_view code,
                                   double seconds) {
  rpcs_.Add({{"method", method}, {"code", std::string(code)}}).Increment();
  rpc_duration_.Add({{"method", method}}, RpcBuckets()).Observe(seconds);
}

}  // namespace dropless::coordinator
