// StepStats: what one rank measured of one training step. This is the step report's one
// definition: the engine fills it, the rank process writes it to its daemon (worker/rank/
// step_report.h, a line of its fields), the daemon turns it into Prometheus series
// (worker/daemon/worker_metrics.h) and into the API's v1.StepMetrics (worker/daemon/
// step_metrics_proto.h, field by field by name), which the coordinator stores and the CLI shows.
//
// Adding a field: declare it here and list it in ForEachStepStatsField; give it a v1.StepMetrics
// field of the same name and type (a new number, never a reused one) when it should reach the API.
// A field is an int64_t, a double, or a std::vector<int64_t> (repeated int64 on the wire) of at
// most kMaxStepStatsListSize entries.
#ifndef DROPLESS_COMMON_STEP_STATS_H_
#define DROPLESS_COMMON_STEP_STATS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dropless {

// Longest list a step report carries: the job spec's limit on model.experts.
inline constexpr size_t kMaxStepStatsListSize = 1024;

struct StepStats {
  int64_t step = 0;     // 1-based step just finished
  int64_t steps = 0;    // total steps of the job (set by the rank process)
  double loss = 0;      // task loss, averaged over every rank of the job
  double aux_loss = 0;  // load-balancing loss (before its coefficient)
  double step_seconds = 0;
  // Model FLOPs of this step on this rank (18*T*k*H*F per layer + router + shared).
  double flops = 0;
  int64_t tokens = 0;           // tokens processed by this rank this step
  double dispatch_seconds = 0;  // token dispatch all-to-all(s), fwd + bwd
  double combine_seconds = 0;   // token combine all-to-all(s), fwd + bwd
  // Expert GEMMs (grouped over the rank's experts, shared experts included) by phase: forward,
  // backward-data (dgrad) and backward-weight (wgrad); gemm_seconds is their sum.
  double gemm_seconds = 0;
  double gemm_forward_seconds = 0;
  double gemm_dgrad_seconds = 0;
  double gemm_wgrad_seconds = 0;
  double load_imbalance = 1;  // max/mean tokens per expert over the EP group
  // Tokens routed to each expert of the layer (index: global expert id; a token counts once per
  // expert it chose) in this step, summed over the EP group and the layers; empty when the engine
  // does not report it. At most kMaxStepStatsListSize entries.
  std::vector<int64_t> expert_tokens;
  // Bytes this rank sent in the step's token dispatch and combine all-to-alls (rows x row bytes,
  // rows staying on the rank included; forward + backward, as dispatch_seconds and
  // combine_seconds). 0 when the engine does not count them.
  int64_t dispatch_bytes = 0;
  int64_t combine_bytes = 0;
  int64_t device_memory_bytes = 0;
  // Peak FLOP/s of the rank's device (the MFU denominator); 0 = unknown. Set by the rank process.
  double peak_flops = 0;

  // Derived rates; 0 when step_seconds (or peak_flops) is 0.
  double FlopsPerSecond() const { return step_seconds > 0 ? flops / step_seconds : 0; }
  double Mfu() const { return peak_flops > 0 ? FlopsPerSecond() / peak_flops : 0; }
  double TokensPerSecond() const {
    return step_seconds > 0 ? static_cast<double>(tokens) / step_seconds : 0;
  }
};

// Calls visit(name, member) for every field of StepStats, in declaration order; member is an
// `int64_t StepStats::*`, a `double StepStats::*` or a `std::vector<int64_t> StepStats::*`.
// Serializers iterate this list rather than naming fields, so a field listed here reaches every one
// of them.
template <typename Visitor>
void ForEachStepStatsField(Visitor&& visit) {
  visit("step", &StepStats::step);
  visit("steps", &StepStats::steps);
  visit("loss", &StepStats::loss);
  visit("aux_loss", &StepStats::aux_loss);
  visit("step_seconds", &StepStats::step_seconds);
  visit("flops", &StepStats::flops);
  visit("tokens", &StepStats::tokens);
  visit("dispatch_seconds", &StepStats::dispatch_seconds);
  visit("combine_seconds", &StepStats::combine_seconds);
  visit("gemm_seconds", &StepStats::gemm_seconds);
  visit("gemm_forward_seconds", &StepStats::gemm_forward_seconds);
  visit("gemm_dgrad_seconds", &StepStats::gemm_dgrad_seconds);
  visit("gemm_wgrad_seconds", &StepStats::gemm_wgrad_seconds);
  visit("load_imbalance", &StepStats::load_imbalance);
  visit("expert_tokens", &StepStats::expert_tokens);
  visit("dispatch_bytes", &StepStats::dispatch_bytes);
  visit("combine_bytes", &StepStats::combine_bytes);
  visit("device_memory_bytes", &StepStats::device_memory_bytes);
  visit("peak_flops", &StepStats::peak_flops);
}

}  // namespace dropless

#endif  // DROPLESS_COMMON_STEP_STATS_H_
