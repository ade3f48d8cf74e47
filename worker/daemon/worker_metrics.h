// WorkerMetrics: the worker daemon's Prometheus metrics, served on /metrics by prometheus-cpp.
// docs/metrics.md is the catalog (names, types, labels, buckets); this header only sketches it.
//
// Per rank (labels job_id, rank, node and DCGM's gpu, UUID, Hostname, so GPU power, clocks and
// memory from DCGM's exporter join with step time on UUID): counters of steps, tokens, model
// FLOPs and bytes dispatched and combined; histograms of step time (1 ms .. 60 s), of the
// dispatch, combine and expert GEMM phases (10 us .. 60 s; GEMM by phase=forward|dgrad|wgrad,
// every phase series exists from a rank's first report) and of expert load (each expert's tokens
// over the mean per expert, observed once per expert per step: expert ids never become labels);
// gauges of the last step's FLOP/s, MFU, expert load imbalance, loss and device memory.
// Per daemon (label node): dropless_worker_slots{state=busy|free}, dropless_worker_ranks_running,
// dropless_worker_rank_exits_total{result=succeeded|failed|killed},
// dropless_worker_session_reconnects_total, dropless_worker_outbound_dropped_total,
// dropless_worker_outbound_refused_total, dropless_worker_up.
//
// A scrape sees whole steps: RecordStep's updates and /metrics collection hold one lock, so the
// phase histograms of a rank always count the same steps.
//
// A rank's gauges (its last step's values) go when its process ends: they would read as current,
// and a later rank on the same GPU would give DCGM's UUID join two series. Its counters and
// histograms stay while any rank of its job runs here, then among the kRetainedJobs most
// recently reporting such finished jobs (the least recently reporting one's series are dropped
// first when a new job reports), so rate() sees a job's last steps.
// A rank that reports from another GPU than before (a retry placed elsewhere) gets new series
// with that GPU's labels.
#ifndef DROPLESS_WORKER_DAEMON_WORKER_METRICS_H_
#define DROPLESS_WORKER_DAEMON_WORKER_METRICS_H_

#include <deque>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "common/locked_collectable.h"
#include "common/step_stats.h"

namespace dropless {

enum class RankExitResult { kSucceeded, kFailed, kKilled };

// Which rank a step report is from, and the device it runs on.
struct RankIdentity {
  std::string job_id;
  int rank = 0;
  std::string gpu;   // CUDA device index on the node (DCGM's `gpu`); empty for a CPU slot
  std::string uuid;  // the GPU's UUID (DCGM's `UUID`); empty for a CPU slot or when unknown
};

class WorkerMetrics {
 public:
  static constexpr size_t kRetainedJobs = 16;

  // Serves /metrics on bind_address:port; port 0 keeps the metrics in memory only (Serialize()).
  // Unavailable when the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<WorkerMetrics>> Create(const std::string& node,
                                                               const std::string& bind_address,
                                                               int port);
  ~WorkerMetrics();

  void RecordStep(const RankIdentity& rank, const StepStats& stats);
  void SetSlots(int busy, int free);
  void SetRanksRunning(int running);
  // The rank's process ended (whether or not it ever reported a step): counted by result, and
  // the rank's gauges removed unless they are another GPU's (a later attempt's process).
  void RecordRankExit(const RankIdentity& rank, RankExitResult result);
  void RecordSessionReconnect();
  // Messages or log lines the outbound queue dropped or refused while full.
  void RecordOutboundDropped(int64_t count);
  // A message the coordinator refused as malformed, dropped rather than sent again.
  void RecordOutboundRefused();

  // Prometheus text exposition of everything above (what /metrics serves).
  std::string Serialize() const;

 private:
  struct RankSeries {
    std::string gpu, uuid;  // the labels the series were made with
    prometheus::Histogram* step_duration;
    prometheus::Histogram* dispatch_duration;
    prometheus::Histogram* combine_duration;
    prometheus::Histogram* gemm_forward_duration;
    prometheus::Histogram* gemm_dgrad_duration;
    prometheus::Histogram* gemm_wgrad_duration;
    prometheus::Counter* steps;
    prometheus::Counter* tokens;
    prometheus::Counter* flops;
    prometheus::Counter* dispatch_bytes;
    prometheus::Counter* combine_bytes;
    prometheus::Histogram* expert_load;
    // Null while the rank's process is not running (after its exit, until it reports again).
    prometheus::Gauge* flops_per_second;
    prometheus::Gauge* mfu;
    prometheus::Gauge* load_imbalance;
    prometheus::Gauge* loss;
    prometheus::Gauge* device_memory;
  };

  explicit WorkerMetrics(std::string node);
  // Whether a rank of the job runs here: it reported a step and its process has not ended.
  static bool HasRunningRank(const std::map<int, RankSeries>& ranks);
  prometheus::Labels RankLabels(const RankIdentity& rank) const;
  // The rank's series (made, or made again for a new GPU, with its gauges), its job now the most
  // recently reporting one.
  RankSeries& SeriesFor(const RankIdentity& rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddGauges(const RankIdentity& rank, RankSeries& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveGauges(RankSeries& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveSeries(RankSeries& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropJob(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string node_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<LockedCollectable> collectable_;  // registry_ under mu_: what /metrics serves
  std::unique_ptr<prometheus::Exposer> exposer_;  // after collectable_: stops serving first

  // Families are owned by registry_; pointers stay valid for its life.
  prometheus::Family<prometheus::Histogram>* step_duration_;
  prometheus::Family<prometheus::Histogram>* dispatch_duration_;
  prometheus::Family<prometheus::Histogram>* combine_duration_;
  prometheus::Family<prometheus::Histogram>* gemm_duration_;  // label phase
  prometheus::Family<prometheus::Counter>* steps_;
  prometheus::Family<prometheus::Counter>* tokens_;
  prometheus::Family<prometheus::Counter>* flops_;
  prometheus::Family<prometheus::Counter>* dispatch_bytes_;
  prometheus::Family<prometheus::Counter>* combine_bytes_;
  prometheus::Family<prometheus::Histogram>* expert_load_;
  prometheus::Family<prometheus::Gauge>* flops_per_second_;
  prometheus::Family<prometheus::Gauge>* mfu_;
  prometheus::Family<prometheus::Gauge>* load_imbalance_;
  prometheus::Family<prometheus::Gauge>* loss_;
  prometheus::Family<prometheus::Gauge>* device_memory_;

  prometheus::Gauge* slots_busy_;
  prometheus::Gauge* slots_free_;
  prometheus::Gauge* ranks_running_;
  prometheus::Counter* exits_succeeded_;
  prometheus::Counter* exits_failed_;
  prometheus::Counter* exits_killed_;
  prometheus::Counter* reconnects_;
  prometheus::Counter* outbound_dropped_;
  prometheus::Counter* outbound_refused_;
  prometheus::Gauge* up_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::map<int, RankSeries>> jobs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> job_order_ ABSL_GUARDED_BY(mu_);  // least recently reporting first
};

}  // namespace dropless

#endif  // DROPLESS_WORKER_DAEMON_WORKER_METRICS_H_
