#include "worker/rank/step_report.h"

#include <cmath>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace dropless {
namespace {

StepStats Sample() {
  StepStats r;
  r.step = 3;
  r.steps = 40;
  r.loss = 0.123456789012345678;
  r.aux_loss = 1.0000001;
  r.step_seconds = 0.0123;
  r.flops = 1.5e9;
  r.tokens = 256;
  r.dispatch_seconds = 1e-4;
  r.combine_seconds = 2e-4;
  r.gemm_seconds = 3.3e-3;
  r.gemm_forward_seconds = 1.1e-3;
  r.gemm_dgrad_seconds = 1.2e-3;
  r.gemm_wgrad_seconds = 1.0e-3;
  r.load_imbalance = 1.25;
  r.expert_tokens = {130, 0, 140, 122};
  r.dispatch_bytes = 524288;
  r.combine_bytes = 524289;
  r.device_memory_bytes = 123456789;
  r.peak_flops = 1e11;
  return r;
}

TEST(StepReportTest, RoundTripsExactly) {
  const StepStats r = Sample();
  const std::string line = FormatStepReport(r);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  absl::StatusOr<StepStats> back = ParseStepReport(line);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step, r.step);
  EXPECT_EQ(back->steps, r.steps);
  EXPECT_EQ(back->loss, r.loss);
  EXPECT_EQ(back->aux_loss, r.aux_loss);
  EXPECT_EQ(back->step_seconds, r.step_seconds);
  EXPECT_EQ(back->flops, r.flops);
  EXPECT_EQ(back->tokens, r.tokens);
  EXPECT_EQ(back->dispatch_seconds, r.dispatch_seconds);
  EXPECT_EQ(back->combine_seconds, r.combine_seconds);
  EXPECT_EQ(back->gemm_seconds, r.gemm_seconds);
  EXPECT_EQ(back->gemm_forward_seconds, r.gemm_forward_seconds);
  EXPECT_EQ(back->gemm_dgrad_seconds, r.gemm_dgrad_seconds);
  EXPECT_EQ(back->gemm_wgrad_seconds, r.gemm_wgrad_seconds);
  EXPECT_EQ(back->load_imbalance, r.load_imbalance);
  EXPECT_EQ(back->expert_tokens, r.expert_tokens);
  EXPECT_EQ(back->dispatch_bytes, r.dispatch_bytes);
  EXPECT_EQ(back->combine_bytes, r.combine_bytes);
  EXPECT_EQ(back->device_memory_bytes, r.device_memory_bytes);
  EXPECT_EQ(back->peak_flops, r.peak_flops);
}

TEST(StepReportTest, DerivedRates) {
  const StepStats r = Sample();
  EXPECT_DOUBLE_EQ(r.FlopsPerSecond(), 1.5e9 / 0.0123);
  EXPECT_DOUBLE_EQ(r.Mfu(), 1.5e9 / 0.0123 / 1e11);
  EXPECT_DOUBLE_EQ(r.TokensPerSecond(), 256 / 0.0123);
  StepStats zero;
  EXPECT_EQ(zero.FlopsPerSecond(), 0);
  EXPECT_EQ(zero.Mfu(), 0);
  EXPECT_EQ(zero.TokensPerSecond(), 0);
}

TEST(StepReportTest, KeyOrderDoesNotMatterAndUnknownKeysAreIgnored) {
  absl::StatusOr<StepStats> r = ParseStepReport(
      "peak_flops=0 steps=2 step=1 loss=-0.5 aux_loss=0 step_seconds=1 flops=0 tokens=0 "
      "dispatch_seconds=0 combine_seconds=0 gemm_wgrad_seconds=0.25 gemm_seconds=1 "
      "gemm_dgrad_seconds=0.5 gemm_forward_seconds=0.25 load_imbalance=1 combine_bytes=0 "
      "expert_tokens= dispatch_bytes=0 device_memory_bytes=0 future_field=7");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 1);
  EXPECT_EQ(r->steps, 2);
  EXPECT_EQ(r->loss, -0.5);
  EXPECT_EQ(r->gemm_seconds, 1);
  EXPECT_EQ(r->gemm_forward_seconds, 0.25);
  EXPECT_EQ(r->gemm_dgrad_seconds, 0.5);
  EXPECT_EQ(r->gemm_wgrad_seconds, 0.25);
  EXPECT_TRUE(r->expert_tokens.empty());
}

