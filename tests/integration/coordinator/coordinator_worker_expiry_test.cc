// Lost-worker expiry on the real coordinator (--lost-worker-expiry, default 24h): a worker LOST
// for longer is forgotten, gone from ListWorkers and from the store (a restart does not bring it
// back), counted on /metrics, and the PENDING job that waited for the larger GPU only it had
// fails with the reason; its node comes back as a new worker and gets work. The worker's
// absence is moved 25 hours back in the killed coordinator's database file, as the retention
// test moves a job's end, so that the test need not wait out an expiry (at least 1m); that also
// shows the away time surviving a restart. An expiry under a minute is refused; 0 keeps lost
// workers for good. A node back under a new id still delivers its ranks' last lines.
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job_error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"

namespace dropless::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

std::string CudaSpec() {
  return R"yaml(name: gpu-memory
model: {hidden: 64, ffn: 128, experts: 8, topk: 2, shared_experts: 0, layers: 1, router: softmax, renormalize: true, activation: swiglu}
parallel: {ep: 1, dp: 1}
precision: bf16
tokens_per_rank: 64
steps: 5
data: {distribution: uniform, seed: 7}
resources: {backend: cuda}
)yaml";
}

std::unique_ptr<FakeWorker> GpuWorker(CoordinatorUnderTest& c, const std::string& node,
                                      int64_t gib) {
  auto w = std::make_unique<FakeWorker>(c.channel(), node, 1, "cuda");
  w->SetGpuMemoryBytes(gib * kGiB);
  EXPECT_TRUE(w->Join().ok());
  return w;
}

std::vector<std::string> Nodes(CoordinatorUnderTest& c) {
  std::vector<std::string> nodes;
  for (const v1::Worker& w : c.Workers()) nodes.push_back(w.node());
  return nodes;
}

