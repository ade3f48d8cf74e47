// The daemon's --checkpoint-roots, end to end: a job whose checkpoint.dir is outside them fails as
// a job error naming the field (nothing written there), and one inside them runs and checkpoints.
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "tests/integration/worker/worker_cluster.h"

namespace dropless::testing {
namespace {

namespace v1 = dropless::v1;

// tiny-cpu with checkpoint.dir `dir`, saved every 10 steps.
std::string WithCheckpoints(const std::string& dir) {
  std::string spec = TinyCpuSpec(20);
  const std::string from = "checkpoint: {dir: \"\", every: 0}";
  EXPECT_TRUE(absl::StrContains(spec, from)) << spec;
  return absl::StrReplaceAll(spec,
                             {{from, absl::StrCat("checkpoint: {dir: \"", dir, "\", every: 10}")}});
}

TEST(WorkerCheckpointRootsTest, ACheckpointDirOutsideTheRootsIsAJobError) {
  std::string tmp = ::testing::TempDir();
  while (tmp.size() > 1 && tmp.back() == '/') tmp.pop_back();
  const std::string base = absl::StrCat(tmp, "/ckpt-roots-", getpid(), "-", std::random_device{}());
  const std::string root = base + "/root";
  std::filesystem::create_directories(root);
  std::filesystem::create_directories(base + "/elsewhere");
  // A link inside the root to a directory outside it: refused as the filesystem resolves it.
  std::filesystem::create_directory_symlink(base + "/elsewhere", root + "/link");

  WorkerCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.Diagnostics();
  ASSERT_TRUE(
      cluster.StartWorker("node-roots", {}, {"--cpu-slots=2", "--checkpoint-roots=" + root}).ok())
      << cluster.Diagnostics();
  ASSERT_TRUE(cluster
                  .WaitForWorker("node-roots",
                                 [](const v1::Worker& w) {
                                   return w.state() == v1::WORKER_STATE_READY;
                                 },
                                 absl::Seconds(30))
                  .has_value())
      << cluster.Diagnostics();

  for (const std::string& outside :
       {base + "/elsewhere/job", root + "/link/job", root + "/../elsewhere/job2"}) {
    absl::StatusOr<v1::Job> job = cluster.Submit(WithCheckpoints(outside));
    ASSERT_TRUE(job.ok()) << job.status();
    absl::StatusOr<v1::Job> done = cluster.WaitForState(
        job->id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, absl::Seconds(120));
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->state(), v1::JOB_STATE_FAILED) << outside;
    EXPECT_TRUE(absl::StrContains(done->message(), "checkpoint.dir: " + outside +
                                                       " is not inside this worker's checkpoint "
                                                       "roots (" + root))
        << done->message();
    EXPECT_TRUE(absl::StrContains(done->message(), "exit code 78")) << done->message();
  }
  EXPECT_TRUE(std::filesystem::is_empty(base + "/elsewhere")) << "nothing written outside";

  absl::StatusOr<v1::Job> inside = cluster.Submit(WithCheckpoints(root + "/team/run"));
  ASSERT_TRUE(inside.ok()) << inside.status();
  absl::StatusOr<v1::Job> done = cluster.WaitForState(
      inside->id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->message() << cluster.Diagnostics();
  EXPECT_FALSE(std::filesystem::is_empty(root + "/team/run"));
  std::filesystem::remove_all(base);
}

}  // namespace
}  // namespace dropless::testing
