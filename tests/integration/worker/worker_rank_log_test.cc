// The daemon's --rank-log-max-bytes reaches the real rank processes' logs, end to end: a rank log
// that already holds more than the cap when the rank starts (the daemon appends to it) is rotated
// to rank-<R>.log.1 at the rank's first output, and the rank's own output, newest last, is in
// rank-<R>.log. Bad values are refused at start naming the field.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/worker/worker_cluster.h"

namespace dropless::testing {
namespace {

namespace v1 = dropless::v1;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(WorkerRankLogTest, TheFlagCapsTheRanksLogs) {
  WorkerCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.Diagnostics();
  const int64_t cap = 65536;
  // Both ranks of tiny-cpu on this one worker.
  ASSERT_TRUE(cluster
                  .StartWorker("node-log", {},
                               {"--cpu-slots=2", absl::StrCat("--rank-log-max-bytes=", cap)})
                  .ok())
      << cluster.Diagnostics();
  ASSERT_TRUE(cluster
                  .WaitForWorker("node-log",
                                 [](const v1::Worker& w) {
                                   return w.state() == v1::WORKER_STATE_READY;
                                 },
                                 absl::Seconds(30))
                  .has_value())
      << cluster.Diagnostics();

  // The first job of a fresh coordinator is job-000001: its logs exist before it is submitted,
  // each a little over the cap, of fresh random lines.
  const std::string attempt_dir = cluster.worker_dir("node-log") + "/jobs/job-000001/attempt-1";
  std::filesystem::create_directories(attempt_dir);
  std::mt19937_64 rng(std::random_device{}());
  std::string before[2];
  for (int rank = 0; rank < 2; ++rank) {
    while (static_cast<int64_t>(before[rank].size()) <= cap) {
      absl::StrAppend(&before[rank], "earlier output ", rng(), "\n");
    }
    std::ofstream(absl::StrCat(attempt_dir, "/rank-", rank, ".log")) << before[rank];
  }

  absl::StatusOr<v1::Job> job = cluster.Submit(TinyCpuSpec(40));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->id(), "job-000001");
  absl::StatusOr<v1::Job> done = cluster.WaitForState(
      job->id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->message() << cluster.Diagnostics();

  for (int rank = 0; rank < 2; ++rank) {
    const std::string log = absl::StrCat(attempt_dir, "/rank-", rank, ".log");
    EXPECT_EQ(ReadFile(log + ".1"), before[rank]) << "rank " << rank;
    const std::string newest = ReadFile(log);
    EXPECT_LE(static_cast<int64_t>(newest.size()), cap);
    EXPECT_TRUE(absl::StartsWith(newest, "job job-000001 attempt 1: ")) << newest;
    EXPECT_TRUE(absl::StrContains(newest, "\ndone: 40 steps in ")) << newest;
  }
  EXPECT_TRUE(absl::StrContains(cluster.Diagnostics(), "(--rank-log-max-bytes): rotated to "))
      << cluster.Diagnostics();
}

TEST(WorkerRankLogTest, BadCapsAreRefusedNamingTheField) {
  for (const char* flag : {"--rank-log-max-bytes=-1", "--rank-log-max-bytes=64"}) {
    CommandResult r = RunCommand({BinaryPath("dropless-worker"), "--insecure", flag,
                                  "--metrics-port=0"},
                                 absl::Seconds(30));
    EXPECT_EQ(r.exit_code, 2) << flag << r.out << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, "rank_log_max_bytes")) << flag << r.err;
  }
}

}  // namespace
}  // namespace dropless::testing