// After a restart the first calls on a channel may still fail (a connection to the killed process,
// or the channel backing off from it): calls until the API answers.
void WaitForApi(CoordinatorUnderTest& c) {
  for (int i = 0; i < 100; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListWorkersResponse response;
    if (c.jobs().ListWorkers(&context, v1::ListWorkersRequest(), &response).ok()) return;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ADD_FAILURE() << "the restarted coordinator does not answer";
}

// The SQL that moves the node's absence `hours` back in the stopped coordinator's file.
std::string AwayHoursEarlier(const std::string& node, int hours) {
  return absl::StrFormat(
      "UPDATE workers SET lost_since_ms = lost_since_ms - %d WHERE node = '%s' AND "
      "lost_since_ms > 0",
      absl::ToInt64Milliseconds(absl::Hours(hours)), node);
}

TEST(CoordinatorWorkerExpiryTest, ALostWorkerIsForgottenAndTheJobWaitingForItsGpuFails) {
  auto c = CoordinatorUnderTest::Start();
  auto big = GpuWorker(*c, "node-big", 141);
  auto small = GpuWorker(*c, "node-small", 80);
  const std::string big_id = big->id();
  big->Disconnect();
  ASSERT_TRUE(c->WaitForWorkerState("node-big", v1::WORKER_STATE_LOST));

  // Out of memory on the 80 GiB GPU: PENDING for a larger one, which only the lost worker has.
  absl::StatusOr<v1::Job> job = c->Submit(CudaSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(small->NextAssignment().has_value());
  ASSERT_TRUE(
      small->ReportRank(job->id(), 1, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall).ok());
  v1::Job waiting = c->WaitForJob(job->id(), [](const v1::Job& j) {
    return j.state() == v1::JOB_STATE_PENDING && j.needs_device_memory_above_bytes() > 0;
  });
  ASSERT_EQ(waiting.state(), v1::JOB_STATE_PENDING) << waiting.message();
  EXPECT_EQ(WorkersForgotten(*c), 0);

  // The node died for good 25 hours ago, as the file now says; the coordinator restarts with the
  // default expiry (24h). node-small, READY when it was killed, is away from the restart only.
  ASSERT_NO_FATAL_FAILURE(c->Kill());
  ASSERT_TRUE(ExecStoreSql(c->db(), AwayHoursEarlier("node-big", 25)).ok());
  ASSERT_NO_FATAL_FAILURE(c->Restart());
  WaitForApi(*c);
  ASSERT_TRUE(RegisterAgain(*small, "boot-1").ok());
  ASSERT_TRUE(small->Connect("boot-1").ok());

  // Forgotten once its lease, counted from the restart, ran out: the job fails and says why.
  v1::Job failed = c->WaitForState(job->id(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr("attempt 1 failed: rank 0 on node node-small failed "
                                          "with exit code 79"));
  EXPECT_THAT(failed.message(),
              HasSubstr("; not retried: no known cuda worker has 1 GPU(s) with more than 80.0 GiB "
                        "on one node (submit it again once one has joined)"));
  EXPECT_THAT(Nodes(*c), ElementsAre("node-small"));
  EXPECT_TRUE(HasEvent(*c, "", "WorkerForgotten"));
  EXPECT_EQ(WorkersForgotten(*c), 1);

  // Gone from the store too: a restart does not bring it back.
  ASSERT_NO_FATAL_FAILURE(c->KillAndRestart());
  WaitForApi(*c);
  EXPECT_THAT(Nodes(*c), ElementsAre("node-small"));
  ASSERT_TRUE(RegisterAgain(*small, "boot-1").ok());
  ASSERT_TRUE(small->Connect("boot-1").ok());

  // The node comes back: a new worker (a new id), READY, and given work.
  ASSERT_TRUE(RegisterAgain(*big, "boot-2").ok());
  ASSERT_TRUE(big->Connect("boot-2").ok());
  EXPECT_NE(big->id(), big_id);
  ASSERT_TRUE(c->WaitForWorkerState("node-big", v1::WORKER_STATE_READY));
  absl::StatusOr<v1::Job> first = c->Submit(CudaSpec());  // takes one of the two GPUs
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<v1::Job> second = c->Submit(CudaSpec());  // and this the other
  ASSERT_TRUE(second.ok()) << second.status();
  std::optional<v1::Assignment> assigned = big->NextAssignment();
  ASSERT_TRUE(assigned.has_value());
  EXPECT_TRUE(assigned->job_id() == first->id() || assigned->job_id() == second->id());
}

// A node cut off for longer than the expiry, its rank still writing, is forgotten; back under a
// new id it resends its ranks' last lines (often why they ended), which the coordinator matches
// to the stored placement by node and keeps.
TEST(CoordinatorWorkerExpiryTest, ANodeBackUnderANewIdDeliversItsRanksLastLines) {
  auto c = CoordinatorUnderTest::Start();
  auto node = GpuWorker(*c, "node-a", 80);
  const std::string old_id = node->id();
  absl::StatusOr<v1::Job> job = c->Submit(CudaSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(node->NextAssignment().has_value());
  ASSERT_TRUE(node->ReportRank(job->id(), 1, 0, v1::RANK_STATE_RUNNING).ok());
  node->Disconnect();
  // Its lease runs out: attempt 1 fails (the job waits for another attempt, or has used them).
  v1::Job ended = c->WaitForJob(job->id(), [](const v1::Job& j) {
    return j.state() == v1::JOB_STATE_PENDING || j.state() == v1::JOB_STATE_FAILED;
  });
  ASSERT_TRUE(ended.state() == v1::JOB_STATE_PENDING || ended.state() == v1::JOB_STATE_FAILED)
      << ended.message();

  ASSERT_NO_FATAL_FAILURE(c->Kill());
  ASSERT_TRUE(ExecStoreSql(c->db(), AwayHoursEarlier("node-a", 25)).ok());
  ASSERT_NO_FATAL_FAILURE(c->Restart());
  WaitForApi(*c);
  for (int i = 0; i < 100 && WorkersForgotten(*c) == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(WorkersForgotten(*c), 1);

  ASSERT_TRUE(RegisterAgain(*node, "boot-2").ok());
  ASSERT_TRUE(node->Connect("boot-2").ok());
  EXPECT_NE(node->id(), old_id);
  const std::string last = "rank 0: CUDA error: an illegal memory access was encountered";
  ASSERT_TRUE(node->ReportLog(job->id(), 1, 0, last).ok());
  bool found = false;
  for (int i = 0; i < 50 && !found; ++i) {
    grpc::ClientContext context;
    v1::GetLogsRequest request;
    request.set_job_id(job->id());
    auto reader = c->jobs().GetLogs(&context, request);
    v1::LogLine line;
    while (reader->Read(&line)) found |= line.attempt() == 1 && line.text() == last;
    EXPECT_TRUE(reader->Finish().ok());
    if (!found) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(found) << "the line of attempt 1 sent after the node came back was not kept";
}

TEST(CoordinatorWorkerExpiryTest, ZeroKeepsLostWorkersForGood) {
  auto c = CoordinatorUnderTest::Start("", kLeaseMs, {"--lost-worker-expiry=0"});
  auto big = GpuWorker(*c, "node-big", 141);
  big->Disconnect();
  ASSERT_TRUE(c->WaitForWorkerState("node-big", v1::WORKER_STATE_LOST));
  ASSERT_NO_FATAL_FAILURE(c->Kill());
  ASSERT_TRUE(ExecStoreSql(c->db(), AwayHoursEarlier("node-big", 24 * 400)).ok());
  ASSERT_NO_FATAL_FAILURE(c->Restart());
  WaitForApi(*c);
  absl::SleepFor(absl::Milliseconds(3 * kLeaseMs));  // past the lease, then some ticks
  EXPECT_THAT(Nodes(*c), ElementsAre("node-big"));
  EXPECT_EQ(WorkersForgotten(*c), 0);
  EXPECT_THAT(c->process().Output(), HasSubstr("lost-worker expiry off"));
}

// Under a minute, a network blip or a coordinator restart could make a live worker a new one.
TEST(CoordinatorWorkerExpiryTest, ExpiryUnderAMinuteIsRefusedNamingTheFlag) {
  for (const char* expiry : {"30s", "-5m"}) {
    absl::StatusOr<std::unique_ptr<Process>> process =
        Process::Start({BinaryPath("dropless-coordinator"), "--insecure", "--listen=127.0.0.1:0",
                        absl::StrCat("--db=", MakeTempDir(), "/c.db"), "--metrics-port=0",
                        absl::StrCat("--lost-worker-expiry=", expiry)});
    ASSERT_TRUE(process.ok()) << process.status();
    absl::StatusOr<int> code = (*process)->Wait(absl::Seconds(20));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 2) << expiry;
    EXPECT_THAT((*process)->Output(),
                HasSubstr(absl::StrCat("lost_worker_expiry (--lost-worker-expiry): 0 (lost "
                                       "workers kept for good) or at least 1m (got ",
                                       expiry, ")")));
  }
}

}  // namespace
}  // namespace dropless::testing
