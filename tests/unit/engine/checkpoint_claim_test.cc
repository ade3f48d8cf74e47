// Which attempt writes a rank's checkpoints (checkpoint_claim.h): the one that started last; an
// earlier one still running is told to stop, another job's run is a job error.
#include "worker/engine/checkpoint/checkpoint_claim.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/job_error.h"
#include "gtest/gtest.h"

namespace dropless::engine {
namespace {

namespace fs = std::filesystem;

class CheckpointClaimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TEST_TMPDIR");
    dir_ = std::string(base ? base : "/tmp") + "/dropless-claim-" + std::to_string(getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(CheckpointClaimTest, TheAttemptThatStartedLastWritesTheRanksCheckpoints) {
  const CheckpointClaim first{"job-a", 1, 3}, second{"job-a", 2, 3}, other_rank{"job-a", 1, 4};
  EXPECT_TRUE(CheckCheckpointClaim(dir_, first).ok());  // no record (nor directory): a fresh job
  ASSERT_TRUE(ClaimCheckpoints(dir_ + "/nested", first).ok());
  EXPECT_TRUE(CheckCheckpointClaim(dir_ + "/nested", first).ok());
  ASSERT_TRUE(ClaimCheckpoints(dir_ + "/nested", second).ok());
  EXPECT_TRUE(CheckCheckpointClaim(dir_ + "/nested", second).ok());
  const absl::Status stale = CheckCheckpointClaim(dir_ + "/nested", first);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  EXPECT_NE(stale.message().find("attempt 2 of this job writes rank 3's checkpoints now; attempt "
                                 "1 stops"),
            absl::string_view::npos)
      << stale;
  EXPECT_FALSE(IsJobError(stale));  // the coordinator has moved on to attempt 2 already
  // Attempt 1 starting after attempt 2 claimed the files does not take them back.
  const absl::Status late = ClaimCheckpoints(dir_ + "/nested", first);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_TRUE(CheckCheckpointClaim(dir_ + "/nested", second).ok());
  // Each rank has its own record (ranks of one attempt may run on other nodes' directories).
  EXPECT_TRUE(CheckCheckpointClaim(dir_ + "/nested", other_rank).ok());
}

TEST_F(CheckpointClaimTest, AnotherJobsRunIsAJobError) {
  ASSERT_TRUE(ClaimCheckpoints(dir_, {"job-b", 1, 0}).ok());
  const absl::Status taken = CheckCheckpointClaim(dir_, {"job-a", 5, 0});
  EXPECT_EQ(taken.code(), absl::StatusCode::kFailedPrecondition) << taken;
  EXPECT_TRUE(IsJobError(taken)) << taken;
  EXPECT_NE(taken.message().find("job job-b (attempt 1)"), absl::string_view::npos) << taken;
  // A job that starts on another's directory (a new job resuming a finished one) takes it.
  ASSERT_TRUE(ClaimCheckpoints(dir_, {"job-a", 1, 0}).ok());
  EXPECT_TRUE(CheckCheckpointClaim(dir_, {"job-a", 1, 0}).ok());
}

TEST_F(CheckpointClaimTest, ADamagedRecordOrAFileForTheDirectoryIsAJobError) {
  fs::create_directories(dir_);
  for (const char* text :
       {"", "garbage", "dropless-checkpoint-owner job= attempt=1",
        "dropless-checkpoint-owner job=a attempt=x", "dropless-checkpoint-owner job=a"}) {
    std::ofstream(CheckpointClaimPath(dir_, 0), std::ios::trunc) << text;
    const absl::Status s = CheckCheckpointClaim(dir_, {"a", 1, 0});
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << text << ": " << s;
    EXPECT_TRUE(IsJobError(s)) << text;
  }
  std::ofstream(dir_ + "/file") << "x";
  const absl::Status s = ClaimCheckpoints(dir_ + "/file", {"a", 1, 0});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(IsJobError(s)) << s;
}

}  // namespace
}  // namespace dropless::engine
