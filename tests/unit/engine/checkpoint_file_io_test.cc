// The checkpoint's file plumbing: a directory it creates is made durable in its parent.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/job_error.h"
#include "gtest/gtest.h"
#include "worker/engine/checkpoint/file_io.h"

namespace dropless::engine {
namespace {

namespace fs = std::filesystem;

class FileIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TEST_TMPDIR");
    dir_ = std::string(base ? base : "/tmp") + "/dropless-file-io-" + std::to_string(getpid()) +
           "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

// A checkpoint committed in a directory that a crash loses is lost with it: each directory
// MakeDirectories creates is synced in its parent; existing ones are left alone.
TEST_F(FileIoTest, MakeDirectoriesSyncsTheParentOfEachDirectoryItCreates) {
  std::vector<std::string> synced;
  const auto record = [&](const std::string& dir) {
    synced.push_back(dir);
    return absl::OkStatus();
  };
  ASSERT_TRUE(MakeDirectories(dir_ + "/a/b/c", record).ok());
  EXPECT_TRUE(fs::is_directory(dir_ + "/a/b/c"));
  EXPECT_EQ(synced, (std::vector<std::string>{dir_, dir_ + "/a", dir_ + "/a/b"}));
  synced.clear();
  ASSERT_TRUE(MakeDirectories(dir_ + "/a/b/c", record).ok());   // nothing new to sync
  ASSERT_TRUE(MakeDirectories(dir_ + "/a/b/d/", record).ok());  // a trailing slash
  EXPECT_EQ(synced, (std::vector<std::string>{dir_ + "/a/b"}));
  // Through the real fsync.
  ASSERT_TRUE(MakeDirectories(dir_ + "/e/f").ok());
  EXPECT_TRUE(fs::is_directory(dir_ + "/e/f"));
}

TEST_F(FileIoTest, MakeDirectoriesReturnsAFailedSync) {
  int calls = 0;
  const absl::Status failed = MakeDirectories(dir_ + "/x/y", [&](const std::string&) {
    ++calls;
    return absl::InternalError("fsync: Input/output error");
  });
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_EQ(calls, 1);               // stops at the first directory that may not survive a crash
  EXPECT_FALSE(IsJobError(failed));  // the moment's, not the job's: a retry may succeed
}

// The file errors that are the directory's own, which every retry meets again, are job errors.
TEST_F(FileIoTest, TheDirectorysOwnErrorsAreJobErrors) {
  std::ofstream(dir_ + "/big") << std::string(100, 'x');
  const absl::Status too_big = ReadSmallFile(dir_ + "/big", 10).status();
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument) << too_big;
  EXPECT_TRUE(IsJobError(AsCheckpointJobError(too_big)));
  const absl::Status not_a_file = ReadSmallFile(dir_, 10).status();
  EXPECT_EQ(not_a_file.code(), absl::StatusCode::kFailedPrecondition) << not_a_file;
  EXPECT_TRUE(IsJobError(AsCheckpointJobError(not_a_file)));
  EXPECT_TRUE(IsJobError(AsCheckpointJobError(absl::DataLossError("damaged"))));
  EXPECT_FALSE(IsJobError(AsCheckpointJobError(ReadSmallFile(dir_ + "/none", 10).status())));
  EXPECT_FALSE(IsJobError(AsCheckpointJobError(absl::InternalError("EIO"))));
}

}  // namespace
}  // namespace dropless::engine
