#include "worker/daemon/worker_metrics.h"

#include <algorithm>
#include <exception>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dropless {
namespace {

// Steps: 1 ms .. 60 s, 1-2-5 per decade (CPU steps take seconds, GPU steps milliseconds).
const prometheus::Histogram::BucketBoundaries& StepBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60};
  return *buckets;
}

// Phases of a step (dispatch, combine, expert GEMMs): 10 us .. 60 s, 1-2-5 per decade; a
// 128-token dispatch on a GPU takes tens of microseconds, the same phase on CPU seconds.
const prometheus::Histogram::BucketBoundaries& PhaseBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
      0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60};
  return *buckets;
}

// An expert's tokens over the mean per expert: 0 (an idle expert) .. 10, finest around 1.
const prometheus::Histogram::BucketBoundaries& ExpertLoadBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0, 0.25, 0.5, 0.75, 0.9, 1, 1.1, 1.25, 1.5, 2, 3, 5, 10};
  return *buckets;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Create(
    const std::string& node, const std::string& bind_address, int port) {
  std::unique_ptr<WorkerMetrics> metrics(new WorkerMetrics(node));
  if (port != 0) {
    const bool v6 = bind_address.find(':') != std::string::npos;
    std::string listen = v6 ? absl::StrCat("[", bind_address, "]:", port)
                            : absl::StrCat(bind_address, ":", port);
    try {
      metrics->exposer_ = std::make_unique<prometheus::Exposer>(listen);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("metrics: cannot serve /metrics on ", listen, ": ", e.what()));
    }
    metrics->exposer_->RegisterCollectable(metrics->collectable_);
  }
  return metrics;
}

