// Job lifecycle against the real dropless-coordinator: placement across workers, running,
// success, cancellation, lost workers, retries and restarts (message delivery:
// coordinator_delivery_test.cc).
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"

namespace dropless::testing {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

std::vector<std::string> EventTypes(const std::vector<v1::Event>& events) {
  std::vector<std::string> types;
  for (const v1::Event& e : events) types.push_back(e.type());
  return types;
}

const v1::Worker* FindWorker(const std::vector<v1::Worker>& workers, const std::string& id) {
  for (const v1::Worker& w : workers) {
    if (w.id() == id) return &w;
  }
  return nullptr;
}

// Reads a WatchJob stream to its end on a thread of its own.
class WatchReader {
 public:
  WatchReader(v1::JobService::Stub& stub, const std::string& id) {
    v1::WatchJobRequest request;
    request.set_id(id);
    reader_ = stub.WatchJob(&context_, request);
    thread_ = std::thread([this] {
      v1::JobUpdate update;
      while (reader_->Read(&update)) updates_.push_back(update);
      status_ = reader_->Finish();
    });
  }
  // Joins; the stream must end by itself (the job finished).
  void Join() { thread_.join(); }
  const std::vector<v1::JobUpdate>& updates() const { return updates_; }
  const grpc::Status& status() const { return status_; }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::JobUpdate>> reader_;
  std::thread thread_;
  std::vector<v1::JobUpdate> updates_;
  grpc::Status status_;
};

// Follows a job's logs (GetLogs with follow) on a thread of its own until the stream ends.
class LogFollower {
 public:
  LogFollower(v1::JobService::Stub& stub, const std::string& id) {
    v1::GetLogsRequest request;
    request.set_job_id(id);
    request.set_follow(true);
    reader_ = stub.GetLogs(&context_, request);
    thread_ = std::thread([this] {
      v1::LogLine line;
      while (reader_->Read(&line)) lines_.push_back(line.text());
      status_ = reader_->Finish();
    });
  }
  void Join() { thread_.join(); }
  const std::vector<std::string>& lines() const { return lines_; }
  const grpc::Status& status() const { return status_; }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::LogLine>> reader_;
  std::thread thread_;
  std::vector<std::string> lines_;
  grpc::Status status_;
};

TEST(CoordinatorLifecycleTest, TwoRankJobSplitAcrossTwoWorkersRunsAndSucceeds) {
  auto coordinator = CoordinatorUnderTest::Start();
  FakeWorker a(coordinator->channel(), "node-a", 1);
  FakeWorker b(coordinator->channel(), "node-b", 1);
  ASSERT_TRUE(a.Register().ok());
  ASSERT_TRUE(b.Register().ok());
  EXPECT_NE(a.id(), b.id());
  ASSERT_TRUE(a.Connect().ok());
  ASSERT_TRUE(b.Connect().ok());

  absl::StatusOr<v1::Job> submitted = coordinator->Submit(TinySpec(2), "split");
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->id();
  EXPECT_EQ(submitted->name(), "split");
  EXPECT_EQ(submitted->world_size(), 2);
  EXPECT_EQ(submitted->backend(), "cpu");
  WatchReader watch(coordinator->jobs(), id);
  LogFollower follow(coordinator->jobs(), id);

  std::optional<v1::Assignment> on_a = a.NextAssignment();
  std::optional<v1::Assignment> on_b = b.NextAssignment();
  ASSERT_TRUE(on_a.has_value());
  ASSERT_TRUE(on_b.has_value());
  EXPECT_EQ(on_a->job_id(), id);
  EXPECT_EQ(on_a->attempt(), 1);
  EXPECT_EQ(on_a->world_size(), 2);
  EXPECT_THAT(on_a->spec_yaml(), HasSubstr("ep: 2"));
  ASSERT_EQ(on_a->ranks_size(), 1);
  ASSERT_EQ(on_b->ranks_size(), 1);
  EXPECT_THAT((std::vector<int>{on_a->ranks(0).rank(), on_b->ranks(0).rank()}),
              UnorderedElementsAre(0, 1));
  EXPECT_EQ(on_a->placement_size(), 2);
  const int rank_a = on_a->ranks(0).rank();
  const int rank_b = on_b->ranks(0).rank();

  v1::Job scheduled = coordinator->WaitForState(id, v1::JOB_STATE_SCHEDULED);
  ASSERT_EQ(scheduled.placement_size(), 2);
  EXPECT_NE(scheduled.placement(0).node(), scheduled.placement(1).node());

  ASSERT_TRUE(a.ReportRank(id, 1, rank_a, v1::RANK_STATE_STARTING).ok());
  ASSERT_TRUE(b.ReportRank(id, 1, rank_b, v1::RANK_STATE_STARTING).ok());
  ASSERT_TRUE(a.ReportRank(id, 1, rank_a, v1::RANK_STATE_RUNNING).ok());
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(coordinator->Get(id)->state(), v1::JOB_STATE_SCHEDULED);  // one rank still starting
  ASSERT_TRUE(b.ReportRank(id, 1, rank_b, v1::RANK_STATE_RUNNING).ok());
  v1::Job running = coordinator->WaitForState(id, v1::JOB_STATE_RUNNING);
  EXPECT_GT(running.start_time_ms(), 0);

  FakeWorker& rank0 = rank_a == 0 ? a : b;
  FakeWorker& rank1 = rank_a == 0 ? b : a;
  for (int step = 1; step <= 5; ++step) {
    ASSERT_TRUE(rank1.ReportMetrics(id, 1, 1, step, 5, 9.0).ok());
    ASSERT_TRUE(rank0.ReportMetrics(id, 1, 0, step, 5, 5.0 - step * 0.5).ok());
  }
  ASSERT_TRUE(rank0.ReportLog(id, 1, 0, "rank 0 says hello").ok());
  ASSERT_TRUE(rank1.ReportLog(id, 1, 1, "rank 1 says hello").ok());
  // The two fake workers report on separate streams, so rank 1's reports may all land before rank
  // 0's first one: until then the lowest rank seen so far (1) is the job's latest.
  v1::Job with_metrics = coordinator->WaitForJob(
      id, [](const v1::Job& j) { return j.latest().step() == 5 && j.latest().rank() == 0; });
  EXPECT_EQ(with_metrics.latest().rank(), 0);  // rank 0's metrics are the job's
  EXPECT_DOUBLE_EQ(with_metrics.latest().loss(), 2.5);
  EXPECT_FALSE(with_metrics.latest().node().empty());

  ASSERT_TRUE(a.ReportRank(id, 1, rank_a, v1::RANK_STATE_SUCCEEDED).ok());
  ASSERT_TRUE(b.ReportRank(id, 1, rank_b, v1::RANK_STATE_SUCCEEDED).ok());
  v1::Job done = coordinator->WaitForState(id, v1::JOB_STATE_SUCCEEDED);
  EXPECT_GT(done.end_time_ms(), 0);
  EXPECT_EQ(done.attempt(), 1);

  // The watch saw the whole story and ended by itself.
  watch.Join();
  EXPECT_TRUE(watch.status().ok()) << watch.status().error_message();
  ASSERT_FALSE(watch.updates().empty());
  EXPECT_EQ(watch.updates().back().job().state(), v1::JOB_STATE_SUCCEEDED);
  bool saw_metrics = false, saw_running = false;
  for (const v1::JobUpdate& u : watch.updates()) {
    saw_metrics |= u.has_metrics() && u.metrics().step() == 5;
    saw_running |= u.job().state() == v1::JOB_STATE_RUNNING;
  }
  EXPECT_TRUE(saw_metrics);
  EXPECT_TRUE(saw_running);

  std::vector<std::string> types = EventTypes(coordinator->Events(id));
  EXPECT_THAT(types, Contains("Submitted"));
  EXPECT_THAT(types, Contains("Scheduled"));
  EXPECT_THAT(types, Contains("Running"));
  EXPECT_EQ(types.back(), "Succeeded");

  // The follower saw the lines as they came and stopped when the job ended.
  follow.Join();
  EXPECT_TRUE(follow.status().ok()) << follow.status().error_message();
  EXPECT_THAT(follow.lines(), UnorderedElementsAre("rank 0 says hello", "rank 1 says hello"));

  // One rank's logs; follow on a finished job ends at once.
  grpc::ClientContext log_context;
  v1::GetLogsRequest logs_request;
  logs_request.set_job_id(id);
  logs_request.set_rank(1);
  logs_request.set_follow(true);
  auto logs = coordinator->jobs().GetLogs(&log_context, logs_request);
  std::vector<std::string> lines;
  v1::LogLine line;
  while (logs->Read(&line)) lines.push_back(line.text());
  EXPECT_TRUE(logs->Finish().ok());
  EXPECT_THAT(lines, ::testing::ElementsAre("rank 1 says hello"));

  // The slots are free again: a second job is placed at once.
  absl::StatusOr<v1::Job> second = coordinator->Submit(TinySpec(2));
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(a.NextAssignment().has_value());
  std::vector<v1::Worker> workers = coordinator->Workers();
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[0].state(), v1::WORKER_STATE_READY);
  EXPECT_EQ(workers[0].slots(), 1);
  EXPECT_EQ(workers[0].slots_busy(), 1);
}

