// Worker-message delivery against the real dropless-coordinator: every report a worker sends is
// acknowledged and stored exactly once, across reconnects and coordinator restarts, without the
// acknowledgements filling the outbox; a hello that lists an ended rank completes its attempt.
// (Suite CoordinatorLifecycleTest, shared with coordinator_lifecycle_test.cc.)
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"

namespace dropless::testing {
namespace {

std::vector<std::string> StoredLogTexts(CoordinatorUnderTest& coordinator, const std::string& id) {
  grpc::ClientContext context;
  v1::GetLogsRequest request;
  request.set_job_id(id);
  auto reader = coordinator.jobs().GetLogs(&context, request);
  std::vector<std::string> texts;
  v1::LogLine line;
  while (reader->Read(&line)) texts.push_back(line.text());
  EXPECT_TRUE(reader->Finish().ok());
  return texts;
}

// Registers and connects `w` (daemon run `boot_id`) and runs a one-rank job on it to RUNNING.
void StartOneRankJob(CoordinatorUnderTest& coordinator, FakeWorker& w, const std::string& boot_id,
                     std::string* job_id) {
  ASSERT_TRUE(w.Register().ok());
  ASSERT_TRUE(w.Connect(boot_id).ok());
  absl::StatusOr<v1::Job> job = coordinator.Submit(TinySpec(1));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(w.NextAssignment().has_value());
  ASSERT_TRUE(w.ReportRank(job->id(), 1, 0, v1::RANK_STATE_RUNNING).ok());
  coordinator.WaitForState(job->id(), v1::JOB_STATE_RUNNING);
  *job_id = job->id();
}

// A queued log batch of one line of rank 0, attempt 1.
v1::WorkerMessage LogMessage(const std::string& job_id, uint64_t seq, const std::string& text) {
  v1::WorkerMessage m;
  v1::LogLine* line = m.mutable_logs()->add_lines();
  line->set_job_id(job_id);
  line->set_attempt(1);
  line->set_rank(0);
  line->set_text(text);
  m.set_seq(seq);
  return m;
}

// Queued worker messages carry a seq (WorkerMessage.seq): the coordinator acknowledges each one
// once it is stored, and a message that comes again (the same daemon run resending what it wrote
// before a reconnect whose acknowledgement it never got) is acknowledged again but stored once. A
// daemon that restarted (a new boot_id) numbers its messages from 1 again, and they are stored.
TEST(CoordinatorLifecycleTest, QueuedMessagesAreAcknowledgedAndStoredOnce) {
  auto coordinator = CoordinatorUnderTest::Start();
  FakeWorker w(coordinator->channel(), "node-ack", 1);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartOneRankJob(*coordinator, w, "", &id));
  auto log_message = [&](uint64_t seq, const std::string& text) {
    return LogMessage(id, seq, text);
  };
  auto next_ack = [&](uint64_t seq) { return NextAck(w, seq); };
  ASSERT_TRUE(w.Send(log_message(7, "first")).ok());
  EXPECT_TRUE(next_ack(7));
  ASSERT_TRUE(w.Send(log_message(7, "first")).ok());  // sent again: acknowledged, not stored
  EXPECT_TRUE(next_ack(7));
  ASSERT_TRUE(w.Send(log_message(8, "second")).ok());
  EXPECT_TRUE(next_ack(8));
  EXPECT_EQ(StoredLogTexts(*coordinator, id), (std::vector<std::string>{"first", "second"}));

  // Messages without a seq (hello, heartbeats, older workers) are neither acknowledged nor
  // deduplicated. (One stream is handled in order: once seq 9 is acknowledged, both are stored.)
  ASSERT_TRUE(w.ReportLog(id, 1, 0, "unnumbered").ok());
  ASSERT_TRUE(w.ReportLog(id, 1, 0, "unnumbered").ok());
  ASSERT_TRUE(w.Send(log_message(9, "third")).ok());
  EXPECT_TRUE(next_ack(9));
  EXPECT_EQ(StoredLogTexts(*coordinator, id),
            (std::vector<std::string>{"first", "second", "unnumbered", "unnumbered", "third"}));

