// Lost-worker expiry through the Coordinator (coordinator_worker_expiry.cc), with a real JobStore
// and no gRPC: a worker LOST for longer than --lost-worker-expiry is forgotten (gone from the list,
// the store and the capacity a job waits for), a PENDING job that waited for the larger GPU only
// it had fails with the reason, its node registers again as a new worker, a worker a rank of an
// active attempt is placed on is kept, and a restart neither brings a forgotten worker back nor
// forgets the workers that were READY when it stopped. "Now" is the test's: ForgetLostWorkers
// takes it.
#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/job_error.h"
#include "coordinator/controller/coordinator.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "coordinator/util/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kMinuteMs = 60'000;

std::string TempDbPath() {
  std::string dir = ::testing::TempDir();
  std::string pattern = absl::StrCat(dir, dir.empty() || dir.back() != '/' ? "/" : "",
                                     "coordinator_worker_expiry_test_XXXXXX");
  EXPECT_NE(mkdtemp(pattern.data()), nullptr);
  return pattern + "/dropless.db";
}

std::string Spec(const std::string& backend, int ranks) {
  return absl::StrFormat(R"yaml(name: tiny
model: {hidden: 64, ffn: 128, experts: 8, topk: 2, shared_experts: 0, layers: 1, router: softmax, renormalize: true, activation: swiglu}
parallel: {ep: %d, dp: 1}
precision: bf16
tokens_per_rank: 64
steps: 5
resources: {backend: %s}
)yaml",
                         ranks, backend);
}

class CoordinatorWorkerExpiryTest : public ::testing::Test {
 protected:
  void Open(absl::Duration expiry, const std::string& path) {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    CoordinatorOptions options;
    options.lost_worker_expiry = expiry;
    absl::StatusOr<std::unique_ptr<Coordinator>> created =
        Coordinator::Create(*std::move(store), options, &metrics_);
    ASSERT_TRUE(created.ok()) << created.status();
    coordinator_ = *std::move(created);
  }

  // Registers the node (cuda slots of `gib` GiB each, or cpu slots when gib is 0) and says hello
  // on a new session; the session, with the worker's id in *id.
  std::shared_ptr<WorkerSession> Join(const std::string& node, int slots, int64_t gib,
                                      std::string* id) {
    v1::RegisterWorkerRequest request;
    request.set_node(node);
    request.set_slot_kind(gib > 0 ? "cuda" : "cpu");
    for (int i = 0; i < slots; ++i) {
      request.add_devices(gib > 0 ? "gpu" : "cpu");
      if (gib > 0) request.add_device_memory_bytes(gib * kGiB);
    }
    absl::StatusOr<v1::RegisterWorkerResponse> registered = coordinator_->RegisterWorker(request);
    EXPECT_TRUE(registered.ok()) << registered.status();
    if (!registered.ok()) return nullptr;
    *id = registered->worker_id();
    auto session = std::make_shared<WorkerSession>("peer", nullptr);
    coordinator_->AddSession(session);
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id(*id);
    EXPECT_TRUE(coordinator_->HandleWorkerMessage(session, hello).ok());
    return session;
  }

  void Report(const std::shared_ptr<WorkerSession>& session, const std::string& job_id, int rank,
              v1::RankState state, int exit_code = 0) {
    v1::WorkerMessage message;
    v1::RankStatus* status = message.mutable_rank_status();
    status->set_job_id(job_id);
    status->set_attempt(1);
    status->set_rank(rank);
    status->set_state(state);
    status->set_exit_code(exit_code);
    EXPECT_TRUE(coordinator_->HandleWorkerMessage(session, message).ok());
  }

  std::string Submit(const std::string& spec) {
    v1::SubmitJobRequest request;
    request.set_spec_yaml(spec);
    absl::StatusOr<v1::Job> job = coordinator_->SubmitJob(request);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }

  std::vector<std::string> WorkerIds() {
    std::vector<std::string> ids;
    for (const v1::Worker& w : coordinator_->ListWorkers()) ids.push_back(w.id());
    return ids;
  }

  std::vector<std::string> ClusterEventTypes() {
    absl::StatusOr<std::vector<v1::Event>> events = coordinator_->ListEvents("", 0);
    EXPECT_TRUE(events.ok()) << events.status();
    std::vector<std::string> types;
    for (const v1::Event& event : *events) {
      if (event.job_id().empty()) types.push_back(event.type());
    }
    return types;
  }

  // dropless_coordinator_workers_forgotten_total as /metrics reads now; -1 when absent.
  int64_t Forgotten() {
    const std::string series = "dropless_coordinator_workers_forgotten_total ";
    const std::string text = metrics_.collectable()->Serialize();
    const size_t at = text.find("\n" + series);
    return at == std::string::npos ? -1 : std::stoll(text.substr(at + 1 + series.size()));
  }

