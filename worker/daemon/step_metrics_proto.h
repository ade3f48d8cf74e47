// The API's form of a step report: v1.StepMetrics from a rank's StepStats (common/step_stats.h).
// Every StepStats field goes to the v1.StepMetrics field of the same name; the fields the wire does
// not carry as such (kStepStatsOffTheWire) reach it as the derived rates tflops, mfu and
// tokens_per_second. Who and when (job_id, attempt, rank, time_ms, node) are the caller's.
#ifndef DROPLESS_WORKER_DAEMON_STEP_METRICS_PROTO_H_
#define DROPLESS_WORKER_DAEMON_STEP_METRICS_PROTO_H_

#include "absl/strings/string_view.h"
#include "common/step_stats.h"
#include "dropless/v1/types.pb.h"

namespace dropless {

// StepStats fields with no v1.StepMetrics field of their name.
inline constexpr absl::string_view kStepStatsOffTheWire[] = {"flops", "tokens", "peak_flops"};

// Sets the measured fields and the derived rates of *out; leaves its identity fields alone.
void StepStatsToProto(const StepStats& stats, v1::StepMetrics* out);

}  // namespace dropless

#endif  // DROPLESS_WORKER_DAEMON_STEP_METRICS_PROTO_H_
