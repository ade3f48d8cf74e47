#include "coordinator/util/failure_log_throttle.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

using ::testing::HasSubstr;

// A failure every 100 ms for a minute (a full disk under the ticker): the first line, one line
// per 30 s with how many failed since, and one line when it succeeds again.
TEST(FailureLogThrottleTest, ALastingFailureLogsItsStartEveryIntervalAndItsEnd) {
  FailureLogThrottle log("a job store commit", absl::Seconds(30));
  const absl::Time start = absl::FromUnixSeconds(1000);
  EXPECT_FALSE(log.Succeeded(start).has_value()) << "nothing failed";
  std::vector<std::string> lines;
  for (int i = 0; i < 600; ++i) {
    if (auto line = log.Failed("disk full", start + absl::Milliseconds(100 * i))) {
      lines.push_back(*line);
    }
  }
  ASSERT_EQ(lines.size(), 2u) << ::testing::PrintToString(lines);  // at 0 s and 30 s
  EXPECT_THAT(lines[0], HasSubstr("a job store commit failed: disk full"));
  EXPECT_THAT(lines[1], HasSubstr("failed 300 more times in the last 30s"));
  EXPECT_THAT(lines[1], HasSubstr("301 times since the first, 30s ago"));
  std::optional<std::string> recovered = log.Succeeded(start + absl::Seconds(61));
  ASSERT_TRUE(recovered.has_value());
  EXPECT_THAT(*recovered, HasSubstr("succeeds again, after 600 failures over 1m1s"));
  EXPECT_FALSE(log.Succeeded(start + absl::Seconds(62)).has_value()) << "said once";

  // A new failure afterwards is logged at once.
  std::optional<std::string> again = log.Failed("I/O error", start + absl::Seconds(63));
  ASSERT_TRUE(again.has_value());
  EXPECT_THAT(*again, HasSubstr("failed: I/O error"));
}

}  // namespace
}  // namespace dropless::coordinator