  CoordinatorMetrics metrics_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(CoordinatorWorkerExpiryTest, ALostWorkerIsForgottenAndTheJobWaitingForItsGpuFails) {
  const std::string path = TempDbPath();
  ASSERT_NO_FATAL_FAILURE(Open(absl::Minutes(1), path));
  std::string big, small;
  std::shared_ptr<WorkerSession> big_session = Join("node-big", 1, 141, &big);
  coordinator_->RemoveSession(big_session);  // LOST: away from now on
  std::shared_ptr<WorkerSession> small_session = Join("node-small", 1, 80, &small);
  ASSERT_NE(small_session, nullptr);

  // Out of memory on the 80 GiB GPU: PENDING for a larger one, which only the lost worker has.
  const std::string job = Submit(Spec("cuda", 1));
  Report(small_session, job, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall);
  absl::StatusOr<v1::Job> waiting = coordinator_->GetJob(job);
  ASSERT_TRUE(waiting.ok());
  ASSERT_EQ(waiting->state(), v1::JOB_STATE_PENDING) << waiting->message();
  EXPECT_EQ(waiting->needs_device_memory_above_bytes(), 80 * kGiB);

  EXPECT_EQ(coordinator_->ForgetLostWorkers(NowMs()), 0) << "away for less than the expiry";
  EXPECT_EQ(Forgotten(), 0);
  EXPECT_EQ(coordinator_->ForgetLostWorkers(NowMs() + 2 * kMinuteMs), 1);
  EXPECT_EQ(Forgotten(), 1);
  EXPECT_THAT(WorkerIds(), ElementsAre(small));
  EXPECT_THAT(ClusterEventTypes(), Contains("WorkerForgotten"));
  absl::StatusOr<v1::Job> failed = coordinator_->GetJob(job);
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  // FailAttemptOnTooSmallDevice's words, as if the worker had been gone when the rank failed.
  EXPECT_EQ(failed->message(),
            "attempt 1 failed: rank 0 on node node-small failed with exit code 79; not retried: "
            "no known cuda worker has 1 GPU(s) with more than 80.0 GiB on one node (submit it "
            "again once one has joined)");
  EXPECT_EQ(coordinator_->ForgetLostWorkers(NowMs() + 2 * kMinuteMs), 0) << "once";

  // Its node comes back: registered as a new worker, READY, and given work.
  std::string back;
  std::shared_ptr<WorkerSession> back_session = Join("node-big", 1, 141, &back);
  ASSERT_NE(back_session, nullptr);
  EXPECT_NE(back, big);
  EXPECT_EQ(back, "worker-0003");
  std::vector<v1::Worker> workers = coordinator_->ListWorkers();
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[1].state(), v1::WORKER_STATE_READY);
  const std::string next = Submit(Spec("cuda", 1));
  Report(small_session, next, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall);
  absl::StatusOr<v1::Job> moved = coordinator_->GetJob(next);
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ(moved->attempt(), 2) << moved->message();
  ASSERT_EQ(moved->placement_size(), 1);
  EXPECT_EQ(moved->placement(0).worker_id(), back);

  // Restarted: the forgotten worker stays forgotten, its id is not given again, and the workers
  // that were READY when it stopped are away from the restart, not from before it.
  coordinator_.reset();
  ASSERT_NO_FATAL_FAILURE(Open(absl::Minutes(1), path));
  EXPECT_THAT(WorkerIds(), ElementsAre(small, back));
  EXPECT_EQ(coordinator_->ForgetLostWorkers(NowMs() + 50'000), 0);
  std::string other;
  ASSERT_NE(Join("node-other", 1, 0, &other), nullptr);
  EXPECT_EQ(other, "worker-0004");
}

TEST_F(CoordinatorWorkerExpiryTest, AWorkerOfAnActiveAttemptIsKeptUntilTheAttemptEnds) {
  ASSERT_NO_FATAL_FAILURE(Open(absl::Minutes(1), TempDbPath()));
  std::string a, b;
  std::shared_ptr<WorkerSession> session_a = Join("node-a", 1, 0, &a);
  std::shared_ptr<WorkerSession> session_b = Join("node-b", 1, 0, &b);
  const std::string job = Submit(Spec("cpu", 2));
  absl::StatusOr<v1::Job> placed = coordinator_->GetJob(job);
  ASSERT_TRUE(placed.ok());
  ASSERT_EQ(placed->placement_size(), 2);
  const bool a_first = placed->placement(0).worker_id() == a;
  const int rank_a = a_first ? 0 : 1;
  const int rank_b = 1 - rank_a;
  Report(session_a, job, rank_a, v1::RANK_STATE_RUNNING);
  Report(session_b, job, rank_b, v1::RANK_STATE_RUNNING);
  // a's rank ended (its slot is free) and a went away; b's rank runs on: a is still placed in
  // the active attempt.
  Report(session_a, job, rank_a, v1::RANK_STATE_SUCCEEDED);
  coordinator_->RemoveSession(session_a);
  EXPECT_EQ(coordinator_->ForgetLostWorkers(NowMs() + 10 * kMinuteMs), 0);
  EXPECT_THAT(WorkerIds(), ElementsAre(a, b));
  Report(session_b, job, rank_b, v1::RANK_STATE_SUCCEEDED);
  ASSERT_EQ(coordinator_->GetJob(job)->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(coordinator_->ForgetLostWorkers(NowMs() + 10 * kMinuteMs), 1);
  EXPECT_THAT(WorkerIds(), ElementsAre(b));
}

TEST_F(CoordinatorWorkerExpiryTest, ZeroExpiryKeepsLostWorkersForGood) {
  ASSERT_NO_FATAL_FAILURE(Open(absl::ZeroDuration(), TempDbPath()));
  std::string a;
  coordinator_->RemoveSession(Join("node-a", 1, 0, &a));
  EXPECT_EQ(coordinator_->ForgetLostWorkers(NowMs() + 36500LL * 24 * 60 * kMinuteMs), 0);
  EXPECT_THAT(WorkerIds(), ElementsAre(a));
  EXPECT_EQ(Forgotten(), 0);
}

}  // namespace
}  // namespace dropless::coordinator
