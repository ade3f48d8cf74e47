// CoordinatorMetrics: the coordinator's Prometheus families, registered in one registry that the
// /metrics Exposer serves. Base units, `_total` counters, histograms for latencies; the only
// labels are bounded enums (job/worker/slot state, RPC method and status code).
//
//   dropless_coordinator_jobs{state}                        gauge
//   dropless_coordinator_workers{state}                     gauge
//   dropless_coordinator_slots{state="busy|free"}           gauge (slots of READY workers)
//   dropless_coordinator_scheduling_latency_seconds         histogram: submit or requeue -> placed
//   dropless_coordinator_job_pending_seconds                histogram: time spent PENDING, observed
//                                                           when a job leaves PENDING (placed or
//                                                           cancelled)
//   dropless_coordinator_lease_expiries_total               counter
//   dropless_coordinator_store_commits_total{sync="full|normal"} counter: job-state transactions
//   dropless_coordinator_store_commit_failures_total        counter: those that failed
//   dropless_coordinator_jobs_finished_total{state}         counter
//   dropless_coordinator_jobs_expired_total                 counter: finished jobs deleted by
//                                                           retention (--job-retention)
//   dropless_coordinator_workers_forgotten_total            counter: workers forgotten, LOST for
//                                                           longer than --lost-worker-expiry
//   dropless_coordinator_rpcs_total{method,code}            counter
//   dropless_coordinator_rpc_duration_seconds{method}       histogram
//
// Thread-safe (prometheus-cpp metrics are). The state gauges of one Set*Counts / SetSlots call
// change together: collectable() (what /metrics serves) collects under the same lock, so a scrape
// never sees a job in two states or in none.
#ifndef DROPLESS_COORDINATOR_METRICS_COORDINATOR_METRICS_H_
#define DROPLESS_COORDINATOR_METRICS_COORDINATOR_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/locked_collectable.h"
#include "dropless/v1/types.pb.h"

namespace dropless::coordinator {

class CoordinatorMetrics {
 public:
  CoordinatorMetrics();

  // The registry collected under the lock of the multi-series updates: register this with the
  // Exposer.
  std::shared_ptr<LockedCollectable> collectable() const { return collectable_; }

  void SetJobCounts(const std::map<v1::JobState, int64_t>& counts);
  void SetWorkerCounts(int64_t ready, int64_t lost);
  void SetSlots(int64_t busy, int64_t free);
  void ObserveSchedulingLatency(double seconds);
  void ObservePending(double seconds);
  void CountLeaseExpiry();
  // A transaction of job state committed to the store; fsync: with synchronous=FULL.
  void CountStoreCommit(bool fsync);
  // A transaction of job state that the store refused (e.g. a full disk); it is retried.
  void CountStoreCommitFailure();
  void CountJobFinished(v1::JobState state);
  // Finished jobs deleted from the store because they ended longer than --job-retention ago.
  void CountJobsExpired(int64_t jobs);
  // Workers forgotten because they were LOST for longer than --lost-worker-expiry.
  void CountWorkersForgotten(int64_t workers);
  // method: "Service/Method" (bounded: the coordinator's own methods, else "other");
  // code: the gRPC status code's name, e.g. "OK", "NOT_FOUND".
  void RecordRpc(const std::string& method, absl::string_view code, double seconds);

 private:
  static bool IsTerminalForMetrics(v1::JobState state);

  std::shared_ptr<prometheus::Registry> registry_;
  mutable absl::Mutex mu_;  // held by the multi-series updates and by collection
  std::shared_ptr<LockedCollectable> collectable_;
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Gauge>& workers_;
  prometheus::Family<prometheus::Gauge>& slots_;
  prometheus::Histogram& scheduling_latency_;
  prometheus::Histogram& pending_;
  prometheus::Counter& lease_expiries_;
  prometheus::Family<prometheus::Counter>& store_commits_;
  prometheus::Counter& store_commit_failures_;
  prometheus::Family<prometheus::Counter>& jobs_finished_;
  prometheus::Counter& jobs_expired_;
  prometheus::Counter& workers_forgotten_;
  prometheus::Family<prometheus::Counter>& rpcs_;
  prometheus::Family<prometheus::Histogram>& rpc_duration_;
};

// Short name of a job state for labels: PENDING, RUNNING, ...
std::string JobStateName(v1::JobState state);

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_METRICS_COORDINATOR_METRICS_H_
