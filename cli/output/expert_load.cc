#include "cli/output/expert_load.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace dropless::cli {
namespace {

constexpr int kBarWidth = 30;

struct LoadBucket {
  const char* label;
  double upper;  // load/mean below this (the last bucket: any)
};

// Idle experts apart, then around the balanced point 1 and out to the hot experts.
constexpr LoadBucket kBuckets[] = {{"0 (idle)", 0},     {"(0, 0.5)", 0.5},   {"[0.5, 0.9)", 0.9},
                                   {"[0.9, 1.1)", 1.1}, {"[1.1, 1.5)", 1.5}, {"[1.5, 2)", 2},
                                   {">= 2", 0}};

int BucketOf(double ratio) {
  if (ratio <= 0) return 0;
  const int last = static_cast<int>(std::size(kBuckets)) - 1;
  for (int b = 1; b < last; ++b) {
    if (ratio < kBuckets[b].upper) return b;
  }
  return last;
}

}  // namespace

std::optional<ExpertLoadSummary> SummarizeExpertLoad(const v1::StepMetrics& metrics) {
  if (metrics.expert_tokens().empty()) return std::nullopt;
  std::vector<int64_t> sorted(metrics.expert_tokens().begin(), metrics.expert_tokens().end());
  std::sort(sorted.begin(), sorted.end());
  ExpertLoadSummary s;
  s.experts = static_cast<int64_t>(sorted.size());
  s.min = sorted.front();
  s.median = sorted[(sorted.size() - 1) / 2];
  s.max = sorted.back();
  double total = 0;
  for (int64_t tokens : sorted) {
    total += static_cast<double>(tokens);
    if (tokens == 0) ++s.idle;
  }
  s.mean = total / static_cast<double>(s.experts);
  return s;
}

std::string ExpertLoadCell(const v1::StepMetrics& metrics) {
  const std::optional<ExpertLoadSummary> s = SummarizeExpertLoad(metrics);
  if (!s) return "-";
  return absl::StrCat(s->min, "/", s->median, "/", s->max);
}

std::string ExpertLoadSummaryLine(const ExpertLoadSummary& s) {
  return absl::StrFormat(
      "%d experts, tokens per expert min %d, median %d, max %d (max/mean %.2f, %d idle)", s.experts,
      s.min, s.median, s.max, s.mean > 0 ? static_cast<double>(s.max) / s.mean : 0.0, s.idle);
}

std::string ExpertLoadHistogram(const v1::StepMetrics& metrics, const ExpertLoadSummary& s) {
  if (s.mean <= 0) return "";
  std::string out;
  std::vector<int64_t> counts(std::size(kBuckets), 0);
  for (int64_t tokens : metrics.expert_tokens()) {
    ++counts[BucketOf(static_cast<double>(tokens) / s.mean)];
  }
  const int64_t most = *std::max_element(counts.begin(), counts.end());
  out += absl::StrFormat("  %-12s%s\n", "LOAD/MEAN", "EXPERTS");
  for (size_t b = 0; b < counts.size(); ++b) {
    const int bar = static_cast<int>((counts[b] * kBarWidth + most - 1) / most);
    std::string line =
        absl::StrFormat("  %-12s%-6d%s", kBuckets[b].label, counts[b], std::string(bar, '#'));
    absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(line), "\n");
  }
  return out;
}

}  // namespace dropless::cli
