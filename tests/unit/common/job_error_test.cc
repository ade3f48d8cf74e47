// The marks a rank's error carries to its exit code: a job error, a GPU too small, or neither.
#include "common/job_error.h"

#include "gtest/gtest.h"

namespace dropless {
namespace {

TEST(JobErrorTest, EachMarkHasItsExitCode) {
  const absl::Status plain = absl::InternalError("a node problem");
  EXPECT_FALSE(IsJobError(plain));
  EXPECT_FALSE(IsDeviceTooSmall(plain));
  EXPECT_EQ(RankExitCodeFor(plain), 1);

  const absl::Status job = MarkJobError(absl::InvalidArgumentError("spec"));
  EXPECT_TRUE(IsJobError(job));
  EXPECT_FALSE(IsDeviceTooSmall(job));
  EXPECT_EQ(RankExitCodeFor(job), kRankExitJobError);

  const absl::Status small = MarkDeviceTooSmall(absl::ResourceExhaustedError("80 GiB"));
  EXPECT_TRUE(IsDeviceTooSmall(small));
  EXPECT_FALSE(IsJobError(small));
  EXPECT_EQ(RankExitCodeFor(small), kRankExitDeviceTooSmall);
  EXPECT_EQ(small.message(), "80 GiB");
  EXPECT_EQ(small.code(), absl::StatusCode::kResourceExhausted);

  // An OK status stays OK, and the exit codes differ from each other and from success.
  EXPECT_TRUE(MarkDeviceTooSmall(absl::OkStatus()).ok());
  EXPECT_FALSE(IsDeviceTooSmall(absl::OkStatus()));
  EXPECT_NE(kRankExitJobError, kRankExitDeviceTooSmall);
}

}  // namespace
}  // namespace dropless
