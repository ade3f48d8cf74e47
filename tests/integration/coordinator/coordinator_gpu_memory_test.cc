// Mixed GPU fleets: a cuda job whose rank ran out of memory on a GPU of one size
// (kRankExitDeviceTooSmall) runs next on a larger GPU, without spending an attempt, or fails with
// the reason when no READY worker has one, also when a peer's failure ended the attempt before the
// rank's report came. The real coordinator over loopback, fake workers.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "common/job_error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"

namespace dropless::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

// A job of `ranks` ranks (ep) on the cuda backend.
std::string CudaSpec(int ranks = 1, int max_attempts = 1) {
  return absl::StrFormat(R"yaml(name: gpu-memory
max_attempts: %d
model: {hidden: 64, ffn: 128, experts: 8, topk: 2, shared_experts: 0, layers: 1, router: softmax, renormalize: true, activation: swiglu}
parallel: {ep: %d, dp: 1}
precision: bf16
tokens_per_rank: 64
steps: 5
data: {distribution: uniform, seed: 7}
resources: {backend: cuda}
)yaml",
                         max_attempts, ranks);
}

std::string OneRankCudaSpec() { return CudaSpec(); }

// A cuda worker of `slots` GPUs with `gib` GiB each, joined.
std::unique_ptr<FakeWorker> GpuWorker(CoordinatorUnderTest& c, const std::string& node, int slots,
                                      int64_t gib) {
  auto w = std::make_unique<FakeWorker>(c.channel(), node, slots, "cuda");
  w->SetGpuMemoryBytes(gib * kGiB);
  EXPECT_TRUE(w->Join().ok());
  return w;
}

bool RetryingSays(const std::vector<v1::Event>& events, const std::string& text) {
  for (const v1::Event& e : events) {
    if (e.type() == "Retrying" && absl::StrContains(e.message(), text)) return true;
  }
  return false;
}

TEST(CoordinatorGpuMemoryTest, AJobTooLargeForOneGpuRunsOnALargerOneWithoutSpendingAnAttempt) {
  auto coordinator = CoordinatorUnderTest::Start();
  FakeWorker small(coordinator->channel(), "node-h100", 1, "cuda");
  small.SetGpuMemoryBytes(80 * kGiB);
  ASSERT_TRUE(small.Join().ok());
  FakeWorker large(coordinator->channel(), "node-h200", 1, "cuda");
  large.SetGpuMemoryBytes(141 * kGiB);
  ASSERT_TRUE(large.Join().ok());
  std::vector<v1::Worker> workers = coordinator->Workers();
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_THAT(workers[0].device_memory_bytes(), ::testing::ElementsAre(80 * kGiB));

  absl::StatusOr<v1::Job> job = coordinator->Submit(OneRankCudaSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  // Equal free slots: the first worker's id wins the tie.
  std::optional<v1::Assignment> first = small.NextAssignment();
  ASSERT_TRUE(first.has_value());
  ASSERT_TRUE(small.ReportRank(job->id(), 1, 0, v1::RANK_STATE_RUNNING).ok());
  ASSERT_TRUE(
      small.ReportRank(job->id(), 1, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall).ok());

  // max_attempts 1, and still a second attempt: on the larger GPU.
  std::optional<v1::Assignment> second = large.NextAssignment();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->attempt(), 2);
  v1::Job moved =
      coordinator->WaitForJob(job->id(), [](const v1::Job& j) { return j.attempt() == 2; });
  EXPECT_EQ(moved.needs_device_memory_above_bytes(), 80 * kGiB);
  EXPECT_EQ(moved.uncounted_attempts(), 1);
  ASSERT_EQ(moved.placement_size(), 1);
  EXPECT_EQ(moved.placement(0).node(), "node-h200");
  EXPECT_TRUE(RetryingSays(coordinator->Events(job->id()),
                           "ran out of memory on a GPU of 80.0 GiB; queued for attempt 2 on GPUs "
                           "with more memory (not counted against max_attempts)"));

  ASSERT_TRUE(large.ReportRank(job->id(), 2, 0, v1::RANK_STATE_RUNNING).ok());
  ASSERT_TRUE(large.ReportRank(job->id(), 2, 0, v1::RANK_STATE_SUCCEEDED).ok());
  coordinator->WaitForState(job->id(), v1::JOB_STATE_SUCCEEDED);

  // What was learned is stored with the job.
  coordinator->KillAndRestart();
  absl::StatusOr<v1::Job> stored = coordinator->Get(job->id());
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(stored->needs_device_memory_above_bytes(), 80 * kGiB);
  EXPECT_EQ(stored->uncounted_attempts(), 1);
}

