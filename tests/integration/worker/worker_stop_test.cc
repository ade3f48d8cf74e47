// How the worker daemon stops, against the real coordinator: a second SIGTERM during the graceful
// stop does not wait for the grace period.
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/worker/worker_cluster.h"

namespace dropless::testing {
namespace {

namespace v1 = dropless::v1;

// The first SIGTERM gives the ranks the grace period (60 s here) between SIGTERM and SIGKILL; a
// second one SIGKILLs them and the daemon exits within seconds, saying so. The rank stands in for
// one that does not end on SIGTERM by being stopped (SIGSTOP): only SIGKILL ends a stopped
// process.
TEST(WorkerStopTest, ASecondSigtermStopsAtOnceInsteadOfWaitingForTheGracePeriod) {
  WorkerCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartWorker("node-s", {}, {"--kill-grace-ms=60000"}).ok())
      << cluster.Diagnostics();
  ASSERT_TRUE(cluster
                  .WaitForWorker(
                      "node-s",
                      [](const v1::Worker& w) { return w.state() == v1::WORKER_STATE_READY; },
                      absl::Seconds(30))
                  .has_value())
      << cluster.Diagnostics();
  absl::StatusOr<v1::Job> job =
      cluster.Submit(absl::StrReplaceAll(TinyCpuSpec(1000000), {{"ep: 2", "ep: 1"}}));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(cluster.WaitForState(job->id(), {v1::JOB_STATE_RUNNING}, absl::Seconds(60)).ok());
  std::vector<pid_t> ranks;
  const absl::Time found_by = absl::Now() + absl::Seconds(30);
  while ((ranks = cluster.RankPidsOf(job->id())).empty() && absl::Now() < found_by) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(ranks.size(), 1u) << cluster.Diagnostics();
  ASSERT_EQ(kill(ranks[0], SIGSTOP), 0);

  Process* worker = cluster.worker("node-s");
  ASSERT_TRUE(worker->Signal(SIGTERM).ok());
  absl::SleepFor(absl::Seconds(2));
  ASSERT_TRUE(worker->Running()) << "the first SIGTERM waits for the grace period\n"
                                 << cluster.Diagnostics();
  EXPECT_EQ(kill(ranks[0], 0), 0) << "the rank ended before its SIGKILL";

  const absl::Time second = absl::Now();
  ASSERT_TRUE(worker->Signal(SIGTERM).ok());
  absl::StatusOr<int> code = worker->Wait(absl::Seconds(20));
  ASSERT_TRUE(code.ok()) << code.status() << "\n" << cluster.Diagnostics();
  EXPECT_LT(absl::Now() - second, absl::Seconds(8));
  EXPECT_EQ(*code, 0) << cluster.Diagnostics();
  EXPECT_TRUE(WaitGone(ranks, absl::Seconds(5)));
  const std::string log = worker->Output();
  EXPECT_NE(log.find("again: stopping now"), std::string::npos) << log;
  EXPECT_NE(log.find("stopped at once on a second signal"), std::string::npos) << log;
}

}  // namespace
}  // namespace dropless::testing