  // A restarted daemon (new boot_id) starts from seq 1 again. (It may say hello once the
  // coordinator has seen the old run's session end: until then the node is held.)
  w.Disconnect();
  ASSERT_TRUE(coordinator->WaitForWorkerState("node-ack", v1::WORKER_STATE_LOST));
  ASSERT_TRUE(w.Connect("boot-2").ok());
  ASSERT_TRUE(w.Send(log_message(1, "after restart")).ok());
  EXPECT_TRUE(next_ack(1));
  EXPECT_EQ(StoredLogTexts(*coordinator, id).back(), "after restart");
}

// Every queued message gets an acknowledgement, but they are cumulative and coalesced: a worker
// that sends messages far faster than one Write per acknowledgement does not fill the session's
// outbox (which would end the session).
TEST(CoordinatorLifecycleTest, AcknowledgementsDoNotFillTheOutbox) {
  auto coordinator = CoordinatorUnderTest::Start();
  FakeWorker w(coordinator->channel(), "node-flood", 1);
  ASSERT_TRUE(w.Register().ok());
  ASSERT_TRUE(w.Connect("boot-1").ok());
  v1::WorkerMessage m;
  m.mutable_logs();
  m.set_seq(1);
  ASSERT_TRUE(w.Send(m).ok());
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(w.Send(m).ok()) << i;  // resends of seq 1
  m.set_seq(2);
  ASSERT_TRUE(w.Send(m).ok());
  EXPECT_TRUE(NextAck(w, 2, absl::Seconds(10)));
  EXPECT_TRUE(w.SessionOpen());
  EXPECT_EQ(coordinator->Workers()[0].state(), v1::WORKER_STATE_READY);
}

// A rank that ended while its worker had no session: the worker's next Hello lists it with its
// final state (still unacknowledged in its queue), so the coordinator does not fail the attempt for
// a rank that is not running any more. The end itself takes effect when the queued RankStatus
// arrives, after what the rank reported before it: the step metrics queued ahead of it are stored,
// not dropped as reports of an attempt that already ended.
TEST(CoordinatorLifecycleTest, HelloListingAnEndedRankCompletesItsAttemptAfterItsQueuedReports) {
  auto coordinator = CoordinatorUnderTest::Start();
  FakeWorker w(coordinator->channel(), "node-end", 1);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartOneRankJob(*coordinator, w, "boot-1", &id));
  w.Disconnect();
  ASSERT_TRUE(w.Register().ok());
  (void)w.ReportRank(id, 1, 0, v1::RANK_STATE_SUCCEEDED);  // no session: not delivered
  v1::RankStatus ended;
  ended.set_job_id(id);
  ended.set_attempt(1);
  ended.set_rank(0);
  ended.set_state(v1::RANK_STATE_SUCCEEDED);
  ASSERT_TRUE(w.Connect("boot-1", {ended}).ok());
  // The queue, sent again after the Hello: the last step's metrics, then the final status.
  v1::WorkerMessage metrics;
  metrics.set_seq(1);
  metrics.mutable_metrics()->set_job_id(id);
  metrics.mutable_metrics()->set_attempt(1);
  metrics.mutable_metrics()->set_step(1);
  ASSERT_TRUE(w.Send(metrics).ok());
  ASSERT_TRUE(NextAck(w, 1));
  EXPECT_EQ(coordinator->Get(id)->state(), v1::JOB_STATE_RUNNING)
      << "the Hello's listing kept the attempt, its queued status ends it";
  v1::WorkerMessage status;
  status.set_seq(2);
  *status.mutable_rank_status() = ended;
  ASSERT_TRUE(w.Send(status).ok());
  ASSERT_TRUE(NextAck(w, 2));
  v1::Job done = coordinator->WaitForJob(id, [](const v1::Job& j) {
    return j.state() == v1::JOB_STATE_SUCCEEDED || j.state() == v1::JOB_STATE_FAILED;
  });
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.message();

  grpc::ClientContext context;
  v1::ListStepMetricsRequest request;
  request.set_job_id(id);
  v1::ListStepMetricsResponse response;
  ASSERT_TRUE(coordinator->jobs().ListStepMetrics(&context, request, &response).ok());
  ASSERT_EQ(response.metrics_size(), 1) << "the metrics queued before the rank's end are stored";
  EXPECT_EQ(response.metrics(0).step(), 1);
}

// Dedupe state lives as long as the daemon run: a reconnect with the same boot_id keeps it.
TEST(CoordinatorLifecycleTest, ResendAfterReconnectIsStoredOnce) {
  auto coordinator = CoordinatorUnderTest::Start();
  FakeWorker w(coordinator->channel(), "node-resend", 1);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartOneRankJob(*coordinator, w, "boot-1", &id));
  const v1::WorkerMessage m = LogMessage(id, 3, "once");
  ASSERT_TRUE(w.Send(m).ok());
  ASSERT_TRUE(NextAck(w, 3));
  w.Disconnect();
  ASSERT_TRUE(w.Register().ok());
  ASSERT_TRUE(w.Connect("boot-1").ok());
  ASSERT_TRUE(w.Send(m).ok());  // the acknowledgement was "lost": the worker sends it again
  ASSERT_TRUE(NextAck(w, 3));
  EXPECT_EQ(StoredLogTexts(*coordinator, id), (std::vector<std::string>{"once"}));
}