TEST(CoordinatorGpuMemoryTest, WithoutALargerGpuTheJobFailsAndSaysWhy) {
  auto coordinator = CoordinatorUnderTest::Start();
  FakeWorker small(coordinator->channel(), "node-h100", 2, "cuda");
  small.SetGpuMemoryBytes(80 * kGiB);
  ASSERT_TRUE(small.Join().ok());
  absl::StatusOr<v1::Job> job = coordinator->Submit(OneRankCudaSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(small.NextAssignment().has_value());
  ASSERT_TRUE(
      small.ReportRank(job->id(), 1, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall).ok());
  v1::Job failed = coordinator->WaitForState(job->id(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(),
              HasSubstr("no known cuda worker has 1 GPU(s) with more than 80.0 GiB on one node"));
  EXPECT_EQ(failed.needs_device_memory_above_bytes(), 80 * kGiB);  // learned, failed or not
  EXPECT_THAT(failed.message(), HasSubstr("not retried"));
  EXPECT_EQ(failed.attempt(), 1);

  // A worker that does not report its GPUs' memory: the same end, without a size to name.
  FakeWorker old(coordinator->channel(), "node-old", 1, "cuda");
  ASSERT_TRUE(old.Join().ok());
  small.Disconnect();
  ASSERT_TRUE(coordinator->WaitForWorkerState("node-h100", v1::WORKER_STATE_LOST));
  absl::StatusOr<v1::Job> again = coordinator->Submit(OneRankCudaSpec());
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(old.NextAssignment().has_value());
  ASSERT_TRUE(
      old.ReportRank(again->id(), 1, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall).ok());
  v1::Job unknown = coordinator->WaitForState(again->id(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(unknown.message(), HasSubstr("not retried"));
  EXPECT_EQ(unknown.needs_device_memory_above_bytes(), 0);
}

// Attempts on the larger GPU count as usual: with max_attempts 2, attempts 2 and 3 are the two.
TEST(CoordinatorGpuMemoryTest, AttemptsOnTheLargerGpuCountAgainstMaxAttempts) {
  auto coordinator = CoordinatorUnderTest::Start();
  auto small = GpuWorker(*coordinator, "node-h100", 1, 80);
  auto large = GpuWorker(*coordinator, "node-h200", 1, 141);
  absl::StatusOr<v1::Job> job = coordinator->Submit(CudaSpec(1, /*max_attempts=*/2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(small->NextAssignment().has_value());
  ASSERT_TRUE(
      small->ReportRank(job->id(), 1, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall).ok());
  ASSERT_TRUE(large->NextAssignment().has_value());
  ASSERT_TRUE(large->ReportRank(job->id(), 2, 0, v1::RANK_STATE_FAILED, 1).ok());
  std::optional<v1::Assignment> third = large->NextAssignment();
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(third->attempt(), 3);  // the larger GPU again: the size stays learned
  EXPECT_TRUE(RetryingSays(coordinator->Events(job->id()),
                           "attempt 2 (1 of 2 counted) failed; queued for attempt 3"));
  ASSERT_TRUE(large->ReportRank(job->id(), 3, 0, v1::RANK_STATE_FAILED, 1).ok());
  v1::Job failed = coordinator->WaitForState(job->id(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr("attempt 3 (2 of 2 counted) failed"));
  EXPECT_EQ(failed.uncounted_attempts(), 1);
}

// A larger worker that is away for now (LOST) still counts: the job waits for it, then runs there.
TEST(CoordinatorGpuMemoryTest, ALostLargerWorkerIsWaitedFor) {
  auto coordinator = CoordinatorUnderTest::Start();
  auto large = GpuWorker(*coordinator, "node-h200", 1, 141);
  large->Disconnect();
  ASSERT_TRUE(coordinator->WaitForWorkerState("node-h200", v1::WORKER_STATE_LOST));
  auto small = GpuWorker(*coordinator, "node-h100", 1, 80);
  absl::StatusOr<v1::Job> job = coordinator->Submit(OneRankCudaSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(small->NextAssignment().has_value());
  ASSERT_TRUE(
      small->ReportRank(job->id(), 1, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall).ok());
  v1::Job waiting = coordinator->WaitForJob(job->id(), [](const v1::Job& j) {
    return j.state() == v1::JOB_STATE_PENDING && j.needs_device_memory_above_bytes() > 0;
  });
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_PENDING);
  ASSERT_TRUE(large->Connect("boot-1").ok());
  std::optional<v1::Assignment> second = large->NextAssignment(absl::Seconds(15));
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->attempt(), 2);
}

// Larger GPUs too few for the gang on one node: the job fails at once and says so.
TEST(CoordinatorGpuMemoryTest, LargerGpusTooFewForTheGangFailTheJob) {
  auto coordinator = CoordinatorUnderTest::Start();
  auto small = GpuWorker(*coordinator, "node-h100", 2, 80);
  auto large = GpuWorker(*coordinator, "node-h200", 1, 141);
  absl::StatusOr<v1::Job> job = coordinator->Submit(CudaSpec(/*ranks=*/2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(small->NextAssignment().has_value());
  ASSERT_TRUE(
      small->ReportRank(job->id(), 1, 1, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall).ok());
  v1::Job failed = coordinator->WaitForState(job->id(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(),
              HasSubstr("no known cuda worker has 2 GPU(s) with more than 80.0 GiB on one node"));
}

// A 2-rank job on the 80 GiB GPUs whose rank 1 failed first (its NCCL peer gone: "connection
// closed by peer") and was handled as an ordinary failure: rank 0's exit 79, reported after a
// restart of the coordinator, still moves the job to the larger GPUs without spending an attempt.
TEST(CoordinatorGpuMemoryTest, AnOutOfMemoryReportAfterAPeersFailureStillMovesTheJob) {
  auto coordinator = CoordinatorUnderTest::Start();
  auto large = GpuWorker(*coordinator, "node-h200", 2, 141);
  large->Disconnect();
  ASSERT_TRUE(coordinator->WaitForWorkerState("node-h200", v1::WORKER_STATE_LOST));
  auto small = GpuWorker(*coordinator, "node-h100", 2, 80);
  absl::StatusOr<v1::Job> job =
      SubmitRunning(*coordinator, *small, CudaSpec(2, /*max_attempts=*/2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(small->ReportRank(job->id(), 1, 1, v1::RANK_STATE_FAILED, 1).ok());
  v1::Job retried = coordinator->WaitForState(job->id(), v1::JOB_STATE_PENDING);
  ASSERT_EQ(retried.state(), v1::JOB_STATE_PENDING) << retried.message();
  EXPECT_EQ(retried.uncounted_attempts(), 0);

  // Rank 0's end comes after a restart; its worker's Hello lists it as still running.
  small->Disconnect();
  coordinator->KillAndRestart();
  ASSERT_TRUE(RegisterAgain(*small, "boot-1").ok());
  ASSERT_TRUE(small->Connect("boot-1").ok());
  ASSERT_TRUE(
      small->ReportRank(job->id(), 1, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall).ok());
  v1::Job moved = coordinator->WaitForJob(
      job->id(), [](const v1::Job& j) { return j.needs_device_memory_above_bytes() > 0; });
  EXPECT_EQ(moved.state(), v1::JOB_STATE_PENDING) << moved.message();
  EXPECT_EQ(moved.needs_device_memory_above_bytes(), 80 * kGiB);
  EXPECT_EQ(moved.uncounted_attempts(), 1);
  EXPECT_TRUE(RetryingSays(coordinator->Events(job->id()),
                           "attempt 1 ran out of memory on a GPU of 80.0 GiB; queued for attempt 2 "
                           "on GPUs with more memory (not counted against max_attempts)"));

  // The larger worker is back: attempt 2 runs there, and attempt 1 did not count.
  ASSERT_TRUE(RegisterAgain(*large, "boot-1").ok());
  ASSERT_TRUE(large->Connect("boot-1").ok());
  std::optional<v1::Assignment> second = large->NextAssignment(absl::Seconds(15));
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->attempt(), 2);
  ASSERT_TRUE(large->ReportRank(job->id(), 2, 1, v1::RANK_STATE_FAILED, 1).ok());
  v1::Job third = coordinator->WaitForJob(job->id(), [](const v1::Job& j) {
    return absl::StartsWith(j.message(), "attempt 2 failed");
  });
  EXPECT_EQ(third.state(), v1::JOB_STATE_PENDING) << third.message();
  EXPECT_TRUE(RetryingSays(coordinator->Events(job->id()),
                           "attempt 2 (1 of 2 counted) failed; queued for attempt 3"));
}

// The same without a larger GPU anywhere: the job fails with the reason, as if rank 0's exit 79
// had come first, instead of running again on the GPUs it does not fit.
TEST(CoordinatorGpuMemoryTest, AnOutOfMemoryReportAfterAPeersFailureFailsTheJobWithTheReason) {
  auto coordinator = CoordinatorUnderTest::Start();
  auto small = GpuWorker(*coordinator, "node-h100", 2, 80);
  absl::StatusOr<v1::Job> job =
      SubmitRunning(*coordinator, *small, CudaSpec(2, /*max_attempts=*/3));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(small->ReportRank(job->id(), 1, 1, v1::RANK_STATE_FAILED, 1).ok());
  ASSERT_EQ(coordinator->WaitForState(job->id(), v1::JOB_STATE_PENDING).state(),
            v1::JOB_STATE_PENDING);
  ASSERT_TRUE(
      small->ReportRank(job->id(), 1, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall).ok());
  v1::Job failed = coordinator->WaitForState(job->id(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED) << failed.message();
  EXPECT_THAT(failed.message(),
              HasSubstr("attempt 1 failed: rank 0 on node node-h100 failed with exit code 79: "
                        "simulated failure; not retried: no known cuda worker has 2 GPU(s) with "
                        "more than 80.0 GiB on one node"));
  EXPECT_EQ(failed.attempt(), 1);
  EXPECT_EQ(failed.needs_device_memory_above_bytes(), 80 * kGiB);
}

}  // namespace
}  // namespace dropless::testing
