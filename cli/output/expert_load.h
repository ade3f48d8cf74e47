// ExpertLoad: what `top` and `describe` show of a step's per-expert token counts
// (v1.StepMetrics.expert_tokens): min / median / max tokens per expert, and a small text
// histogram of each expert's load over the mean (the buckets of the worker's
// dropless_rank_expert_load_ratio, coarser).
#ifndef DROPLESS_CLI_OUTPUT_EXPERT_LOAD_H_
#define DROPLESS_CLI_OUTPUT_EXPERT_LOAD_H_

#include <cstdint>
#include <optional>
#include <string>

#include "dropless/v1/types.pb.h"

namespace dropless::cli {

struct ExpertLoadSummary {
  int64_t experts = 0;
  int64_t min = 0;
  int64_t median = 0;  // the lower middle value for an even count
  int64_t max = 0;
  double mean = 0;
  int64_t idle = 0;  // experts that got no token
};

// nullopt when the step carries no counts (an engine that does not report them).
std::optional<ExpertLoadSummary> SummarizeExpertLoad(const v1::StepMetrics& metrics);

// "12/30/71" (min/median/max tokens per expert), "-" when the step carries no counts.
std::string ExpertLoadCell(const v1::StepMetrics& metrics);

// "8 experts, tokens per expert min 12, median 30, max 71 (max/mean 1.85, 0 idle)".
std::string ExpertLoadSummaryLine(const ExpertLoadSummary& summary);

// A header and one line per bucket of load/mean: the bucket, its number of experts and a bar,
//   "  [0.9, 1.1)  5     ##############################"
// every line indented by two spaces and ending in a newline; empty when no expert got a token.
std::string ExpertLoadHistogram(const v1::StepMetrics& metrics, const ExpertLoadSummary& summary);

}  // namespace dropless::cli

#endif  // DROPLESS_CLI_OUTPUT_EXPERT_LOAD_H_