WorkerMetrics::WorkerMetrics(std::string node)
    : node_(std::move(node)),
      registry_(std::make_shared<prometheus::Registry>()),
      collectable_(std::make_shared<LockedCollectable>(registry_, &mu_)) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  prometheus::Registry& r = *registry_;
  step_duration_ = &BuildHistogram()
                        .Name("dropless_rank_step_duration_seconds")
                        .Help("Wall-clock duration of one training step of a rank")
                        .Register(r);
  dispatch_duration_ = &BuildHistogram()
                            .Name("dropless_rank_dispatch_duration_seconds")
                            .Help("Token dispatch all-to-all time of one step (forward + backward)")
                            .Register(r);
  combine_duration_ = &BuildHistogram()
                           .Name("dropless_rank_combine_duration_seconds")
                           .Help("Token combine all-to-all time of one step (forward + backward)")
                           .Register(r);
  gemm_duration_ = &BuildHistogram()
                        .Name("dropless_rank_expert_gemm_duration_seconds")
                        .Help("Expert grouped-GEMM time of one step by phase: forward, "
                              "backward-data (dgrad), backward-weight (wgrad)")
                        .Register(r);
  steps_ = &BuildCounter()
                .Name("dropless_rank_steps_total")
                .Help("Training steps finished by a rank")
                .Register(r);
  tokens_ = &BuildCounter()
                 .Name("dropless_rank_tokens_total")
                 .Help("Tokens a rank processed (its share of the global batch, every step)")
                 .Register(r);
  flops_ = &BuildCounter()
                .Name("dropless_rank_model_flops_total")
                .Help("Model FLOPs a rank computed (forward and backward, every step)")
                .Register(r);
  dispatch_bytes_ = &BuildCounter()
                         .Name("dropless_rank_dispatch_bytes_total")
                         .Help(
                             "Bytes a rank sent in its token dispatch all-to-alls (forward + "
                             "backward, every step)")
                         .Register(r);
  combine_bytes_ = &BuildCounter()
                        .Name("dropless_rank_combine_bytes_total")
                        .Help(
                            "Bytes a rank sent in its token combine all-to-alls (forward + "
                            "backward, every step)")
                        .Register(r);
  expert_load_ = &BuildHistogram()
                      .Name("dropless_rank_expert_load_ratio")
                      .Help(
                          "Tokens of an expert over the mean tokens per expert, observed once "
                          "per expert per step (1 = balanced, 0 = idle)")
                      .Register(r);
  flops_per_second_ = &BuildGauge()
                           .Name("dropless_rank_model_flops_per_second")
                           .Help("Model FLOP/s of the last step of a rank")
                           .Register(r);
  mfu_ = &BuildGauge()
              .Name("dropless_rank_mfu_ratio")
              .Help("Model FLOP/s of the last step over the device peak (0..1)")
              .Register(r);
  load_imbalance_ = &BuildGauge()
                         .Name("dropless_rank_expert_load_imbalance_ratio")
                         .Help("Max over mean tokens per expert in the last step (1 = balanced)")
                         .Register(r);
  loss_ = &BuildGauge().Name("dropless_rank_loss").Help("Task loss of the last step").Register(r);
  device_memory_ = &BuildGauge()
                        .Name("dropless_rank_device_memory_bytes")
                        .Help("Device memory in use by the rank")
                        .Register(r);

  const prometheus::Labels node_label{{"node", node_}};
  auto& slots = BuildGauge()
                    .Name("dropless_worker_slots")
                    .Help("Slots of this worker by state")
                    .Register(r);
  slots_busy_ = &slots.Add({{"node", node_}, {"state", "busy"}});
  slots_free_ = &slots.Add({{"node", node_}, {"state", "free"}});
  ranks_running_ = &BuildGauge()
                        .Name("dropless_worker_ranks_running")
                        .Help("Rank processes alive on this worker")
                        .Register(r)
                        .Add(node_label);
  auto& exits = BuildCounter()
                    .Name("dropless_worker_rank_exits_total")
                    .Help("Rank processes that ended, by result")
                    .Register(r);
  exits_succeeded_ = &exits.Add({{"node", node_}, {"result", "succeeded"}});
  exits_failed_ = &exits.Add({{"node", node_}, {"result", "failed"}});
  exits_killed_ = &exits.Add({{"node", node_}, {"result", "killed"}});
  reconnects_ = &BuildCounter()
                     .Name("dropless_worker_session_reconnects_total")
                     .Help("Sessions with the coordinator re-opened after the first")
                     .Register(r)
                     .Add(node_label);
  outbound_dropped_ =
      &BuildCounter()
           .Name("dropless_worker_outbound_dropped_total")
           .Help(
               "Messages and log lines the daemon dropped while its queue to the coordinator was "
               "full (oldest step metrics and log lines first; rank statuses never)")
           .Register(r)
           .Add(node_label);
  outbound_refused_ =
      &BuildCounter()
           .Name("dropless_worker_outbound_refused_total")
           .Help(
               "Messages the coordinator refused as malformed (InvalidArgument), dropped by the "
               "daemon rather than sent again")
           .Register(r)
           .Add(node_label);
  up_ = &BuildGauge()
             .Name("dropless_worker_up")
             .Help("1 while the worker daemon runs")
             .Register(r)
             .Add(node_label);
  up_->Set(1);
}

WorkerMetrics::~WorkerMetrics() {
  // Stop serving before the families go away.
  exposer_.reset();
}

prometheus::Labels WorkerMetrics::RankLabels(const RankIdentity& rank) const {
  // `job` is the label Prometheus gives every scraped target: ours is job_id.
  return {{"job_id", rank.job_id}, {"rank", absl::StrCat(rank.rank)},
          {"node", node_},         {"gpu", rank.gpu},
          {"UUID", rank.uuid},     {"Hostname", node_}};
}

