// What the real dropless-coordinator tells workers and users follows what its store holds, and
// what that costs: an Assignment goes out only once its placement is stored (a placement whose
// commit fails is undone), a cancel that cannot be stored is an error to its caller though its
// Cancellations stop the ranks, what a failed commit could not store (an ended attempt, events)
// is stored by the next one and reaches watchers once, failed commits are counted
// (dropless_coordinator_store_commit_failures_total), and the rank statuses of one worker message,
// or of several the worker sent back to back, cost one commit with fsync (counted by
// dropless_coordinator_store_commits_total). (Suite CoordinatorStoreCommitTest.)
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"

namespace dropless::testing {
namespace {

grpc::Status Cancel(CoordinatorUnderTest& coordinator, const std::string& id, v1::Job* job) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::CancelJobRequest request;
  request.set_id(id);
  return coordinator.jobs().CancelJob(&context, request, job);
}

// The events a WatchJob stream delivers, read on a thread of its own while the test goes on.
class EventWatcher {
 public:
  EventWatcher(v1::JobService::Stub& stub, const std::string& job_id) {
    v1::WatchJobRequest request;
    request.set_id(job_id);
    reader_ = stub.WatchJob(&context_, request);
    thread_ = std::thread([this] {
      v1::JobUpdate update;
      while (reader_->Read(&update)) {
        absl::MutexLock lock(&mu_);
        ++updates_;
        if (update.has_event()) events_.push_back(update.event());
        if (update.has_metrics()) metrics_steps_.push_back(update.metrics().step());
      }
      (void)reader_->Finish();
    });
  }
  ~EventWatcher() {
    context_.TryCancel();
    thread_.join();
  }
  std::vector<v1::Event> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  // The steps of the step metrics updates it got, in order.
  std::vector<int64_t> metrics_steps() {
    absl::MutexLock lock(&mu_);
    return metrics_steps_;
  }
  // Waits (up to 15 s) for the first update (the job as of subscription); whether it came.
  bool WaitForSnapshot() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(
                                    +[](int* updates) { return *updates > 0; }, &updates_),
                                absl::Seconds(15));
  }
  // Waits (up to 15 s) for an event of `type`; whether it came.
  bool WaitFor(const std::string& type) {
    const absl::Time deadline = absl::Now() + absl::Seconds(15);
    do {
      for (const v1::Event& e : events()) {
        if (e.type() == type) return true;
      }
      absl::SleepFor(absl::Milliseconds(50));
    } while (absl::Now() < deadline);
    return false;
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::JobUpdate>> reader_;
  std::thread thread_;
  absl::Mutex mu_;
  int updates_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::Event> events_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> metrics_steps_ ABSL_GUARDED_BY(mu_);
};

// The types of the events, in their order, that are among `types`.
std::vector<std::string> TypesAmong(const std::vector<v1::Event>& events,
                                    const std::vector<std::string>& types) {
  std::vector<std::string> out;
  for (const v1::Event& e : events) {
    if (std::find(types.begin(), types.end(), e.type()) != types.end()) out.push_back(e.type());
  }
  return out;
}