TEST(StepReportTest, NanLossIsKeptSoDivergenceShows) {
  StepStats r = Sample();
  r.loss = std::numeric_limits<double>::quiet_NaN();
  absl::StatusOr<StepStats> back = ParseStepReport(FormatStepReport(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(std::isnan(back->loss));
}

void ExpectRejected(const std::string& line, const std::string& key) {
  absl::StatusOr<StepStats> r = ParseStepReport(line);
  ASSERT_FALSE(r.ok()) << "accepted: " << line;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(key), std::string::npos)
      << "message '" << r.status().message() << "' does not name " << key;
}

std::string Replace(std::string line, const std::string& from, const std::string& to) {
  size_t at = line.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return line.replace(at, from.size(), to);
}

TEST(StepReportTest, MalformedLinesAreRejectedNamingTheKey) {
  const std::string good = FormatStepReport(Sample());
  ExpectRejected("", "step");
  ExpectRejected("ready", "ready");
  ExpectRejected("garbage line", "garbage");
  ExpectRejected(Replace(good, "tokens=256", ""), "tokens");
  ExpectRejected(Replace(good, "tokens=256", "tokens=2x6"), "tokens");
  ExpectRejected(Replace(good, "tokens=256", "tokens=25.6"), "tokens");
  ExpectRejected(Replace(good, "step=3 ", "step=abc "), "step");
  ExpectRejected(good + " loss=1", "loss");  // repeated
  ExpectRejected(Replace(good, "step=3 ", "step=0 "), "step");
  ExpectRejected(Replace(good, "steps=40", "steps=2"), "steps");
  ExpectRejected(Replace(good, "tokens=256", "tokens=-1"), "tokens");
  ExpectRejected(Replace(good, "step_seconds=", "step_seconds=-") , "step_seconds");
  ExpectRejected(Replace(good, "peak_flops=", "peak_flops=inf"), "peak_flops");
  ExpectRejected(Replace(good, "gemm_seconds=", "=1 gemm_seconds="), "=1");
}

// The rank and the daemon ship together: a line without the GEMM phases is refused, as is a
// negative or non-finite phase time.
TEST(StepReportTest, EveryGemmPhaseIsRequiredAndChecked) {
  const StepStats r = Sample();
  const std::string good = FormatStepReport(r);
  for (const std::string key : {"gemm_forward_seconds", "gemm_dgrad_seconds",
                                "gemm_wgrad_seconds"}) {
    SCOPED_TRACE(key);
    const size_t at = good.find(" " + key + "=");
    ASSERT_NE(at, std::string::npos);
    const size_t end = good.find(' ', at + 1);
    std::string without = good;
    without.erase(at, end - at);
    ExpectRejected(without, key);
    ExpectRejected(Replace(good, key + "=", key + "=-"), key);
    ExpectRejected(Replace(good, key + "=", key + "=nan"), key);
    ExpectRejected(good + " " + key + "=0", key);  // repeated
  }
}

// The per-expert counts: a comma-separated list of counts, empty when the engine reports none,
// at most kMaxStepStatsListSize long (the job spec's limit on experts).
TEST(StepReportTest, ExpertTokensAreABoundedListOfCounts) {
  StepStats r = Sample();
  const std::string good = FormatStepReport(r);
  EXPECT_NE(good.find(" expert_tokens=130,0,140,122 "), std::string::npos) << good;
  r.expert_tokens.clear();
  absl::StatusOr<StepStats> empty = ParseStepReport(FormatStepReport(r));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->expert_tokens.empty());

  r.expert_tokens.assign(kMaxStepStatsListSize, 7);
  absl::StatusOr<StepStats> full = ParseStepReport(FormatStepReport(r));
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->expert_tokens.size(), kMaxStepStatsListSize);
  r.expert_tokens.push_back(7);
  ExpectRejected(FormatStepReport(r), "expert_tokens");

  ExpectRejected(Replace(good, "expert_tokens=130,0,", "expert_tokens=130,-1,"), "expert_tokens");
  ExpectRejected(Replace(good, "expert_tokens=130,0,", "expert_tokens=130,,"), "expert_tokens");
  ExpectRejected(Replace(good, "expert_tokens=130,0,", "expert_tokens=130,0.5,"), "expert_tokens");
  ExpectRejected(Replace(good, "dispatch_bytes=524288", "dispatch_bytes=-1"), "dispatch_bytes");
}

}  // namespace
}  // namespace dropless
