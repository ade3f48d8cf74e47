// The hang watchdog end to end: a real rank stalled in one phase of its step (DROPLESS_TEST_STALL,
// the CPU engine's test hook) has its attempt aborted, the event names the stuck rank, its node
// and phase, and the job's retry runs to the end.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/worker/worker_cluster.h"

namespace dropless::testing {
namespace {

namespace v1 = dropless::v1;

TEST(WorkerWatchdogTest, AStalledRankIsNamedAndItsAttemptRetried) {
  WorkerCluster cluster;
  // Steps take milliseconds here: 5 s in one phase is a hang.
  ASSERT_TRUE(cluster
                  .StartCoordinator({"--hang-step-multiple=10", "--hang-min-stall-ms=5000",
                                     "--hang-first-step-ms=60000"})
                  .ok())
      << cluster.Diagnostics();
  ASSERT_TRUE(cluster.StartWorker("node-1").ok()) << cluster.Diagnostics();
  // node-2's rank sleeps 10 minutes in the expert GEMMs of step 5 of attempt 1.
  ASSERT_TRUE(cluster
                  .StartWorker("node-2", {{"DROPLESS_TEST_STALL",
                                           "phase=gemm,step=5,attempt=1,seconds=600"}})
                  .ok())
      << cluster.Diagnostics();
  for (const char* node : {"node-1", "node-2"}) {
    ASSERT_TRUE(cluster
                    .WaitForWorker(node,
                                   [](const v1::Worker& w) {
                                     return w.state() == v1::WORKER_STATE_READY;
                                   },
                                   absl::Seconds(30))
                    .has_value())
        << cluster.Diagnostics();
  }
  std::string spec = TinyCpuSpec(20);
  const std::string one_attempt = "max_attempts: 1";
  // A third attempt leaves room for a step slowed past the limit by a loaded CI machine.
  spec.replace(spec.find(one_attempt), one_attempt.size(), "max_attempts: 3");
  absl::StatusOr<v1::Job> submitted = cluster.Submit(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();

  const absl::Time start = absl::Now();
  absl::StatusOr<v1::Job> job = cluster.WaitForState(
      submitted->id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, absl::Seconds(120));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->message() << "\n"
                                                   << cluster.Diagnostics();
  EXPECT_GE(job->attempt(), 2);
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));

  absl::StatusOr<std::vector<v1::Event>> events = cluster.Events(submitted->id());
  ASSERT_TRUE(events.ok()) << events.status();
  const v1::Event* stuck = nullptr;
  for (const v1::Event& e : *events) {
    if (e.type() == "RankStuck" && e.attempt() == 1 && stuck == nullptr) stuck = &e;
  }
  ASSERT_NE(stuck, nullptr) << cluster.Diagnostics();
  EXPECT_EQ(stuck->attempt(), 1);
  // The stalled rank, not its peer waiting for it in the combine all-to-all on node-1.
  EXPECT_TRUE(absl::StrContains(stuck->message(), "on node node-2")) << stuck->message();
  EXPECT_TRUE(absl::StrContains(stuck->message(), "phase gemm of step 5")) << stuck->message();
  // The stalled process was stopped, not left sleeping.
  EXPECT_TRUE(cluster.RankPidsOf(submitted->id()).empty());
}

}  // namespace
}  // namespace dropless::testing
