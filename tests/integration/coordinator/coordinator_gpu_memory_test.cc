// Mixed GPU fleets: a cuda job whose rank ran out of memory on a GPU of one size
// (kRankExitDeviceTooSmall) runs next on a larger GPU, without spending an attempt, or fails with
// the reason when no READY worker has one. The real coordinator over loopback, fake workers.
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

// A one-rank job on the cuda backend.
std::string OneRankCudaSpec() {
  return R"yaml(name: gpu-memory
max_attempts: 1
model: {hidden: 64, ffn: 128, experts: 8, topk: 2, shared_experts: 0, layers: 1, router: softmax, renormalize: true, activation: swiglu}
parallel: {ep: 1, dp: 1}
precision: bf16
tokens_per_rank: 64
steps: 5
data: {distribution: uniform, seed: 7}
resources: {backend: cuda}
)yaml";
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
              HasSubstr("no READY cuda worker has a GPU with more than 80.0 GiB"));
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

}  // namespace
}  // namespace dropless::testing