TEST(CoordinatorLifecycleTest, CancelSendsCancellationAndIsFinal) {
  // The heartbeats pause below while the cancel commits (an fsync): a lease with room for a slow
  // disk, so that the worker is not taken for lost meanwhile.
  auto coordinator = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  FakeWorker w(coordinator->channel(), "node-c", 2);
  ASSERT_TRUE(w.Register().ok());
  ASSERT_TRUE(w.Connect().ok());
  absl::StatusOr<v1::Job> job = coordinator->Submit(TinySpec(2));
  ASSERT_TRUE(job.ok());
  std::optional<v1::Assignment> assignment = w.NextAssignment();
  ASSERT_TRUE(assignment.has_value());
  EXPECT_EQ(assignment->ranks_size(), 2);  // packed onto the one node
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(w.ReportRank(job->id(), 1, r, v1::RANK_STATE_RUNNING).ok());
  coordinator->WaitForState(job->id(), v1::JOB_STATE_RUNNING);

  // Quiet heartbeats (well within the lease) so that the Cancellation can only come from the
  // cancel itself, not from the coordinator noticing a stray rank in a heartbeat.
  w.StopHeartbeats();
  absl::SleepFor(absl::Milliseconds(2 * kHeartbeatMs));
  grpc::ClientContext context;
  v1::CancelJobRequest request;
  request.set_id(job->id());
  request.set_reason("test says stop");
  v1::Job cancelled;
  ASSERT_TRUE(coordinator->jobs().CancelJob(&context, request, &cancelled).ok());
  EXPECT_EQ(cancelled.state(), v1::JOB_STATE_CANCELLED);  // at once, not after the ranks exit
  EXPECT_THAT(cancelled.message(), HasSubstr("test says stop"));
  std::optional<v1::Cancellation> cancellation = w.NextCancellation(absl::Milliseconds(500));
  w.ResumeHeartbeats();
  ASSERT_TRUE(cancellation.has_value());
  EXPECT_EQ(cancellation->job_id(), job->id());
  EXPECT_EQ(cancellation->attempt(), 1);

  grpc::ClientContext again_context;
  v1::Job again;
  grpc::Status again_status = coordinator->jobs().CancelJob(&again_context, request, &again);
  // Final: a cancel again answers the cancelled job as it is.
  EXPECT_TRUE(again_status.ok()) << again_status.error_message();
  EXPECT_EQ(again.id(), job->id());
  EXPECT_EQ(again.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(again.message(), HasSubstr("test says stop"));

  // The slots stay busy until the ranks are reported gone.
  absl::StatusOr<v1::Job> next = coordinator->Submit(TinySpec(2));
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(w.NextAssignment(absl::Milliseconds(500)).has_value());
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(w.ReportRank(job->id(), 1, r, v1::RANK_STATE_KILLED).ok());
  std::optional<v1::Assignment> placed = w.NextAssignment();
  ASSERT_TRUE(placed.has_value());
  EXPECT_EQ(placed->job_id(), next->id());
  EXPECT_EQ(coordinator->Get(job->id())->state(), v1::JOB_STATE_CANCELLED);
}

TEST(CoordinatorLifecycleTest, SilentWorkerIsLostAndItsAttemptFails) {
  auto coordinator = CoordinatorUnderTest::Start();
  FakeWorker a(coordinator->channel(), "node-a", 1);
  FakeWorker b(coordinator->channel(), "node-b", 1);
  ASSERT_TRUE(a.Register().ok() && b.Register().ok());
  ASSERT_TRUE(a.Connect().ok() && b.Connect().ok());
  absl::StatusOr<v1::Job> job = coordinator->Submit(TinySpec(2));
  ASSERT_TRUE(job.ok());
  auto on_a = a.NextAssignment();
  auto on_b = b.NextAssignment();
  ASSERT_TRUE(on_a.has_value() && on_b.has_value());
  ASSERT_TRUE(a.ReportRank(job->id(), 1, on_a->ranks(0).rank(), v1::RANK_STATE_RUNNING).ok());
  ASSERT_TRUE(b.ReportRank(job->id(), 1, on_b->ranks(0).rank(), v1::RANK_STATE_RUNNING).ok());
  coordinator->WaitForState(job->id(), v1::JOB_STATE_RUNNING);

  a.StopHeartbeats();
  v1::Job failed = coordinator->WaitForState(job->id(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr(a.id()));
  EXPECT_THAT(failed.message(), HasSubstr("no message"));
  const v1::Worker* lost = FindWorker(coordinator->Workers(), a.id());
  ASSERT_NE(lost, nullptr);
  EXPECT_EQ(lost->state(), v1::WORKER_STATE_LOST);
  EXPECT_EQ(FindWorker(coordinator->Workers(), b.id())->state(), v1::WORKER_STATE_READY);
  // The surviving rank is told to stop; the silent worker's session was closed.
  std::optional<v1::Cancellation> cancel = b.NextCancellation();
  ASSERT_TRUE(cancel.has_value());
  EXPECT_EQ(cancel->job_id(), job->id());
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (a.SessionOpen() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(a.SessionOpen());
  EXPECT_THAT(EventTypes(coordinator->Events(job->id())), Contains("AttemptFailed"));
  EXPECT_THAT(HttpGet(coordinator->metrics_port(), "/metrics"),
              HasSubstr("dropless_coordinator_lease_expiries_total 1"));
}

TEST(CoordinatorLifecycleTest, FailedRankRetriesOnANewAttempt) {
  auto coordinator = CoordinatorUnderTest::Start();
  FakeWorker w(coordinator->channel(), "node-r", 2);
  ASSERT_TRUE(w.Register().ok() && w.Connect().ok());
  absl::StatusOr<v1::Job> job = coordinator->Submit(TinySpec(2, /*max_attempts=*/2));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(w.NextAssignment().has_value());
  ASSERT_TRUE(w.ReportRank(job->id(), 1, 0, v1::RANK_STATE_RUNNING).ok());
  ASSERT_TRUE(w.ReportRank(job->id(), 1, 1, v1::RANK_STATE_RUNNING).ok());
  ASSERT_TRUE(w.ReportRank(job->id(), 1, 1, v1::RANK_STATE_FAILED, 3).ok());
  // Rank 0 is cancelled; its slot frees once it is reported killed; then attempt 2 starts.
  std::optional<v1::Cancellation> cancel = w.NextCancellation();
  ASSERT_TRUE(cancel.has_value());
  EXPECT_EQ(cancel->attempt(), 1);
  ASSERT_TRUE(w.ReportRank(job->id(), 1, 0, v1::RANK_STATE_KILLED).ok());
  std::optional<v1::Assignment> retry = w.NextAssignment();
  ASSERT_TRUE(retry.has_value());
  EXPECT_EQ(retry->attempt(), 2);
  v1::Job second = coordinator->WaitForJob(job->id(), [](const v1::Job& j) { return j.attempt() == 2; });
  EXPECT_EQ(second.state(), v1::JOB_STATE_SCHEDULED);
  std::vector<v1::Event> events = coordinator->Events(job->id());
  bool explained = false;
  for (const v1::Event& e : events) {
    explained |= e.type() == "AttemptFailed" && absl::StrContains(e.message(), "exit code 3");
  }
  EXPECT_TRUE(explained);
  EXPECT_THAT(EventTypes(events), Contains("Retrying"));

  // Attempt 2 fails too: that was the last one.
  ASSERT_TRUE(w.ReportRank(job->id(), 2, 0, v1::RANK_STATE_FAILED, 1).ok());
  v1::Job failed = coordinator->WaitForState(job->id(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr("attempt 2 of 2"));
}

TEST(CoordinatorLifecycleTest, KillNineAndRestartKeepsEveryAcceptedJob) {
  // The surviving worker must say Hello within the lease after the restart.
  auto coordinator = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<v1::Job> job = coordinator->Submit(TinySpec(2), absl::StrCat("durable-", i), i);
    ASSERT_TRUE(job.ok());
    ids.push_back(job->id());
  }
  // One job runs on a worker that survives the restart, one on a worker that does not return.
  FakeWorker stays(coordinator->channel(), "node-stays", 2);
  FakeWorker leaves(coordinator->channel(), "node-leaves", 2);
  ASSERT_TRUE(stays.Register().ok() && stays.Connect().ok());
  auto first = stays.NextAssignment();
  ASSERT_TRUE(first.has_value());
  ASSERT_TRUE(leaves.Register().ok() && leaves.Connect().ok());
  auto second = leaves.NextAssignment();
  ASSERT_TRUE(second.has_value());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(stays.ReportRank(first->job_id(), 1, r, v1::RANK_STATE_RUNNING).ok());
    ASSERT_TRUE(leaves.ReportRank(second->job_id(), 1, r, v1::RANK_STATE_RUNNING).ok());
  }
  coordinator->WaitForState(first->job_id(), v1::JOB_STATE_RUNNING);
  coordinator->WaitForState(second->job_id(), v1::JOB_STATE_RUNNING);
  // Highest priority first: durable-2, then durable-1; durable-0 waits.
  EXPECT_EQ(first->job_id(), ids[2]);
  EXPECT_EQ(second->job_id(), ids[1]);

  coordinator->KillAndRestart();
  leaves.Disconnect();
  for (const std::string& id : ids) {
    absl::StatusOr<v1::Job> job = coordinator->Get(id);
    ASSERT_TRUE(job.ok()) << id << ": " << job.status();
    EXPECT_FALSE(job->spec_yaml().empty());
  }
  EXPECT_EQ(coordinator->Get(ids[0])->state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(coordinator->Get(ids[0])->name(), "durable-0");
  EXPECT_EQ(coordinator->Get(ids[2])->state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(EventTypes(coordinator->Events(ids[2])), Contains("Running"));

  // The surviving worker reconnects with its ranks: its attempt carries on to success.
  ASSERT_TRUE(stays.Register().ok());
  ASSERT_TRUE(stays.Connect().ok());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(stays.ReportRank(ids[2], 1, r, v1::RANK_STATE_SUCCEEDED).ok());
  }
  v1::Job survived = coordinator->WaitForState(ids[2], v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(survived.attempt(), 1);
  // The other worker never came back: its attempt failed after the lease timeout.
  v1::Job orphaned = coordinator->WaitForState(ids[1], v1::JOB_STATE_FAILED);
  EXPECT_THAT(orphaned.message(), HasSubstr(leaves.id()));
  // And the pending job runs on the freed slots.
  std::optional<v1::Assignment> third = stays.NextAssignment();
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(third->job_id(), ids[0]);
  // A new job gets a new id after the restart.
  absl::StatusOr<v1::Job> fresh = coordinator->Submit(TinySpec(1));
  ASSERT_TRUE(fresh.ok());
  EXPECT_GT(fresh->id(), ids[2]);
}

// A rank that put its rendezvous key before a coordinator restart, and a peer that reads it after:
// the key was stored before the Put returned and is back once the attempt is reloaded.
TEST(CoordinatorLifecycleTest, RendezvousKeysSurviveKillNineWhileTheAttemptRuns) {
  auto coordinator = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  FakeWorker worker(coordinator->channel(), "node-rdv", 2);
  ASSERT_TRUE(worker.Register().ok() && worker.Connect().ok());
  absl::StatusOr<v1::Job> job = coordinator->Submit(TinySpec(2));
  ASSERT_TRUE(job.ok());
  std::optional<v1::Assignment> assignment = worker.NextAssignment();
  ASSERT_TRUE(assignment.has_value());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(worker.ReportRank(job->id(), 1, r, v1::RANK_STATE_RUNNING).ok());
  }
  coordinator->WaitForState(job->id(), v1::JOB_STATE_RUNNING);
  v1::Scope scope;
  scope.set_job_id(job->id());
  scope.set_attempt(1);
  scope.set_secret(assignment->rendezvous_secret());
  const std::string nccl_id(128, '\0');
  ASSERT_TRUE(RendezvousPut(coordinator->rendezvous(), scope, "nccl_unique_id", nccl_id).ok());
  ASSERT_TRUE(RendezvousPut(coordinator->rendezvous(), scope, "rank0", "10.0.0.1:5000").ok());

  coordinator->KillAndRestart();
  v1::GetResponse got;
  ASSERT_TRUE(RendezvousGet(coordinator->rendezvous(), scope, "nccl_unique_id", &got).ok());
  EXPECT_TRUE(got.found());
  EXPECT_EQ(got.value(), nccl_id);
  EXPECT_TRUE(RendezvousWait(coordinator->rendezvous(), scope, {"nccl_unique_id", "rank0"}, 0).ok());
  ASSERT_TRUE(RendezvousPut(coordinator->rendezvous(), scope, "rank1", "10.0.0.2:5000").ok());

  // The worker comes back with its ranks and they finish: the attempt's keys are gone with it,
  // also across another restart.
  ASSERT_TRUE(worker.Register().ok() && worker.Connect().ok());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(worker.ReportRank(job->id(), 1, r, v1::RANK_STATE_SUCCEEDED).ok());
  }
  coordinator->WaitForState(job->id(), v1::JOB_STATE_SUCCEEDED);
  coordinator->KillAndRestart();
  EXPECT_EQ(RendezvousGet(coordinator->rendezvous(), scope, "rank0", &got).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST(CoordinatorLifecycleTest, WorkerThatReconnectsWithoutItsRanksFailsTheAttempt) {
  // The worker must come back within the lease, or the attempt fails for the lease instead.
  auto coordinator = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  FakeWorker w(coordinator->channel(), "node-blip", 1);
  ASSERT_TRUE(w.Register().ok() && w.Connect().ok());
  absl::StatusOr<v1::Job> job = coordinator->Submit(TinySpec(1));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(w.NextAssignment().has_value());
  ASSERT_TRUE(w.ReportRank(job->id(), 1, 0, v1::RANK_STATE_RUNNING).ok());
  coordinator->WaitForState(job->id(), v1::JOB_STATE_RUNNING);
  w.Disconnect();
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(coordinator->Get(job->id())->state(), v1::JOB_STATE_RUNNING);  // within the lease
  // Same node name, same id; its rank process did not survive (the new session reports none).
  FakeWorker again(coordinator->channel(), "node-blip", 1);
  ASSERT_TRUE(again.Register().ok());
  EXPECT_EQ(again.id(), w.id());
  ASSERT_TRUE(again.Connect().ok());
  v1::Job failed = coordinator->WaitForState(job->id(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr("not running"));
}

}  // namespace
}  // namespace dropless::testing
