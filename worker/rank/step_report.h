// The step report: the line a rank process writes to its report pipe after every step (its
// StepStats, common/step_stats.h), and the line it writes once when it is ready to step. The rank
// formats, the worker daemon parses; the format is private to dropless-worker (the daemon turns
// reports into StepMetrics for the coordinator).
//
// Format: one line of space-separated key=value pairs, one per field of StepStats (the names of
// ForEachStepStatsField), every key present exactly once,
//   step=3 steps=40 loss=0.51 aux_loss=1.02 step_seconds=0.012 flops=1.2e9 tokens=256
//   dispatch_seconds=0.001 combine_seconds=0.001 gemm_seconds=0.006 gemm_forward_seconds=0.002
//   gemm_dgrad_seconds=0.002 gemm_wgrad_seconds=0.002 load_imbalance=1.1
//   expert_tokens=130,120,140,122 dispatch_bytes=524288 combine_bytes=524288
//   device_memory_bytes=0 peak_flops=1e11
// (one line; wrapped here). A list is comma-separated, empty for no entries (`expert_tokens=`).
// Doubles are written with 17 significant digits so they round-trip. Unknown keys are ignored so a
// newer rank can report more than an older daemon reads. The ready line is exactly "ready": the
// rank joined its groups and built its engine.
#ifndef DROPLESS_WORKER_RANK_STEP_REPORT_H_
#define DROPLESS_WORKER_RANK_STEP_REPORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/step_stats.h"

namespace dropless {

inline constexpr absl::string_view kReadyLine = "ready";

// One line without the trailing newline.
std::string FormatStepReport(const StepStats& stats);

// InvalidArgument naming the key on a missing, repeated or malformed field, or on values out of
// range (step < 1, step > steps, negative seconds/flops/tokens/bytes/memory, a list longer than
// kMaxStepStatsListSize).
absl::StatusOr<StepStats> ParseStepReport(absl::string_view line);

}  // namespace dropless

#endif  // DROPLESS_WORKER_RANK_STEP_REPORT_H_
