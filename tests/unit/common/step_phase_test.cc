#include "common/step_phase.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless {
namespace {

using ::testing::HasSubstr;

TEST(StepPhaseTest, EveryPhaseRoundTripsThroughItsLine) {
  for (StepPhase phase : {StepPhase::kForward, StepPhase::kDispatch, StepPhase::kGemm,
                          StepPhase::kCombine, StepPhase::kBackward, StepPhase::kOptimizer,
                          StepPhase::kCheckpoint}) {
    const std::string line = FormatPhaseLine(PhaseReport{phase, 7, 1764650000123});
    EXPECT_TRUE(IsPhaseLine(line));
    absl::StatusOr<PhaseReport> parsed = ParsePhaseLine(line);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->phase, phase);
    EXPECT_EQ(parsed->step, 7);
    EXPECT_EQ(parsed->since_ms, 1764650000123);
  }
  EXPECT_EQ(FormatPhaseLine(PhaseReport{StepPhase::kGemm, 3, 42}),
            "phase name=gemm step=3 since_ms=42");
}

TEST(StepPhaseTest, MalformedLinesNameTheField) {
  EXPECT_FALSE(IsPhaseLine("step=3 loss=1"));
  EXPECT_THAT(ParsePhaseLine("phase name=nap step=1 since_ms=2").status().message(),
              HasSubstr("name"));
  EXPECT_THAT(ParsePhaseLine("phase name=gemm step=-1 since_ms=2").status().message(),
              HasSubstr("step"));
  EXPECT_THAT(ParsePhaseLine("phase name=gemm step=1").status().message(),
              HasSubstr("since_ms"));
  EXPECT_THAT(ParsePhaseLine("phase step=1 since_ms=2").status().message(), HasSubstr("name"));
  // Fields a newer rank adds are ignored.
  EXPECT_TRUE(ParsePhaseLine("phase name=gemm step=1 since_ms=2 layer=3").ok());
}

std::vector<StepPhase>* seen = nullptr;
void Record(StepPhase phase) { seen->push_back(phase); }

TEST(StepPhaseTest, TheListenerHearsEveryPhaseUntilRemoved) {
  std::vector<StepPhase> phases;
  seen = &phases;
  EnterStepPhase(StepPhase::kForward);  // nobody listens: nothing happens
  SetStepPhaseListener(&Record);
  EnterStepPhase(StepPhase::kDispatch);
  EnterStepPhase(StepPhase::kGemm);
  SetStepPhaseListener(nullptr);
  EnterStepPhase(StepPhase::kCombine);
  EXPECT_EQ(phases, (std::vector<StepPhase>{StepPhase::kDispatch, StepPhase::kGemm}));
}

}  // namespace
}  // namespace dropless