WorkerMetrics::RankSeries& WorkerMetrics::SeriesFor(const RankIdentity& rank) {
  const std::string& job_id = rank.job_id;
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) {
    // Room for the new job: of the jobs no rank of which runs here now, only the most recently
    // reporting ones stay (a running job's series are never dropped: running jobs are bounded by
    // the node's slots).
    std::vector<std::string> finished;
    for (const std::string& id : job_order_) {
      if (!HasRunningRank(jobs_.at(id))) finished.push_back(id);
    }
    for (size_t i = 0; i + kRetainedJobs <= finished.size(); ++i) DropJob(finished[i]);
    job_order_.push_back(job_id);
    job = jobs_.emplace(job_id, std::map<int, RankSeries>{}).first;
  } else if (job_order_.back() != job_id) {
    job_order_.erase(std::find(job_order_.begin(), job_order_.end(), job_id));
    job_order_.push_back(job_id);
  }
  auto series = job->second.find(rank.rank);
  if (series != job->second.end()) {
    RankSeries& s = series->second;
    if (s.gpu == rank.gpu && s.uuid == rank.uuid) {
      if (s.mfu == nullptr) AddGauges(rank, s);
      return s;
    }
    RemoveSeries(s);  // now on another GPU: its series carry that GPU's labels
    job->second.erase(series);
  }

  const prometheus::Labels labels = RankLabels(rank);
  RankSeries s{};
  s.gpu = rank.gpu;
  s.uuid = rank.uuid;
  s.step_duration = &step_duration_->Add(labels, StepBuckets());
  s.dispatch_duration = &dispatch_duration_->Add(labels, PhaseBuckets());
  s.combine_duration = &combine_duration_->Add(labels, PhaseBuckets());
  auto gemm_phase = [&](const char* phase) {
    prometheus::Labels phase_labels = labels;
    phase_labels.emplace("phase", phase);
    return &gemm_duration_->Add(phase_labels, PhaseBuckets());
  };
  s.gemm_forward_duration = gemm_phase("forward");
  s.gemm_dgrad_duration = gemm_phase("dgrad");
  s.gemm_wgrad_duration = gemm_phase("wgrad");
  s.steps = &steps_->Add(labels);
  s.tokens = &tokens_->Add(labels);
  s.flops = &flops_->Add(labels);
  s.dispatch_bytes = &dispatch_bytes_->Add(labels);
  s.combine_bytes = &combine_bytes_->Add(labels);
  s.expert_load = &expert_load_->Add(labels, ExpertLoadBuckets());
  AddGauges(rank, s);
  return job->second.emplace(rank.rank, s).first->second;
}

void WorkerMetrics::AddGauges(const RankIdentity& rank, RankSeries& s) {
  const prometheus::Labels labels = RankLabels(rank);
  s.flops_per_second = &flops_per_second_->Add(labels);
  s.mfu = &mfu_->Add(labels);
  s.load_imbalance = &load_imbalance_->Add(labels);
  s.loss = &loss_->Add(labels);
  s.device_memory = &device_memory_->Add(labels);
}

void WorkerMetrics::RemoveGauges(RankSeries& s) {
  if (s.mfu == nullptr) return;
  flops_per_second_->Remove(s.flops_per_second);
  mfu_->Remove(s.mfu);
  load_imbalance_->Remove(s.load_imbalance);
  loss_->Remove(s.loss);
  device_memory_->Remove(s.device_memory);
  s.flops_per_second = s.mfu = s.load_imbalance = s.loss = s.device_memory = nullptr;
}

void WorkerMetrics::RemoveSeries(RankSeries& s) {
  step_duration_->Remove(s.step_duration);
  dispatch_duration_->Remove(s.dispatch_duration);
  combine_duration_->Remove(s.combine_duration);
  gemm_duration_->Remove(s.gemm_forward_duration);
  gemm_duration_->Remove(s.gemm_dgrad_duration);
  gemm_duration_->Remove(s.gemm_wgrad_duration);
  steps_->Remove(s.steps);
  tokens_->Remove(s.tokens);
  flops_->Remove(s.flops);
  dispatch_bytes_->Remove(s.dispatch_bytes);
  combine_bytes_->Remove(s.combine_bytes);
  expert_load_->Remove(s.expert_load);
  RemoveGauges(s);
}

