// Which attempt writes a rank's checkpoints (checkpoint_claim.h): the one that started last; an
// earlier one still running is told to stop, another job's run is a job error.
#include "worker/engine/checkpoint/checkpoint_claim.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
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
  EXPECT_NE(taken.message().find("job \"job-b\" (attempt 1)"), absl::string_view::npos) << taken;
  // A job that starts on another's directory (a new job resuming a finished one) takes it.
  ASSERT_TRUE(ClaimCheckpoints(dir_, {"job-a", 1, 0}).ok());
  EXPECT_TRUE(CheckCheckpointClaim(dir_, {"job-a", 1, 0}).ok());
}

// One user's job neither resumes from nor overwrites another user's checkpoints: claiming a
// directory whose record names another user is a job error before anything is read. The same
// user's next job takes it (resuming a finished run); a record without a user is anyone's.
TEST_F(CheckpointClaimTest, AnotherUsersCheckpointsAreRefused) {
  ASSERT_TRUE(ClaimCheckpoints(dir_, {"job-a", 1, 0, "alice smith"}).ok());
  EXPECT_TRUE(CheckCheckpointClaim(dir_, {"job-a", 1, 0, "alice smith"}).ok());
  const absl::Status bobs = ClaimCheckpoints(dir_, {"job-b", 1, 0, "bob"});
  EXPECT_EQ(bobs.code(), absl::StatusCode::kPermissionDenied) << bobs;
  EXPECT_TRUE(IsJobError(bobs)) << bobs;
  EXPECT_NE(bobs.message().find("job \"job-a\" of user \"alice smith\"; job job-b of user bob may "
                                "neither resume from nor write them"),
            absl::string_view::npos)
      << bobs;
  EXPECT_EQ(ClaimCheckpoints(dir_, {"job-c", 1, 0, ""}).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(CheckCheckpointClaim(dir_, {"job-a", 1, 0, "alice smith"}).ok());  // still hers
  ASSERT_TRUE(ClaimCheckpoints(dir_, {"job-d", 1, 0, "alice smith"}).ok());
  // A record without a user (a plaintext cluster's) is taken by anyone, and then is theirs.
  ASSERT_TRUE(ClaimCheckpoints(dir_ + "/open", {"job-e", 1, 0, ""}).ok());
  ASSERT_TRUE(ClaimCheckpoints(dir_ + "/open", {"job-f", 1, 0, "bob"}).ok());
  EXPECT_EQ(ClaimCheckpoints(dir_ + "/open", {"job-g", 1, 0, "carol"}).code(),
            absl::StatusCode::kPermissionDenied);
  // A name with a newline or a quote survives the record.
  ASSERT_TRUE(ClaimCheckpoints(dir_ + "/odd", {"job-h", 1, 0, "o'neil\nx"}).ok());
  EXPECT_TRUE(CheckCheckpointClaim(dir_ + "/odd", {"job-h", 1, 0, "o'neil\nx"}).ok());
  EXPECT_EQ(ClaimCheckpoints(dir_ + "/odd", {"job-i", 1, 0, "o'neil"}).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(CheckpointClaimTest, ADamagedRecordOrAFileForTheDirectoryIsAJobError) {
  fs::create_directories(dir_);
  for (const char* text :
       {"", "garbage", "dropless-checkpoint-owner job= attempt=1",
        "dropless-checkpoint-owner job=a attempt=x", "dropless-checkpoint-owner job=a",
        "dropless-checkpoint-owner job=a attempt=1\nuser=",
        "dropless-checkpoint-owner job=a "
        "attempt=1\nowner=x",
        "dropless-checkpoint-owner job=a attempt=1\nuser=a\nuser=b"}) {
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

// The contents a record of a rank's own is never left with: ClaimCheckpoints writes it atomically
// (temp file, fsync, rename), so a crash leaves the previous record or the whole new one. Every
// truncation of a real record short of its attempt number (an empty file included), and random
// bytes, fresh each run.
std::vector<std::string> DamagedRecords(const std::string& real) {
  std::vector<std::string> damaged;
  for (size_t n = 0; n <= real.rfind("attempt=") + 8; ++n) damaged.push_back(real.substr(0, n));
  std::mt19937 rng(std::random_device{}());
  for (int i = 0; i < 8; ++i) {
    std::string bytes(1 + rng() % 200, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    damaged.push_back(bytes);
  }
  damaged.push_back(real.substr(0, real.size() - 1) + std::string("\xff\0junk", 6));
  return damaged;
}

// A damaged record is not replaced: it cannot say whose the checkpoints are, and whatever damaged
// it (it was no crash of a rank) may have damaged them too. Claiming the directory is a job error
// naming the file (the rank exits 78, the coordinator ends the job), and the record is left as
// found for someone to look at; so is checking it before a save.
TEST_F(CheckpointClaimTest, ADamagedRecordIsNotReplaced) {
  ASSERT_TRUE(ClaimCheckpoints(dir_ + "/real", {"job-a", 7, 0}).ok());
  std::ifstream in(CheckpointClaimPath(dir_ + "/real", 0), std::ios::binary);
  const std::string real((std::istreambuf_iterator<char>(in)), {});
  ASSERT_EQ(real, "dropless-checkpoint-owner job=job-a attempt=7\n");
  int case_number = 0;
  for (const std::string& damaged : DamagedRecords(real)) {
    const std::string dir = dir_ + "/case-" + std::to_string(case_number++);
    fs::create_directories(dir);
    const std::string record = CheckpointClaimPath(dir, 0);
    std::ofstream(record, std::ios::binary | std::ios::trunc) << damaged;
    for (const absl::Status& s :
         {ClaimCheckpoints(dir, {"job-a", 8, 0}), CheckCheckpointClaim(dir, {"job-a", 7, 0})}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << absl::CEscape(damaged) << ": " << s;
      EXPECT_TRUE(IsJobError(s)) << s;
      EXPECT_EQ(RankExitCodeFor(s), kRankExitJobError) << s;
      EXPECT_NE(s.message().find(record + " is damaged, not a checkpoint owner record"),
                absl::string_view::npos)
          << s;
    }
    std::ifstream after(record, std::ios::binary);
    EXPECT_EQ(std::string((std::istreambuf_iterator<char>(after)), {}), damaged)
        << "replaced: " << absl::CEscape(damaged);
  }
}

// What an interrupted claim does leave is its temp file, beside the previous record: that one
// still holds, and the next claim replaces it.
TEST_F(CheckpointClaimTest, AnInterruptedClaimLeavesThePreviousRecord) {
  ASSERT_TRUE(ClaimCheckpoints(dir_, {"job-a", 1, 0}).ok());
  std::ofstream(CheckpointClaimPath(dir_, 0) + ".tmp") << "dropless-checkpoint-owner job=job-a at";
  EXPECT_TRUE(CheckCheckpointClaim(dir_, {"job-a", 1, 0}).ok());
  ASSERT_TRUE(ClaimCheckpoints(dir_, {"job-a", 2, 0}).ok());
  EXPECT_TRUE(CheckCheckpointClaim(dir_, {"job-a", 2, 0}).ok());
  EXPECT_FALSE(fs::exists(CheckpointClaimPath(dir_, 0) + ".tmp"));  // renamed into place
}

// A record too large to be one, or a directory where it belongs, is the directory's problem: every
// attempt of the job would meet it again, so the rank exits with the job-error code (the
// coordinator ends the job) instead of 1 (retried forever).
TEST_F(CheckpointClaimTest, AnOversizedRecordOrADirectoryInItsPlaceIsAJobError) {
  fs::create_directories(dir_);
  const std::string record = CheckpointClaimPath(dir_, 0);
  std::ofstream(record) << "dropless-checkpoint-owner job=a attempt=1\n" << std::string(5000, 'x');
  for (const absl::Status& s :
       {ClaimCheckpoints(dir_, {"a", 2, 0}), CheckCheckpointClaim(dir_, {"a", 1, 0})}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(IsJobError(s)) << s;
  }
  fs::remove(record);
  fs::create_directory(record);
  for (const absl::Status& s :
       {ClaimCheckpoints(dir_, {"a", 2, 0}), CheckCheckpointClaim(dir_, {"a", 1, 0})}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_TRUE(IsJobError(s)) << s;
  }
}

}  // namespace
}  // namespace dropless::engine
