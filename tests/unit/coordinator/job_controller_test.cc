// The job state machine on its own: a real JobStore in a temporary SQLite file, a WorkerRegistry
// with one READY worker, no gRPC. Placement, the write path (stored before the worker hears),
// retries per max_attempts, retirement.
#include "coordinator/controller/job_controller.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/controller/job_events.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

using ::testing::HasSubstr;

std::string TempDbPath() {
  std::string dir = ::testing::TempDir();
  std::string pattern = absl::StrCat(dir, dir.empty() || dir.back() != '/' ? "/" : "",
                                     "job_controller_test_XXXXXX");
  EXPECT_NE(mkdtemp(pattern.data()), nullptr);
  return pattern + "/dropless.db";
}

class JobControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<JobStore>> opened = JobStore::Open(TempDbPath());
    ASSERT_TRUE(opened.ok()) << opened.status();
    store_ = *std::move(opened);
    controller_ = std::make_unique<JobController>(*store_, registry_, hub_, rendezvous_, &metrics_);
    // One READY worker with two CPU slots.
    v1::RegisterWorkerRequest request;
    request.set_node("node-a");
    request.set_slot_kind("cpu");
    request.add_devices("cpu");
    request.add_devices("cpu");
    StoreWrite write;
    bool fresh = false;
    absl::StatusOr<const v1::Worker*> registered = registry_.Register(request, 0, write, &fresh);
    ASSERT_TRUE(registered.ok()) << registered.status();
    worker_id_ = (*registered)->id();
    session_ = std::make_shared<WorkerSession>("peer", nullptr);
    registry_.OpenSession(session_, 0);
    v1::Hello hello;
    hello.set_worker_id(worker_id_);
    ASSERT_TRUE(registry_.Hello(session_, hello, 0, write).ok());
    ASSERT_TRUE(controller_->Commit(write).ok());
  }

  // A pending job of two ranks that may run `max_attempts` times.
  std::string AddJob(int32_t max_attempts) {
    ActiveJob job;
    job.record.job.set_id(store_->NextJobId(&job.record.seq));
    job.record.job.set_name("tiny");
    job.record.job.set_state(v1::JOB_STATE_PENDING);
    job.record.job.set_world_size(2);
    job.record.job.set_backend("cpu");
    job.record.job.set_spec_yaml("name: tiny\n");
    job.record.max_attempts = max_attempts;
    const std::string id = job.record.job.id();
    controller_->MarkDirty(controller_->jobs()[id] = std::move(job));
    StoreWrite write;
    EXPECT_TRUE(controller_->Commit(write).ok());
    return id;
  }

  // The message the worker's session got next; fails the test when there is none.
  v1::CoordinatorMessage Sent() {
    v1::CoordinatorMessage message;
    EXPECT_EQ(session_->outbox().Pop(absl::ZeroDuration(), &message),
              Mailbox<v1::CoordinatorMessage>::Result::kItem);
    return message;
  }

  std::vector<std::string> EventTypes(const std::string& id) {
    absl::StatusOr<std::vector<v1::Event>> events = store_->ListEvents(id, 0);
    EXPECT_TRUE(events.ok()) << events.status();
    std::vector<std::string> types;
    for (const v1::Event& e : *events) types.push_back(e.type());
    return types;
  }

  // A counter of /metrics as it reads now (sync: "full" or "normal" for the commits, "" for the
  // failures); 0 when absent.
  int64_t Counted(const std::string& sync) {
    const std::string series =
        sync.empty()
            ? "dropless_coordinator_store_commit_failures_total "
            : absl::StrCat("dropless_coordinator_store_commits_total{sync=\"", sync, "\"} ");
    const std::string text = metrics_.collectable()->Serialize();
    const size_t at = text.find("\n" + series);
    return at == std::string::npos ? 0 : std::stoll(text.substr(at + 1 + series.size()));
  }

  // Every write to a file of this process fails (as on a full disk) while it lives.
  class FullDisk {
   public:
    FullDisk() {
      signal(SIGXFSZ, SIG_IGN);
      EXPECT_EQ(getrlimit(RLIMIT_FSIZE, &saved_), 0);
      rlimit none = saved_;
      none.rlim_cur = 0;
      EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &none), 0);
    }
    ~FullDisk() { EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &saved_), 0); }

   private:
    rlimit saved_{};
  };

  CoordinatorMetrics metrics_;
  std::unique_ptr<JobStore> store_;
  WorkerRegistry registry_{10'000};
  WatchHub hub_{16, 16};
  RendezvousStore rendezvous_;
  std::unique_ptr<JobController> controller_;
  std::string worker_id_;
  std::shared_ptr<WorkerSession> session_;
};

