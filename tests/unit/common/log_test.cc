#include "common/log.h"

#include <errno.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless {
namespace {

TEST(LogTest, LineFormat) {
  const absl::Time t = absl::FromCivil(absl::CivilSecond(2024, 5, 1, 12, 0, 0), absl::UTCTimeZone()) +
                       absl::Milliseconds(123);
  EXPECT_EQ(FormatLogLine(t, 'W', "dropless-worker", "slot 1 is still held"),
            "2024-05-01T12:00:00.123Z W dropless-worker: slot 1 is still held\n");
}

// What LogInfo/LogWarning/LogError write to the real stderr (fd 2, redirected to a file).
TEST(LogTest, OneLinePerCallOnStderrWithLevelAndProgram) {
  char path[] = "/tmp/dropless-log-test-XXXXXX";
  const int file = mkstemp(path);
  ASSERT_GE(file, 0);
  std::fflush(stderr);
  const int saved = dup(STDERR_FILENO);
  ASSERT_GE(dup2(file, STDERR_FILENO), 0);
  LogInfo("coordinator started");
  LogWarning("lease expired");
  LogError("disk full");
  ASSERT_GE(dup2(saved, STDERR_FILENO), 0);
  close(saved);
  close(file);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path);
  const std::string prefix = "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z ";
  const std::string program = program_invocation_short_name;
  EXPECT_THAT(text.str(), ::testing::MatchesRegex(prefix + "I " + program + ": coordinator started\n" +
                                                  prefix + "W " + program + ": lease expired\n" +
                                                  prefix + "E " + program + ": disk full\n"));
}

}  // namespace
}  // namespace dropless
