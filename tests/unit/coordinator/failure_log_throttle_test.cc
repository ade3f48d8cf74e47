#include "coordinator/util/failure_log_throttle.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

using ::testing::HasSubstr;

// A failure every 100 ms for a minute (a full disk under the ticker): the first line, one line
// per 30 s with how many failed since, and one line once success has lasted 5 s.
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
  EXPECT_FALSE(log.Succeeded(start + absl::Seconds(61)).has_value()) << "said before it lasts";
  std::optional<std::string> recovered = log.Recovered(start + absl::Seconds(66));
  ASSERT_TRUE(recovered.has_value());
  EXPECT_THAT(*recovered, HasSubstr("succeeds again (for 5s), after 600 failures over 1m1s"));
  EXPECT_FALSE(log.Succeeded(start + absl::Seconds(67)).has_value()) << "said once";

  // A new failure afterwards is logged at once.
  std::optional<std::string> again = log.Failed("I/O error", start + absl::Seconds(68));
  ASSERT_TRUE(again.has_value());
  EXPECT_THAT(*again, HasSubstr("failed: I/O error"));
}

// A store that takes a commit now and then between failures (a disk nearly full) is still
// failing: no line says it recovered, and its failures go on in the same run (no new "first"
// line each time). Before: a recovery line and a first-failure line for every success.
TEST(FailureLogThrottleTest, ASuccessBetweenFailuresIsNoRecovery) {
  FailureLogThrottle log("a job store commit", absl::Seconds(30), absl::Seconds(5));
  const absl::Time start = absl::FromUnixSeconds(1000);
  std::vector<std::string> lines;
  for (int i = 0; i < 100; ++i) {
    const absl::Time now = start + absl::Milliseconds(100 * i);
    std::optional<std::string> line =
        i % 10 == 5 ? log.Succeeded(now) : log.Failed("disk full", now);
    if (line.has_value()) lines.push_back(*line);
  }
  ASSERT_EQ(lines.size(), 1u) << ::testing::PrintToString(lines);
  EXPECT_THAT(lines[0], HasSubstr("failed: disk full"));
  EXPECT_FALSE(log.Recovered(start + absl::Seconds(30)).has_value())
      << "the last call failed: nothing recovered";
  EXPECT_FALSE(log.Succeeded(start + absl::Seconds(31)).has_value());
  EXPECT_TRUE(log.Recovered(start + absl::Seconds(36)).has_value());
}

}  // namespace
}  // namespace dropless::coordinator