// A rank fails while the disk is full: the attempt ends in memory (the job queued for attempt 2,
// the other rank cancelled) but the commit fails. Once the disk has room, the next commit stores
// what that one could not: the attempt's final row and its events, which a watcher then gets
// once each, in order, and which survive a kill -9. (Before: only the job's row was stored again;
// the attempt's row said RUNNING and the events were gone.)
TEST(CoordinatorStoreCommitTest, AnAttemptThatEndsWhileTheDiskIsFullIsStoredOnceItHasRoom) {
  signal(SIGXFSZ, SIG_IGN);
  auto coordinator = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  FakeWorker w(coordinator->channel(), "node-end", 2);
  ASSERT_TRUE(w.Join().ok());
  absl::StatusOr<v1::Job> job = SubmitRunning(*coordinator, w, TinySpec(2, /*max_attempts=*/2));
  ASSERT_TRUE(job.ok()) << job.status();
  EventWatcher watcher(coordinator->jobs(), job->id());
  ASSERT_TRUE(watcher.WaitForSnapshot()) << "the watcher's stream did not start";

  ASSERT_NO_FATAL_FAILURE(LimitFileSize(coordinator->process(), 0));
  ASSERT_TRUE(w.ReportRank(job->id(), 1, 0, v1::RANK_STATE_FAILED, /*exit_code=*/1).ok());
  // The attempt ended in memory: its other rank is stopped though the end is not stored.
  ASSERT_TRUE(w.NextCancellation().has_value());
  absl::SleepFor(absl::Seconds(1));  // the ticker's commits fail too
  const std::vector<std::string> ended = {"RankExited", "AttemptFailed", "Retrying"};
  EXPECT_TRUE(TypesAmong(watcher.events(), ended).empty())
      << "a watcher got events that are not stored";

  ASSERT_NO_FATAL_FAILURE(LimitFileSize(coordinator->process(), RLIM_INFINITY));
  EXPECT_TRUE(watcher.WaitFor("Retrying"))
      << "the ended attempt's events never reached the watcher";
  absl::SleepFor(absl::Milliseconds(500));  // a duplicate would come with the next commits
  std::vector<v1::Event> watched = watcher.events();
  EXPECT_EQ(TypesAmong(watched, ended), ended) << "once each, in the order they happened";
  for (size_t i = 1; i < watched.size(); ++i) {
    EXPECT_GT(watched[i].id(), watched[i - 1].id()) << "watched events out of the stored order";
  }
  EXPECT_EQ(TypesAmong(coordinator->Events(job->id()), ended), ended);

  w.Disconnect();
  ASSERT_NO_FATAL_FAILURE(coordinator->Kill());
  absl::StatusOr<v1::JobState> attempt_state = StoredAttemptState(coordinator->db(), job->id(), 1);
  ASSERT_TRUE(attempt_state.ok()) << attempt_state.status();
  EXPECT_EQ(*attempt_state, v1::JOB_STATE_FAILED)
      << "the stored row of attempt 1 says " << v1::JobState_Name(*attempt_state);
  ASSERT_NO_FATAL_FAILURE(coordinator->Restart());
  EXPECT_EQ(TypesAmong(coordinator->Events(job->id()), ended), ended);
  absl::StatusOr<v1::Job> after = coordinator->Get(job->id());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(after->attempt(), 1);
}

