// The checkpoint's file plumbing: a directory it creates, or finds created by another rank, is made
// durable in its parent.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <utility>
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

// The syncs `MakeDirectories` asks of its hook, those of `within` and below only (the syncs of the
// temp directory's own ancestors depend on where the test runs).
class SyncRecorder {
 public:
  explicit SyncRecorder(std::string within) : within_(std::move(within)) {}
  absl::Status operator()(const std::string& dir) {
    if (dir == within_ || dir.rfind(within_ + "/", 0) == 0) synced_.push_back(dir);
    return absl::OkStatus();
  }
  std::vector<std::string> Take() { return std::exchange(synced_, {}); }

 private:
  std::string within_;
  std::vector<std::string> synced_;
};

// A checkpoint committed in a directory that a crash loses is lost with it: each directory
// MakeDirectories creates is synced in its parent, and so is each one it finds there already
// (another rank may have created it a moment ago without syncing it yet).
TEST_F(FileIoTest, MakeDirectoriesSyncsTheParentOfEachDirectoryOnThePath) {
  SyncRecorder recorder(dir_);
  const auto record = [&](const std::string& dir) { return recorder(dir); };
  ASSERT_TRUE(MakeDirectories(dir_ + "/a/b/c", record).ok());
  EXPECT_TRUE(fs::is_directory(dir_ + "/a/b/c"));
  const std::vector<std::string> parents = {dir_, dir_ + "/a", dir_ + "/a/b"};
  EXPECT_EQ(recorder.Take(), parents);
  ASSERT_TRUE(MakeDirectories(dir_ + "/a/b/c", record).ok());  // all there: synced all the same
  EXPECT_EQ(recorder.Take(), parents);
  ASSERT_TRUE(MakeDirectories(dir_ + "/a/b/d/", record).ok());  // a trailing slash
  EXPECT_EQ(recorder.Take(), parents);
  // Through the real fsync.
  ASSERT_TRUE(MakeDirectories(dir_ + "/e/f").ok());
  ASSERT_TRUE(MakeDirectories(dir_ + "/e/f").ok());
  EXPECT_TRUE(fs::is_directory(dir_ + "/e/f"));
}

// Two ranks create the same new directory at once: one of them gets EEXIST from each mkdir the
// other won, and must sync that directory's parent as well before it commits a checkpoint inside
// (the winner's sync may not have happened yet). Whoever wins, both sync every parent.
TEST_F(FileIoTest, RanksCreatingTheSameDirectoryAtOnceBothSyncItsParent) {
  // The other rank's mkdir came first: this rank meets EEXIST only.
  fs::create_directories(dir_ + "/won/by/other");
  SyncRecorder recorder(dir_);
  ASSERT_TRUE(MakeDirectories(dir_ + "/won/by/other", [&](const std::string& d) {
                return recorder(d);
              }).ok());
  EXPECT_EQ(recorder.Take(), (std::vector<std::string>{dir_, dir_ + "/won", dir_ + "/won/by"}));
  // A real race, on fresh directories each round.
  std::mt19937 rng(std::random_device{}());
  for (int round = 0; round < 20; ++round) {
    const std::string base =
        dir_ + "/race-" + std::to_string(round) + "-" + std::to_string(rng() % 100000);
    const std::string target = base + "/x/y";
    const std::vector<std::string> parents = {dir_, base, base + "/x"};
    SyncRecorder first(dir_), second(dir_);
    std::atomic<bool> go{false};
    absl::Status first_status, second_status;
    const auto rank = [&](SyncRecorder* r, absl::Status* out) {
      while (!go.load()) {
      }
      *out = MakeDirectories(target, [r](const std::string& d) { return (*r)(d); });
    };
    std::thread a(rank, &first, &first_status), b(rank, &second, &second_status);
    go = true;
    a.join();
    b.join();
    ASSERT_TRUE(first_status.ok()) << first_status;
    ASSERT_TRUE(second_status.ok()) << second_status;
    EXPECT_TRUE(fs::is_directory(target));
    EXPECT_EQ(first.Take(), parents) << "round " << round;
    EXPECT_EQ(second.Take(), parents) << "round " << round;
  }
}

// A failed sync of an existing directory's parent fails the call like one of a new directory's.
TEST_F(FileIoTest, MakeDirectoriesReturnsAFailedSyncOfAnExistingDirectorysParent) {
  fs::create_directories(dir_ + "/made");
  std::vector<std::string> asked;
  const absl::Status failed = MakeDirectories(dir_ + "/made", [&](const std::string& d) {
    asked.push_back(d);
    return d == dir_ ? absl::InternalError("fsync: Input/output error") : absl::OkStatus();
  });
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_FALSE(IsJobError(failed));  // the moment's: a retry may succeed
  ASSERT_FALSE(asked.empty());
  EXPECT_EQ(asked.back(), dir_);  // it stopped there
}

// A parent this process may not read cannot be synced by it, nor by a rank of its job that
// created the entry (the same code would have failed there), so an existing directory under one
// (a 0711 /shared holding /shared/<user>) is not refused.
TEST_F(FileIoTest, AnExistingDirectoryInAnUnreadableParentIsNotRefused) {
  if (geteuid() == 0) GTEST_SKIP() << "root reads every directory";
  fs::create_directories(dir_ + "/locked/mine");
  fs::permissions(dir_ + "/locked", fs::perms::owner_write | fs::perms::owner_exec);
  SyncRecorder recorder(dir_);
  const absl::Status made = MakeDirectories(dir_ + "/locked/mine/ckpt",
                                            [&](const std::string& d) { return recorder(d); });
  const absl::Status real = MakeDirectories(dir_ + "/locked/mine/ckpt2");  // the real fsync
  fs::permissions(dir_ + "/locked", fs::perms::owner_all);  // before any assertion: TearDown
  ASSERT_TRUE(made.ok()) << made;
  // dir_ (holding locked) and mine (holding the new ckpt) synced; locked skipped.
  EXPECT_EQ(recorder.Take(), (std::vector<std::string>{dir_, dir_ + "/locked/mine"}));
  EXPECT_TRUE(real.ok()) << real;
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
