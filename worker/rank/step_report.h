// StepReport: the line a rank process writes to its report pipe after every step, and the line
// it writes once when it is ready to step. The rank formats, the worker daemon parses; the format
// is private to dropless-worker (the daemon turns reports into StepMetrics for the coordinator).
//
// Format: one line of space-separated key=value pairs, every key below present exactly once,
//   step=3 steps=40 loss=0.51 aux_loss=1.02 step_seconds=0.012 flops=1.2e9 tokens=256
//   dispatch_seconds=0.001 combine_seconds=0.001 gemm_seconds=0.006 gemm_forward_seconds=0.002
//   gemm_dgrad_seconds=0.002 gemm_wgrad_seconds=0.002 load_imbalance=1.1 device_memory_bytes=0
//   peak_flops=1e11
// (one line; wrapped here). Doubles are written with 17 significant digits so they round-trip.
// Unknown keys are ignored so a newer rank can report more than an older daemon reads.
// The ready line is exactly "ready": the rank joined its groups and built its engine.
#ifndef DROPLESS_WORKER_RANK_STEP_REPORT_H_
#define DROPLESS_WORKER_RANK_STEP_REPORT_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace dropless {

struct StepReport {
  int64_t step = 0;   // 1-based step just finished
  int64_t steps = 0;  // total steps of the job
  double loss = 0;
  double aux_loss = 0;
  double step_seconds = 0;
  double flops = 0;  // model FLOPs of the step on this rank
  int64_t tokens = 0;
  double dispatch_seconds = 0;
  double combine_seconds = 0;
  double gemm_seconds = 0;  // all expert GEMMs: the sum of the three phases below
  double gemm_forward_seconds = 0;
  double gemm_dgrad_seconds = 0;  // backward-data
  double gemm_wgrad_seconds = 0;  // backward-weight
  double load_imbalance = 1;
  int64_t device_memory_bytes = 0;
  double peak_flops = 0;  // peak FLOP/s of the rank's device (MFU denominator); 0 = unknown

  // Derived rates; 0 when step_seconds (or peak_flops) is 0.
  double FlopsPerSecond() const;
  double Mfu() const;
  double TokensPerSecond() const;
};

inline constexpr absl::string_view kReadyLine = "ready";

// One line without the trailing newline.
std::string FormatStepReport(const StepReport& report);

// InvalidArgument naming the key on a missing, repeated or malformed field, or on values out of
// range (step < 1, step > steps, negative seconds/flops/tokens/memory).
absl::StatusOr<StepReport> ParseStepReport(absl::string_view line);

}  // namespace dropless

#endif  // DROPLESS_WORKER_RANK_STEP_REPORT_H_
