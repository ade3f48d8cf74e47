// Phases of a training step, for the hang watchdog: the engine says where it is, the rank process
// reports it to its worker daemon (phase lines on the report pipe), the daemon puts the latest in
// its heartbeats, and the coordinator aborts an attempt whose rank stays in one phase far longer
// than a step takes (docs/architecture.md, "Hang watchdog").
//
// The hook is process-wide and costs one relaxed atomic load when nobody listens (tests,
// benchmarks): the engine calls EnterStepPhase at each boundary without knowing who listens.
#ifndef DROPLESS_COMMON_STEP_PHASE_H_
#define DROPLESS_COMMON_STEP_PHASE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dropless {

enum class StepPhase {
  kForward,
  kDispatch,    // tokens to their experts' ranks (all-to-all)
  kGemm,        // expert GEMMs
  kCombine,     // expert outputs back to their tokens' ranks (all-to-all)
  kBackward,
  kOptimizer,   // gradient reductions and the optimizer update
  kCheckpoint,
};

absl::string_view StepPhaseName(StepPhase phase);
std::optional<StepPhase> ParseStepPhase(absl::string_view name);

// Called on the engine's thread at every phase boundary; must be quick.
using StepPhaseListener = void (*)(StepPhase phase);
// nullptr: nobody listens.
void SetStepPhaseListener(StepPhaseListener listener);
void EnterStepPhase(StepPhase phase);

// A rank's report of its phase, one line on the report pipe:
//   phase name=gemm step=3 since_ms=1764650000123
struct PhaseReport {
  StepPhase phase = StepPhase::kForward;
  int64_t step = 0;
  int64_t since_ms = 0;  // Unix milliseconds when the rank entered the phase
};

inline constexpr absl::string_view kPhaseLinePrefix = "phase ";
bool IsPhaseLine(absl::string_view line);
std::string FormatPhaseLine(const PhaseReport& report);
// InvalidArgument naming the field that is missing or malformed.
absl::StatusOr<PhaseReport> ParsePhaseLine(absl::string_view line);

}  // namespace dropless

#endif  // DROPLESS_COMMON_STEP_PHASE_H_