bool WorkerMetrics::HasRunningRank(const std::map<int, RankSeries>& ranks) {
  for (const auto& [rank, s] : ranks) {
    if (s.mfu != nullptr) return true;  // gauges live from a step until the process ends
  }
  return false;
}

void WorkerMetrics::DropJob(const std::string& job_id) {
  auto job = jobs_.find(job_id);
  if (job != jobs_.end()) {
    for (auto& [rank, s] : job->second) RemoveSeries(s);
    jobs_.erase(job);
  }
  for (auto it = job_order_.begin(); it != job_order_.end(); ++it) {
    if (*it == job_id) {
      job_order_.erase(it);
      break;
    }
  }
}

void WorkerMetrics::RecordStep(const RankIdentity& rank, const StepStats& stats) {
  absl::MutexLock lock(&mu_);
  RankSeries& s = SeriesFor(rank);
  s.step_duration->Observe(stats.step_seconds);
  s.dispatch_duration->Observe(stats.dispatch_seconds);
  s.combine_duration->Observe(stats.combine_seconds);
  s.gemm_forward_duration->Observe(stats.gemm_forward_seconds);
  s.gemm_dgrad_duration->Observe(stats.gemm_dgrad_seconds);
  s.gemm_wgrad_duration->Observe(stats.gemm_wgrad_seconds);
  s.steps->Increment();
  s.tokens->Increment(static_cast<double>(stats.tokens));
  s.flops->Increment(stats.flops);
  s.dispatch_bytes->Increment(static_cast<double>(stats.dispatch_bytes));
  s.combine_bytes->Increment(static_cast<double>(stats.combine_bytes));
  int64_t routed = 0;
  for (int64_t tokens : stats.expert_tokens) routed += tokens;
  if (routed > 0) {
    const double mean =
        static_cast<double>(routed) / static_cast<double>(stats.expert_tokens.size());
    for (int64_t tokens : stats.expert_tokens) {
      s.expert_load->Observe(static_cast<double>(tokens) / mean);
    }
  }
  s.flops_per_second->Set(stats.FlopsPerSecond());
  s.mfu->Set(stats.Mfu());
  s.load_imbalance->Set(stats.load_imbalance);
  s.loss->Set(stats.loss);
  s.device_memory->Set(static_cast<double>(stats.device_memory_bytes));
}

void WorkerMetrics::SetSlots(int busy, int free) {
  slots_busy_->Set(busy);
  slots_free_->Set(free);
}

void WorkerMetrics::SetRanksRunning(int running) { ranks_running_->Set(running); }

void WorkerMetrics::RecordRankExit(const RankIdentity& rank, RankExitResult result) {
  {
    absl::MutexLock lock(&mu_);
    auto job = jobs_.find(rank.job_id);
    if (job != jobs_.end()) {
      auto series = job->second.find(rank.rank);
      // Only the series of this process's GPU: a later attempt's process of the rank may report
      // from another GPU already (its series then replaced these).
      if (series != job->second.end() && series->second.gpu == rank.gpu &&
          series->second.uuid == rank.uuid) {
        RemoveGauges(series->second);
      }
    }
  }
  switch (result) {
    case RankExitResult::kSucceeded:
      exits_succeeded_->Increment();
      break;
    case RankExitResult::kFailed:
      exits_failed_->Increment();
      break;
    case RankExitResult::kKilled:
      exits_killed_->Increment();
      break;
  }
}

void WorkerMetrics::RecordSessionReconnect() { reconnects_->Increment(); }

void WorkerMetrics::RecordOutboundDropped(int64_t count) {
  outbound_dropped_->Increment(static_cast<double>(count));
}

void WorkerMetrics::RecordOutboundRefused() { outbound_refused_->Increment(); }

std::string WorkerMetrics::Serialize() const { return collectable_->Serialize(); }

}  // namespace dropless