// The receipt of a stored message is written with its rows: a coordinator killed after storing a
// message but before its acknowledgement reached the worker knows, once restarted, that the resend
// of the same daemon run is stored already.
TEST(CoordinatorLifecycleTest, ResendAfterACoordinatorRestartIsStoredOnce) {
  auto coordinator = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  FakeWorker w(coordinator->channel(), "node-restart", 1);
  std::string id;
  ASSERT_NO_FATAL_FAILURE(StartOneRankJob(*coordinator, w, "boot-1", &id));
  const v1::WorkerMessage m = LogMessage(id, 3, "once");
  ASSERT_TRUE(w.Send(m).ok());
  ASSERT_TRUE(NextAck(w, 3));
  w.Disconnect();
  coordinator->KillAndRestart();
  // The channel may still be backing off from the dead process: register until it is through.
  absl::Status registered = w.Register();
  for (int i = 0; i < 100 && !registered.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    registered = w.Register();
  }
  ASSERT_TRUE(registered.ok()) << registered;
  v1::RankStatus running;
  running.set_job_id(id);
  running.set_attempt(1);
  running.set_rank(0);
  running.set_state(v1::RANK_STATE_RUNNING);
  ASSERT_TRUE(w.Connect("boot-1", {running}).ok());
  ASSERT_TRUE(w.Send(m).ok());  // the acknowledgement never arrived, as far as the worker knows
  ASSERT_TRUE(NextAck(w, 3));
  ASSERT_TRUE(w.Send(LogMessage(id, 4, "next")).ok());
  ASSERT_TRUE(NextAck(w, 4));
  EXPECT_EQ(StoredLogTexts(*coordinator, id), (std::vector<std::string>{"once", "next"}));
}

// A daemon's heartbeat that lists the ended ranks too (lists_ended_ranks): a rank held as RUNNING
// on that worker that is in neither list lost its end, and its attempt fails at once instead of at
// the job's time limit. Listed as ended (its status still queued), it is waited for; a heartbeat
// of an older daemon (no lists_ended_ranks) decides nothing.
TEST(CoordinatorLifecycleTest, ARunningRankInNeitherListOfAHeartbeatFailsItsAttempt) {
  auto coordinator = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  FakeWorker w(coordinator->channel(), "node-h", 2);
  ASSERT_TRUE(w.Register().ok());
  ASSERT_TRUE(w.Connect().ok());
  absl::StatusOr<v1::Job> job = coordinator->Submit(TinySpec(2));
  ASSERT_TRUE(job.ok()) << job.status();
  std::optional<v1::Assignment> assignment = w.NextAssignment();
  ASSERT_TRUE(assignment.has_value());
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(w.ReportRank(job->id(), 1, r, v1::RANK_STATE_RUNNING).ok());
  coordinator->WaitForState(job->id(), v1::JOB_STATE_RUNNING);
  w.StopHeartbeats();
  auto beat = [&](bool lists_ended, std::vector<int> live, std::vector<int> ended) {
    v1::WorkerMessage message;
    v1::Heartbeat* heartbeat = message.mutable_heartbeat();
    heartbeat->set_time_ms(absl::ToUnixMillis(absl::Now()));
    heartbeat->set_lists_ended_ranks(lists_ended);
    for (auto [list, ranks, state] :
         {std::tuple{heartbeat->mutable_ranks(), &live, v1::RANK_STATE_RUNNING},
          std::tuple{heartbeat->mutable_ended_ranks(), &ended, v1::RANK_STATE_SUCCEEDED}}) {
      for (int r : *ranks) {
        v1::RankStatus* status = list->Add();
        status->set_job_id(job->id());
        status->set_attempt(1);
        status->set_rank(r);
        status->set_state(state);
      }
    }
    ASSERT_TRUE(w.Send(message).ok());
    absl::SleepFor(absl::Milliseconds(4 * kHeartbeatMs));
  };
  beat(false, {}, {});  // an older daemon's heartbeat: it does not say where ended ranks are
  EXPECT_EQ(coordinator->Get(job->id())->state(), v1::JOB_STATE_RUNNING);
  beat(true, {0}, {1});  // rank 1 ended, its status still queued behind other messages
  EXPECT_EQ(coordinator->Get(job->id())->state(), v1::JOB_STATE_RUNNING);
  beat(true, {0}, {});  // rank 1 in neither list
  v1::Job failed = coordinator->WaitForState(job->id(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(failed.message().find("rank 1 on node node-h ended without a final status"),
            std::string::npos)
      << failed.message();
  w.ResumeHeartbeats();
}

}  // namespace
}  // namespace dropless::testing