TEST_F(JobControllerTest, PlacesOntoFreeSlotsAndTellsTheWorkerOnceStored) {
  const std::string id = AddJob(1);
  controller_->Schedule();
  ActiveJob* job = controller_->Find(id);
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(job->record.job.state(), v1::JOB_STATE_SCHEDULED);
  ASSERT_TRUE(job->attempt.has_value());
  EXPECT_EQ(job->attempt->attempt, 1);
  EXPECT_EQ(job->record.job.placement_size(), 2);
  EXPECT_EQ(controller_->FindActiveAttempt(id, 1), job);
  EXPECT_EQ(controller_->FindActiveAttempt(id, 2), nullptr);
  // Stored, and the assignment sent, and both slots taken.
  EXPECT_EQ(store_->GetJob(id)->state(), v1::JOB_STATE_SCHEDULED);
  v1::CoordinatorMessage assignment = Sent();
  ASSERT_TRUE(assignment.has_assignment());
  EXPECT_EQ(assignment.assignment().job_id(), id);
  EXPECT_EQ(assignment.assignment().ranks_size(), 2);
  EXPECT_FALSE(assignment.assignment().rendezvous_secret().empty());
  EXPECT_TRUE(registry_.Capacity(0)[0].free_slots.empty());
  EXPECT_TRUE(controller_->CheckJobRank(id, 1).ok());
  EXPECT_THAT(controller_->CheckJobRank(id, 2).message(), HasSubstr("has ranks 0..1 (got 2)"));
  EXPECT_EQ(controller_->CheckJobRank("job-999999", std::nullopt).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(JobControllerTest, FailedAttemptsRetryUntilMaxAttemptsThenTheJobFails) {
  const std::string id = AddJob(2);
  controller_->Schedule();
  ASSERT_TRUE(Sent().has_assignment());
  StoreWrite write;
  controller_->FailAttempt(*controller_->Find(id), "rank 0 exited", write);
  ASSERT_TRUE(controller_->Commit(write).ok());
  EXPECT_EQ(controller_->Find(id)->record.job.state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(controller_->Find(id)->record.job.message(), HasSubstr("attempt 1 failed"));
  EXPECT_TRUE(Sent().has_cancellation());

  // The old ranks still hold their slots until they are reported gone: the job waits.
  controller_->Schedule();
  EXPECT_EQ(controller_->Find(id)->record.job.state(), v1::JOB_STATE_PENDING);
  registry_.Find(worker_id_)->occupied.clear();
  controller_->Schedule();
  EXPECT_EQ(controller_->Find(id)->record.job.attempt(), 2);
  ASSERT_TRUE(Sent().has_assignment());

  StoreWrite last;
  controller_->FailAttemptsOnWorker(*registry_.Find(worker_id_), "worker lost", last);
  ASSERT_TRUE(controller_->Commit(last).ok());
  EXPECT_EQ(controller_->Find(id)->record.job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(controller_->Find(id)->record.job.message(),
              HasSubstr("attempt 2 of 2 failed: worker lost"));
  controller_->RetireFinished();
  EXPECT_EQ(controller_->Find(id), nullptr);
  EXPECT_EQ(store_->GetJob(id)->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(EventTypes(id), ::testing::IsSupersetOf({"Scheduled", "AttemptFailed", "Retrying",
                                                       "Waiting", "Failed"}));
}

TEST_F(JobControllerTest, StopJobCancelsTheRanksAndEndsTheJob) {
  const std::string id = AddJob(3);
  controller_->Schedule();
  ASSERT_TRUE(Sent().has_assignment());
  StoreWrite write;
  controller_->StopJob(*controller_->Find(id), v1::JOB_STATE_CANCELLED, "cancelled by user",
                       write);
  ASSERT_TRUE(controller_->Commit(write).ok());
  EXPECT_EQ(controller_->Find(id)->record.job.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_FALSE(controller_->Find(id)->attempt.has_value());
  v1::CoordinatorMessage cancellation = Sent();
  ASSERT_TRUE(cancellation.has_cancellation());
  EXPECT_EQ(cancellation.cancellation().reason(), "cancelled by user");
  EXPECT_EQ(controller_->FindActiveAttempt(id, 1), nullptr);
}

// A job's state is stored with fsync whoever commits it: a caller that asks for none (a session
// that ended, a scheduling pass without placements) commits a dirty job durably, for a queued
// RankStatus whose own commit failed is acknowledged once its job is not dirty any more.
TEST_F(JobControllerTest, ACommitCarryingAJobsStateIsFsynced) {
  const std::string id = AddJob(1);
  const int64_t full = Counted("full");
  const int64_t normal = Counted("normal");
  controller_->MarkDirty(*controller_->Find(id));
  StoreWrite write;
  write.durable = false;
  AddEvent(write, "", 0, "WorkerDisconnected", "a worker row's change needs no fsync");
  ASSERT_TRUE(controller_->Commit(write).ok());
  EXPECT_EQ(Counted("full"), full + 1);
  EXPECT_EQ(Counted("normal"), normal);
}

// A long outage: every failed commit brings the same worker's row again (it reconnects every few
// seconds) and an event. What is kept holds that worker's latest row once and every event, and
// the ticker's retries back off instead of committing all of it every tick.
TEST_F(JobControllerTest, WhatFailedCommitsKeepIsBoundedAndRetriedWithBackoff) {
  WorkerRecord row{registry_.Find(worker_id_)->info, 0};
  {
    FullDisk full;
    auto commit_round = [&](int i) {
      StoreWrite write;
      row.info.set_state(i % 2 == 0 ? v1::WORKER_STATE_LOST : v1::WORKER_STATE_READY);
      write.workers.push_back(row);
      AddEvent(write, "", 0, i % 2 == 0 ? "WorkerLost" : "WorkerReady", absl::StrCat(i));
      return controller_->Commit(write);
    };
    ASSERT_FALSE(commit_round(0).ok());
    const int64_t failures = Counted("");
    for (int i = 0; i < 20; ++i) controller_->StoreUnstored();
    EXPECT_EQ(Counted(""), failures) << "the ticker retried at once after a failure";
    absl::SleepFor(absl::Milliseconds(150));
    controller_->StoreUnstored();
    EXPECT_EQ(Counted(""), failures + 1) << "the retry 100 ms after the first failure";
    for (int i = 0; i < 20; ++i) controller_->StoreUnstored();
    EXPECT_EQ(Counted(""), failures + 1) << "retried again before 200 ms";
    for (int i = 1; i < 50; ++i) ASSERT_FALSE(commit_round(i).ok());
  }
  StoreWrite write;
  ASSERT_TRUE(controller_->Commit(write).ok());
  ASSERT_EQ(write.workers.size(), 1u) << "one row per worker, not one per failed commit";
  EXPECT_EQ(write.workers[0].info.state(), v1::WORKER_STATE_READY) << "its latest";
  EXPECT_EQ(write.events.size(), 50u);
  absl::StatusOr<std::vector<v1::Event>> stored = store_->ListEvents("", 100);
  ASSERT_TRUE(stored.ok()) << stored.status();
  int lost = 0;
  for (const v1::Event& e : *stored) lost += e.type() == "WorkerLost";
  EXPECT_EQ(lost, 25);
}

}  // namespace
}  // namespace dropless::coordinator
