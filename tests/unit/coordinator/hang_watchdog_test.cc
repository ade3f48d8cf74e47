#include "coordinator/controller/hang_watchdog.h"

#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

TEST(HangWatchdogTest, TheMedianOfTheRecentStepTimes) {
  StepTimes times;
  EXPECT_FALSE(times.Median().has_value());
  for (double s : {0.1, 5.0, 0.2, 0.3, 0.1}) times.Add(s);  // one slow outlier
  ASSERT_TRUE(times.Median().has_value());
  EXPECT_DOUBLE_EQ(*times.Median(), 0.2);
  times.Add(-1);  // nonsense is ignored
  EXPECT_DOUBLE_EQ(*times.Median(), 0.2);
  // Only the last kWindow count: a job that became slower gets a longer limit.
  for (size_t i = 0; i < StepTimes::kWindow; ++i) times.Add(2.0);
  EXPECT_DOUBLE_EQ(*times.Median(), 2.0);
}

TEST(HangWatchdogTest, TheLimitIsAMultipleOfTheMedianWithAFloor) {
  HangWatchdogOptions options;
  options.step_multiple = 10;
  options.min_stall_ms = 3000;
  options.first_step_ms = 60000;
  EXPECT_EQ(StallLimitMs(options, 0.05), 3000);        // 0.5 s is below the floor
  EXPECT_EQ(StallLimitMs(options, 2.0), 20000);        // 10 x 2 s
  EXPECT_EQ(StallLimitMs(options, std::nullopt), 60000);  // no step time yet
  options.first_step_ms = 1000;
  EXPECT_EQ(StallLimitMs(options, std::nullopt), 3000);   // never below the floor
  options.step_multiple = 0;
  EXPECT_FALSE(StallLimitMs(options, 2.0).has_value());  // off
  EXPECT_EQ(DescribeStallLimit(HangWatchdogOptions{10, 3000, 60000}, 0.05),
            "10 x median step 0.050 s, at least 3.0 s");
}

TEST(HangWatchdogTest, TheRankTheOthersWaitForIsBlamed) {
  // Behind by a step: blamed, whatever its phase.
  EXPECT_LT(BlameKey(4, "combine", 900), BlameKey(5, "gemm", 100));
  // Same step: the rank computing on its own before the ranks waiting in a collective for it,
  // even when it entered its phase a moment later.
  EXPECT_LT(BlameKey(5, "gemm", 101), BlameKey(5, "combine", 100));
  EXPECT_LT(BlameKey(5, "checkpoint", 101), BlameKey(5, "optimizer", 100));
  // Otherwise the first to stop.
  EXPECT_LT(BlameKey(5, "dispatch", 100), BlameKey(5, "dispatch", 101));
}

}  // namespace
}  // namespace dropless::coordinator
