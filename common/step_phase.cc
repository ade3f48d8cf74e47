#include "common/step_phase.h"

#include <atomic>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dropless {
namespace {

constexpr std::pair<StepPhase, absl::string_view> kNames[] = {
    {StepPhase::kForward, "forward"},     {StepPhase::kDispatch, "dispatch"},
    {StepPhase::kGemm, "gemm"},           {StepPhase::kCombine, "combine"},
    {StepPhase::kBackward, "backward"},   {StepPhase::kOptimizer, "optimizer"},
    {StepPhase::kCheckpoint, "checkpoint"},
};

std::atomic<StepPhaseListener> listener{nullptr};

}  // namespace

absl::string_view StepPhaseName(StepPhase phase) {
  for (const auto& [p, name] : kNames) {
    if (p == phase) return name;
  }
  return "unknown";
}

std::optional<StepPhase> ParseStepPhase(absl::string_view name) {
  for (const auto& [p, n] : kNames) {
    if (n == name) return p;
  }
  return std::nullopt;
}

void SetStepPhaseListener(StepPhaseListener l) { listener.store(l, std::memory_order_release); }

void EnterStepPhase(StepPhase phase) {
  StepPhaseListener l = listener.load(std::memory_order_acquire);
  if (l != nullptr) l(phase);
}

bool IsPhaseLine(absl::string_view line) { return absl::StartsWith(line, kPhaseLinePrefix); }

std::string FormatPhaseLine(const PhaseReport& report) {
  return absl::StrCat(kPhaseLinePrefix, "name=", StepPhaseName(report.phase),
                      " step=", report.step, " since_ms=", report.since_ms);
}

absl::StatusOr<PhaseReport> ParsePhaseLine(absl::string_view line) {
  if (!IsPhaseLine(line)) return absl::InvalidArgumentError("phase line: no 'phase ' prefix");
  line.remove_prefix(kPhaseLinePrefix.size());
  PhaseReport report;
  bool has_name = false, has_step = false, has_since = false;
  for (absl::string_view field : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
    if (kv.first == "name") {
      std::optional<StepPhase> phase = ParseStepPhase(kv.second);
      if (!phase.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat("phase line: name: unknown phase '",
                                                       kv.second.substr(0, 32), "'"));
      }
      report.phase = *phase;
      has_name = true;
    } else if (kv.first == "step") {
      if (!absl::SimpleAtoi(kv.second, &report.step) || report.step < 0) {
        return absl::InvalidArgumentError("phase line: step: not a non-negative integer");
      }
      has_step = true;
    } else if (kv.first == "since_ms") {
      if (!absl::SimpleAtoi(kv.second, &report.since_ms) || report.since_ms < 0) {
        return absl::InvalidArgumentError("phase line: since_ms: not a non-negative integer");
      }
      has_since = true;
    }  // unknown fields: a newer rank's additions
  }
  if (!has_name) return absl::InvalidArgumentError("phase line: name: missing");
  if (!has_step) return absl::InvalidArgumentError("phase line: step: missing");
  if (!has_since) return absl::InvalidArgumentError("phase line: since_ms: missing");
  return report;
}

}  // namespace dropless