// Each commit the store refuses is counted on /metrics (what a disk-full alert watches), and
// while something is not stored the coordinator keeps trying; none is counted once it has room.
TEST(CoordinatorStoreCommitTest, FailedCommitsAreCounted) {
  signal(SIGXFSZ, SIG_IGN);
  auto coordinator = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  ASSERT_EQ(StoreCommitFailures(*coordinator), 0)
      << "no dropless_coordinator_store_commit_failures_total on /metrics";
  ASSERT_NO_FATAL_FAILURE(LimitFileSize(coordinator->process(), 0));
  absl::StatusOr<v1::Job> refused = coordinator->Submit(TinySpec(1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_EQ(StoreCommitFailures(*coordinator), 1);
  FakeWorker w(coordinator->channel(), "node-count", 1);
  EXPECT_FALSE(w.Register("boot-1").ok());  // its row is kept, and retried every tick
  absl::SleepFor(absl::Seconds(1));
  const int64_t failures = StoreCommitFailures(*coordinator);
  EXPECT_GE(failures, 3) << "failed commits while the worker's row waits to be stored";

  ASSERT_NO_FATAL_FAILURE(LimitFileSize(coordinator->process(), RLIM_INFINITY));
  ASSERT_TRUE(w.Register("boot-1").ok());
  absl::StatusOr<v1::Job> job = coordinator->Submit(TinySpec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  const int64_t settled = StoreCommitFailures(*coordinator);
  EXPECT_GE(settled, failures);
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(StoreCommitFailures(*coordinator), settled) << "failures counted with room on disk";
}

// The disk fills while a job waits for a worker: the placement the worker's Hello allows cannot
// be stored, so it is undone (the job PENDING, the slots free) and no Assignment goes out; once
// the disk has room the next scheduling pass places it again and the job runs on attempt 1.
TEST(CoordinatorStoreCommitTest, AnAssignmentGoesOutOnlyOnceItsPlacementIsStored) {
  signal(SIGXFSZ, SIG_IGN);
  auto coordinator = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  absl::StatusOr<v1::Job> job = coordinator->Submit(TinySpec(2));  // no worker yet: PENDING
  ASSERT_TRUE(job.ok()) << job.status();
  FakeWorker w(coordinator->channel(), "node-full", 2);
  ASSERT_TRUE(w.Register("boot-1").ok());

  ASSERT_NO_FATAL_FAILURE(LimitFileSize(coordinator->process(), 0));
  ASSERT_TRUE(w.Connect("boot-1").ok());
  ASSERT_TRUE(coordinator->WaitForWorkerState("node-full", v1::WORKER_STATE_READY));
  EXPECT_FALSE(w.NextAssignment(absl::Seconds(2)).has_value())
      << "an Assignment went out for a placement the store refused";
  absl::StatusOr<v1::Job> waiting = coordinator->Get(job->id());
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_EQ(waiting->state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(waiting->attempt(), 0);
  EXPECT_EQ(waiting->placement_size(), 0);
  for (const v1::Worker& worker : coordinator->Workers()) {
    EXPECT_EQ(worker.slots_busy(), 0) << "slots held by a placement that was never stored";
  }

  ASSERT_NO_FATAL_FAILURE(LimitFileSize(coordinator->process(), RLIM_INFINITY));
  std::optional<v1::Assignment> assignment = w.NextAssignment();
  ASSERT_TRUE(assignment.has_value());
  EXPECT_EQ(assignment->attempt(), 1);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(w.ReportRank(job->id(), 1, r, v1::RANK_STATE_RUNNING).ok());
  }
  coordinator->WaitForState(job->id(), v1::JOB_STATE_RUNNING);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(w.ReportRank(job->id(), 1, r, v1::RANK_STATE_SUCCEEDED).ok());
  }
  v1::Job done = coordinator->WaitForState(job->id(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.attempt(), 1);
  EXPECT_TRUE(HasEvent(*coordinator, job->id(), "Scheduled"));
}

// A cancel whose commit fails is UNAVAILABLE to its caller (a restart would forget it), also when
// repeated while the disk is full; its Cancellation stops the ranks all the same. Once the disk
// has room the cancel is stored (by the caller's next try or the next commit) and survives a
// kill -9.
TEST(CoordinatorStoreCommitTest, ACancelThatCannotBeStoredIsAnErrorYetStopsTheRanks) {
  signal(SIGXFSZ, SIG_IGN);
  auto coordinator = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  FakeWorker w(coordinator->channel(), "node-cancel", 2);
  ASSERT_TRUE(w.Join().ok());
  absl::StatusOr<v1::Job> job = SubmitRunning(*coordinator, w, TinySpec(2, /*max_attempts=*/3));
  ASSERT_TRUE(job.ok()) << job.status();

  ASSERT_NO_FATAL_FAILURE(LimitFileSize(coordinator->process(), 0));
  v1::Job answer;
  grpc::Status cancelled = Cancel(*coordinator, job->id(), &answer);
  EXPECT_EQ(cancelled.error_code(), grpc::StatusCode::UNAVAILABLE) << cancelled.error_message();
  std::optional<v1::Cancellation> stop = w.NextCancellation();
  ASSERT_TRUE(stop.has_value()) << "the ranks of a cancelled job go on running";
  EXPECT_EQ(stop->attempt(), 1);
  cancelled = Cancel(*coordinator, job->id(), &answer);
  EXPECT_EQ(cancelled.error_code(), grpc::StatusCode::UNAVAILABLE)
      << "a repeated cancel that is still not stored: " << cancelled.error_message();

  ASSERT_NO_FATAL_FAILURE(LimitFileSize(coordinator->process(), RLIM_INFINITY));
  cancelled = Cancel(*coordinator, job->id(), &answer);
  // OK with the cancelled job, whether this call stored it or a commit of the ticker got there
  // first (and the job was retired).
  EXPECT_TRUE(cancelled.ok()) << cancelled.error_code() << ": " << cancelled.error_message();
  EXPECT_EQ(answer.state(), v1::JOB_STATE_CANCELLED);
  coordinator->WaitForState(job->id(), v1::JOB_STATE_CANCELLED);
  absl::SleepFor(absl::Milliseconds(300));  // the ticker retires the stored job
  cancelled = Cancel(*coordinator, job->id(), &answer);
  EXPECT_TRUE(cancelled.ok()) << "a cancel again, the job stored and retired: "
                              << cancelled.error_code() << ": " << cancelled.error_message();
  EXPECT_EQ(answer.state(), v1::JOB_STATE_CANCELLED);
  w.Disconnect();
  coordinator->KillAndRestart();
  v1::Job after = coordinator->WaitForState(job->id(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(after.state(), v1::JOB_STATE_CANCELLED) << after.message();
  EXPECT_EQ(after.attempt(), 1);
}

// Step metrics the store refuses are not acknowledged (the worker sends them again on its next
// session) and reach no watcher until stored: a watcher sees the step once, not twice.
TEST(CoordinatorStoreCommitTest, StepMetricsReachWatchersOnceStored) {
  signal(SIGXFSZ, SIG_IGN);
  auto coordinator = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  FakeWorker w(coordinator->channel(), "node-metrics", 1);
  ASSERT_TRUE(w.Join().ok());
  absl::StatusOr<v1::Job> job = SubmitRunning(*coordinator, w, TinySpec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  EventWatcher watcher(coordinator->jobs(), job->id());
  ASSERT_TRUE(watcher.WaitForSnapshot()) << "the watcher's stream did not start";

  v1::WorkerMessage step;
  v1::StepMetrics* m = step.mutable_metrics();
  m->set_job_id(job->id());
  m->set_attempt(1);
  m->set_rank(0);
  m->set_step(7);
  m->set_steps(10);
  m->set_step_seconds(0.01);
  step.set_seq(1);
  ASSERT_NO_FATAL_FAILURE(LimitFileSize(coordinator->process(), 0));
  ASSERT_TRUE(w.Send(step).ok());
  EXPECT_FALSE(NextAck(w, 1, absl::Seconds(2))) << "acknowledged, yet the store refused it";
  EXPECT_TRUE(watcher.metrics_steps().empty()) << "a watcher got step metrics that are not stored";

  ASSERT_NO_FATAL_FAILURE(LimitFileSize(coordinator->process(), RLIM_INFINITY));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (w.SessionOpen() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(RegisterAgain(w, "boot-1").ok());
  ASSERT_TRUE(w.Connect("boot-1").ok());
  ASSERT_TRUE(w.Send(step).ok());  // sent again from the worker's queue
  ASSERT_TRUE(NextAck(w, 1));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(watcher.metrics_steps(), std::vector<int64_t>{7});
}

// While the store fails, the ticker's retries of what it keeps back off (100 ms doubling up to
// 5 s) instead of a commit of all of it every 100 ms; once the disk has room it is stored.
TEST(CoordinatorStoreCommitTest, RetriesOfWhatIsNotStoredBackOff) {
  signal(SIGXFSZ, SIG_IGN);
  auto coordinator = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  ASSERT_NO_FATAL_FAILURE(LimitFileSize(coordinator->process(), 0));
  FakeWorker w(coordinator->channel(), "node-backoff", 1);
  EXPECT_FALSE(w.Register("boot-1").ok());  // its row is kept for the next commit
  const int64_t failed_first = StoreCommitFailures(*coordinator);
  absl::SleepFor(absl::Seconds(3));
  const int64_t retries = StoreCommitFailures(*coordinator) - failed_first;
  // 100, 200, 400, 800, 1600 ms: 4 or 5 in 3 s (every tick, 30).
  EXPECT_GE(retries, 2);
  EXPECT_LE(retries, 8) << "retries in 3 s while every commit fails";

  ASSERT_NO_FATAL_FAILURE(LimitFileSize(coordinator->process(), RLIM_INFINITY));
  ASSERT_TRUE(w.Join().ok());
  EXPECT_TRUE(coordinator->WaitForWorkerState("node-backoff", v1::WORKER_STATE_READY));
}

// The same with a job that the scheduler could place: its attempt fails while the disk is full
// (the status is not stored, so its worker's session ends) and attempt 2 fits on a second,
// idle worker. The scheduling passes wait for the back-off's turn as the ticker's retries do
// (before: a placement, a failed commit and the placement undone every tick), no Assignment goes
// out, and once the disk has room attempt 2 is placed there.
TEST(CoordinatorStoreCommitTest, APlaceableJobWaitsForTheRetrysTurnWhileTheStoreFails) {
  signal(SIGXFSZ, SIG_IGN);
  auto coordinator = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  FakeWorker w(coordinator->channel(), "node-first", 2);
  ASSERT_TRUE(w.Join().ok());
  absl::StatusOr<v1::Job> job = SubmitRunning(*coordinator, w, TinySpec(2, /*max_attempts=*/2));
  ASSERT_TRUE(job.ok()) << job.status();
  FakeWorker idle(coordinator->channel(), "node-idle", 2);
  ASSERT_TRUE(idle.Join().ok());
  ASSERT_TRUE(coordinator->WaitForWorkerState("node-idle", v1::WORKER_STATE_READY));

  ASSERT_NO_FATAL_FAILURE(LimitFileSize(coordinator->process(), 0));
  ASSERT_TRUE(w.ReportRank(job->id(), 1, 0, v1::RANK_STATE_FAILED, /*exit_code=*/1).ok());
  const int64_t failed_first = StoreCommitFailures(*coordinator);
  EXPECT_FALSE(idle.NextAssignment(absl::Seconds(3)).has_value())
      << "an Assignment went out for a placement the store refused";
  const int64_t retries = StoreCommitFailures(*coordinator) - failed_first;
  EXPECT_GE(retries, 2);
  EXPECT_LE(retries, 8) << "commits tried in 3 s while every commit fails";

  ASSERT_NO_FATAL_FAILURE(LimitFileSize(coordinator->process(), RLIM_INFINITY));
  std::optional<v1::Assignment> assignment = idle.NextAssignment();
  ASSERT_TRUE(assignment.has_value()) << "attempt 2 was never placed once the disk had room";
  EXPECT_EQ(assignment->attempt(), 2);
}

// A 64-rank gang on 4 workers starting: each worker reports its 16 ranks STARTING as 16 queued
// RankStatus messages sent back to back, then, after a reconnect, lists them RUNNING in its
// Hello. Every change of a rank's state is stored with fsync before it is acknowledged, but the
// statuses handled together share the commit: a few per worker, not one per rank (128 before).
TEST(CoordinatorStoreCommitTest, AGangStartsWithCommitsPerWorkerMessageNotPerRank) {
  constexpr int kWorkers = 4;
  constexpr int kRanksEach = 16;
  auto coordinator = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  std::vector<std::unique_ptr<FakeWorker>> workers;
  for (int i = 0; i < kWorkers; ++i) {
    workers.push_back(
        std::make_unique<FakeWorker>(coordinator->channel(), absl::StrCat("node-", i), kRanksEach));
    ASSERT_TRUE(workers.back()->Register(absl::StrCat("boot-", i)).ok());
    ASSERT_TRUE(workers.back()->Connect(absl::StrCat("boot-", i)).ok());
  }
  absl::StatusOr<v1::Job> job = coordinator->Submit(TinySpec(kWorkers * kRanksEach));
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<std::vector<int>> ranks_of(kWorkers);
  for (int i = 0; i < kWorkers; ++i) {
    std::optional<v1::Assignment> assignment = workers[i]->NextAssignment();
    ASSERT_TRUE(assignment.has_value());
    for (const v1::RankAssignment& r : assignment->ranks()) ranks_of[i].push_back(r.rank());
    ASSERT_EQ(ranks_of[i].size(), static_cast<size_t>(kRanksEach));
  }

  const int64_t before_starting = StoreCommits(*coordinator);
  ASSERT_GE(before_starting, 0) << "no dropless_coordinator_store_commits_total on /metrics";
  for (int i = 0; i < kWorkers; ++i) {
    std::vector<v1::WorkerMessage> starting;
    for (int rank : ranks_of[i]) {
      starting.push_back(QueuedMessage(RankStatusOf(job->id(), 1, rank, v1::RANK_STATE_STARTING),
                                       starting.size() + 1));
    }
    ASSERT_TRUE(workers[i]->SendAll(starting).ok());
  }
  for (int i = 0; i < kWorkers; ++i) ASSERT_TRUE(NextAck(*workers[i], kRanksEach));
  const int64_t starting_commits = StoreCommits(*coordinator) - before_starting;
  // Typically 2 a worker (the first status alone, the 15 read meanwhile together). How many
  // arrive during a commit is timing, so the bound leaves room: one commit per status fails it.
  EXPECT_LE(starting_commits, kWorkers * kRanksEach / 2)
      << "commits with fsync for " << kWorkers * kRanksEach << " STARTING statuses";
  EXPECT_GE(starting_commits, 1);

  for (int i = 0; i < kWorkers; ++i) workers[i]->Disconnect();
  for (int i = 0; i < kWorkers; ++i) {
    ASSERT_TRUE(coordinator->WaitForWorkerState(absl::StrCat("node-", i), v1::WORKER_STATE_LOST));
  }
  const int64_t before_running = StoreCommits(*coordinator);
  for (int i = 0; i < kWorkers; ++i) {
    std::vector<v1::RankStatus> running;
    for (int rank : ranks_of[i]) {
      running.push_back(RankStatusOf(job->id(), 1, rank, v1::RANK_STATE_RUNNING));
    }
    ASSERT_TRUE(workers[i]->Connect(absl::StrCat("boot-", i), running).ok());
    ASSERT_TRUE(coordinator->WaitForWorkerState(absl::StrCat("node-", i), v1::WORKER_STATE_READY));
  }
  v1::Job running = coordinator->WaitForState(job->id(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(running.attempt(), 1);
  // One for each Hello: its worker's row, its 16 ranks, and (the last) the job RUNNING.
  EXPECT_EQ(StoreCommits(*coordinator) - before_running, kWorkers)
      << "commits with fsync for " << kWorkers << " Hellos listing " << kRanksEach
      << " RUNNING ranks each";
}

}  // namespace
}  // namespace dropless::testing
