// The hang watchdog through the Coordinator with a real JobStore and no gRPC: the phase a worker
// reports in a heartbeat is its text, and reaches the RankStuck event, the job's message and the
// log only as valid UTF-8 without control characters (no terminal escape, no forged line).
#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "coordinator/controller/coordinator.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

using ::testing::HasSubstr;

std::string TempDbPath() {
  std::string dir = ::testing::TempDir();
  std::string pattern = absl::StrCat(dir, dir.empty() || dir.back() != '/' ? "/" : "",
                                     "coordinator_hang_watchdog_test_XXXXXX");
  EXPECT_NE(mkdtemp(pattern.data()), nullptr);
  return pattern + "/dropless.db";
}

constexpr char kOneRankSpec[] = R"yaml(name: tiny
max_attempts: 1
model: {hidden: 64, ffn: 128, experts: 8, topk: 2, shared_experts: 0, layers: 1, router: softmax, renormalize: true, activation: swiglu}
parallel: {ep: 1, dp: 1}
precision: bf16
tokens_per_rank: 64
steps: 5
resources: {backend: cuda}
)yaml";

TEST(CoordinatorHangWatchdogTest, ThePhaseReachesTheEventAndMessageWithoutControlCharacters) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(TempDbPath());
  ASSERT_TRUE(store.ok()) << store.status();
  CoordinatorOptions options;
  options.hang.first_step_ms = 1000;  // no step time yet: this is the limit
  options.hang.min_stall_ms = 1000;
  CoordinatorMetrics metrics;
  absl::StatusOr<std::unique_ptr<Coordinator>> created =
      Coordinator::Create(*std::move(store), options, &metrics);
  ASSERT_TRUE(created.ok()) << created.status();
  Coordinator& coordinator = **created;

  v1::RegisterWorkerRequest request;
  request.set_node("node-a");
  request.set_slot_kind("cuda");
  request.add_devices("gpu");
  request.add_device_memory_bytes(int64_t{80} << 30);
  absl::StatusOr<v1::RegisterWorkerResponse> registered = coordinator.RegisterWorker(request);
  ASSERT_TRUE(registered.ok()) << registered.status();
  auto session = std::make_shared<WorkerSession>("peer", nullptr);
  coordinator.AddSession(session);
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id(registered->worker_id());
  ASSERT_TRUE(coordinator.HandleWorkerMessage(session, hello).ok());

  v1::SubmitJobRequest submit;
  submit.set_spec_yaml(kOneRankSpec);
  absl::StatusOr<v1::Job> job = coordinator.SubmitJob(submit);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SCHEDULED) << job->message();

  // An ANSI escape (red), a forged line, a C1 CSI (U+009B), DEL and a byte that is not UTF-8.
  const std::string phase = "\x1b[31mgemm\nERROR forged\xc2\x9b\x7f\xff";
  v1::WorkerMessage heartbeat;
  heartbeat.mutable_heartbeat()->set_time_ms(10000);
  v1::RankStatus* rank = heartbeat.mutable_heartbeat()->add_ranks();
  rank->set_job_id(job->id());
  rank->set_attempt(1);
  rank->set_rank(0);
  rank->set_state(v1::RANK_STATE_RUNNING);
  rank->set_phase(phase);
  rank->set_phase_since_ms(1000);
  rank->set_step(1);
  ASSERT_TRUE(coordinator.HandleWorkerMessage(session, heartbeat).ok());

  absl::StatusOr<v1::Job> failed = coordinator.GetJob(job->id());
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED) << failed->message();
  EXPECT_THAT(failed->message(), HasSubstr("stuck in ?[31mgemm?ERROR forged"));
  EXPECT_TRUE(IsValidUtf8(failed->message()));
  EXPECT_FALSE(HasControlCharacters(failed->message())) << failed->message();

  absl::StatusOr<std::vector<v1::Event>> events = coordinator.ListEvents(job->id(), 0);
  ASSERT_TRUE(events.ok()) << events.status();
  int stuck = 0;
  for (const v1::Event& e : *events) {
    EXPECT_TRUE(IsValidUtf8(e.message())) << e.type();
    EXPECT_FALSE(HasControlCharacters(e.message())) << e.type() << ": " << e.message();
    if (e.type() != "RankStuck") continue;
    ++stuck;
    EXPECT_THAT(e.message(), HasSubstr("in phase ?[31mgemm?ERROR forged"));
  }
  EXPECT_EQ(stuck, 1);
}

}  // namespace
}  // namespace dropless::coordinator
