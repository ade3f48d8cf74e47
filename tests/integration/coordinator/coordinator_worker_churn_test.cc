// Workers that come and go around the real dropless-coordinator: after a restart, a daemon that
// came back as a new run takes an idle node at once, but a node whose stored run holds work stays
// that run's for a lease (a duplicate daemon does not take it); a gang waiting for a worker that
// is away for a moment keeps its hold, for one lease at most; a slot stays taken from its
// placement until the worker has said what became of its rank, even when the attempt ended before
// the Assignment reached the worker. (Suite CoordinatorWorkerChurnTest.)
#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"

namespace dropless::testing {
namespace {

using ::testing::HasSubstr;

// Waits until the restarted coordinator answers the jobs API: it has loaded its store.
void WaitForApi(CoordinatorUnderTest& c, const std::string& job_id) {
  for (int i = 0; i < 100; ++i) {
    if (c.Get(job_id).ok()) return;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ADD_FAILURE() << "the restarted coordinator does not answer";
}

std::string EventMessages(CoordinatorUnderTest& c, const std::string& job_id,
                          const std::string& type) {
  std::string out;
  for (const v1::Event& e : c.Events(job_id)) {
    if (e.type() == type) absl::StrAppend(&out, e.message(), "\n");
  }
  return out;
}

// A queued message of the worker's run (a log line of the job's rank 0, seq 1), stored and
// acknowledged: the store names the run as the node's last one (its receipt).
void StoreReceiptOfRun(FakeWorker& w, const std::string& job_id, int attempt) {
  v1::WorkerMessage line;
  line.set_seq(1);
  v1::LogLine* text = line.mutable_logs()->add_lines();
  text->set_job_id(job_id);
  text->set_attempt(attempt);
  text->set_rank(0);
  text->set_text("step 1");
  ASSERT_TRUE(w.Send(line).ok());
  ASSERT_TRUE(NextAck(w, 1));
}

// The host of an idle worker rebooted while the coordinator was down: its daemon comes back as a
// new run (its journal is gone). The run the store names holds no work, so the new run takes the
// node at once, not a lease after the restart, and from then on holds it: the old run, were it
// alive (two daemons given one --node), is refused. (Before change set B, the restarted
// coordinator held the node for the stored run, refusing the new one until that lease ran out.)
TEST(CoordinatorWorkerChurnTest, ANewDaemonRunTakesAnIdleNodeAtOnceAfterARestart) {
  auto c = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  FakeWorker old_run(c->channel(), "node-reboot", 1);
  ASSERT_TRUE(old_run.Join("run-a").ok());
  absl::StatusOr<v1::Job> done = SubmitRunning(*c, old_run, TinySpec(1, 1, "done"));
  ASSERT_TRUE(done.ok()) << done.status();
  StoreReceiptOfRun(old_run, done->id(), 1);
  ASSERT_TRUE(old_run.ReportRank(done->id(), 1, 0, v1::RANK_STATE_SUCCEEDED).ok());
  EXPECT_EQ(c->WaitForState(done->id(), v1::JOB_STATE_SUCCEEDED).state(), v1::JOB_STATE_SUCCEEDED);

  old_run.Disconnect();  // the host goes down with the daemon
  c->KillAndRestart();
  WaitForApi(*c, done->id());

  FakeWorker new_run(c->channel(), "node-reboot", 1);
  const absl::Status registered = new_run.Register("run-b");
  ASSERT_TRUE(registered.ok()) << "a new run refused a node with no work after the restart: "
                               << registered;
  ASSERT_TRUE(new_run.Connect("run-b").ok());
  EXPECT_EQ(new_run.id(), old_run.id()) << "the same node keeps its id";
  ASSERT_TRUE(c->WaitForWorkerState("node-reboot", v1::WORKER_STATE_READY));

  // The new run holds the node now: the old one, were it alive, does not take it back.
  FakeWorker stale(c->channel(), "node-reboot", 1);
  EXPECT_EQ(stale.Register("run-a").code(), absl::StatusCode::kAlreadyExists);
  absl::StatusOr<v1::Job> next = c->Submit(TinySpec(1, 1, "next"));
  ASSERT_TRUE(next.ok()) << next.status();
  std::optional<v1::Assignment> placed = new_run.NextAssignment();
  ASSERT_TRUE(placed.has_value()) << "no job placed on the new run";
  EXPECT_EQ(placed->job_id(), next->id());
}

// Two daemons were given the same --node: A runs a rank, B is refused and retries every few
// seconds. The coordinator restarts. B must not take the node by saying hello first: the run the
// store names holds work, so it keeps the node for a lease after the restart, A gets back in, and
// its rank goes on. (Before, the first run to say hello after a restart took the node: A was
// refused and its attempt failed as "a new run of its worker daemon", while its rank process
// kept running without a session and the retry started on B, both writing the same checkpoints.)
// The receipt (the run of the node's last stored log line or metrics message) may name the run
// with the work, no run at all, or an earlier run of the node: the ranks' own runs decide.
enum class Receipt { kOfTheRunWithWork, kNone, kOfAnEarlierRun };

void StoredRunWithWorkKeepsItsNode(Receipt receipt) {
  auto c = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  if (receipt == Receipt::kOfAnEarlierRun) {
    FakeWorker earlier(c->channel(), "node-twice", 1);
    ASSERT_TRUE(earlier.Join("run-a0").ok());
    absl::StatusOr<v1::Job> done = SubmitRunning(*c, earlier, TinySpec(1, 1, "earlier"));
    ASSERT_TRUE(done.ok()) << done.status();
    StoreReceiptOfRun(earlier, done->id(), 1);
    ASSERT_TRUE(earlier.ReportRank(done->id(), 1, 0, v1::RANK_STATE_SUCCEEDED).ok());
    ASSERT_EQ(c->WaitForState(done->id(), v1::JOB_STATE_SUCCEEDED).state(),
              v1::JOB_STATE_SUCCEEDED);
    // Its daemon stops (Goodbye) and starts again as run-a, which gets the next job's rank.
    v1::WorkerMessage bye;
    bye.mutable_goodbye()->set_reason("restarting");
    ASSERT_TRUE(earlier.Send(bye).ok());
    earlier.Disconnect();
  }
  FakeWorker a(c->channel(), "node-twice", 1);
  absl::Status joined = a.Register("run-a");  // once the Goodbye is handled
  for (int i = 0; i < 100 && !joined.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    joined = a.Register("run-a");
  }
  ASSERT_TRUE(joined.ok()) << joined;
  ASSERT_TRUE(a.Connect("run-a").ok());
  absl::StatusOr<v1::Job> job = SubmitRunning(*c, a, TinySpec(1, /*max_attempts=*/2));
  ASSERT_TRUE(job.ok()) << job.status();
  if (receipt == Receipt::kOfTheRunWithWork) StoreReceiptOfRun(a, job->id(), 1);
  FakeWorker b(c->channel(), "node-twice", 1);
  EXPECT_EQ(b.Register("run-b").code(), absl::StatusCode::kAlreadyExists);

  a.Disconnect();  // the restart ends A's session; A and its rank live on
  c->KillAndRestart();
  WaitForApi(*c, job->id());

  // B's retry comes first: refused, or it would say hello and take the node.
  const absl::Status b_registered = b.Register("run-b");
  EXPECT_EQ(b_registered.code(), absl::StatusCode::kAlreadyExists)
      << "a duplicate daemon took the node of a run with work: " << b_registered;
  if (b_registered.ok()) (void)b.Connect("run-b");
  ASSERT_TRUE(a.Register().ok()) << "the live run lost its node";
  ASSERT_TRUE(a.Connect("run-a").ok());
  ASSERT_TRUE(c->WaitForWorkerState("node-twice", v1::WORKER_STATE_READY));
  EXPECT_EQ(b.Register("run-b").code(), absl::StatusCode::kAlreadyExists);

  EXPECT_EQ(c->Get(job->id())->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(EventMessages(*c, job->id(), "AttemptFailed"), "");
  ASSERT_TRUE(a.ReportRank(job->id(), 1, 0, v1::RANK_STATE_SUCCEEDED).ok());
  const v1::Job ended = c->WaitForState(job->id(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(ended.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(ended.attempt(), 1);
}

TEST(CoordinatorWorkerChurnTest, AStoredRunWithWorkKeepsItsNodeAfterARestart) {
  StoredRunWithWorkKeepsItsNode(Receipt::kOfTheRunWithWork);
}

// Its ranks started before it sent a log line or metrics: no receipt names any run. Before, a
// run named by no receipt held nothing after a restart, so B took the node.
TEST(CoordinatorWorkerChurnTest, AStoredRunWithWorkAndNoReceiptKeepsItsNodeAfterARestart) {
  StoredRunWithWorkKeepsItsNode(Receipt::kNone);
}

// The receipt names an earlier run of the node (its logs were stored before its daemon
// restarted): the run whose ranks hold the slots keeps the node. Before, the restarted
// coordinator took the earlier run for the node's owner and refused the live one.
TEST(CoordinatorWorkerChurnTest, AStoredRunWithWorkAndAnEarlierRunsReceiptKeepsItsNode) {
  StoredRunWithWorkKeepsItsNode(Receipt::kOfAnEarlierRun);
}

// The host of a worker that ran a rank rebooted while the coordinator was down: the new run of
// its daemon is refused while the stored run, which holds work, may still come back (one lease
// from the restart). Once that lease ran out, the rank's attempt fails, the new run takes the
// node and the job runs again there.
TEST(CoordinatorWorkerChurnTest, ANewRunGetsABusyNodeOnceTheStoredRunsLeaseRunsOut) {
  auto c = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  FakeWorker old_run(c->channel(), "node-reboot", 1);
  ASSERT_TRUE(old_run.Join("run-a").ok());
  absl::StatusOr<v1::Job> job = SubmitRunning(*c, old_run, TinySpec(1, /*max_attempts=*/2));
  ASSERT_TRUE(job.ok()) << job.status();
  StoreReceiptOfRun(old_run, job->id(), 1);

  old_run.Disconnect();  // the host goes down with the daemon and its rank
  const absl::Time before_restart = absl::Now();
  c->KillAndRestart();
  WaitForApi(*c, job->id());

  FakeWorker new_run(c->channel(), "node-reboot", 1);
  absl::Status registered = new_run.Register("run-b");
  EXPECT_EQ(registered.code(), absl::StatusCode::kAlreadyExists)
      << "the node of a stored run with work taken at once: " << registered;
  // Retried as the daemon does, until the stored run's lease has run out.
  while (!registered.ok() && absl::Now() - before_restart < absl::Seconds(30)) {
    absl::SleepFor(absl::Milliseconds(300));
    registered = new_run.Register("run-b");
  }
  ASSERT_TRUE(registered.ok()) << registered;
  EXPECT_GE(absl::Now() - before_restart, absl::Milliseconds(kReconnectLeaseMs));
  ASSERT_TRUE(new_run.Connect("run-b").ok());
  EXPECT_EQ(new_run.id(), old_run.id()) << "the same node keeps its id";

  std::optional<v1::Assignment> again = new_run.NextAssignment();
  ASSERT_TRUE(again.has_value()) << "the job did not run again on the new run";
  EXPECT_EQ(again->job_id(), job->id());
  EXPECT_EQ(again->attempt(), 2);
  EXPECT_THAT(EventMessages(*c, job->id(), "AttemptFailed"), HasSubstr("lost: no message for"));
  FakeWorker stale(c->channel(), "node-reboot", 1);
  EXPECT_EQ(stale.Register("run-a").code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(new_run.ReportRank(job->id(), 2, 0, v1::RANK_STATE_SUCCEEDED).ok());
  EXPECT_EQ(c->WaitForState(job->id(), v1::JOB_STATE_SUCCEEDED).state(), v1::JOB_STATE_SUCCEEDED);
}

// Workers a and b of two slots each; a filler job busy on one slot of a; a gang of 4 waiting for
// it (holding back the jobs behind it); then b's session ends and b is LOST.
struct GangWaitingForAnAwayWorker {
  explicit GangWaitingForAnAwayWorker(CoordinatorUnderTest& c)
      : a(c.channel(), "node-a", 2), b(c.channel(), "node-b", 2) {}
  void SetUp(CoordinatorUnderTest& c) {
    ASSERT_TRUE(a.Join("boot-a").ok());
    ASSERT_TRUE(b.Join("boot-b").ok());
    absl::StatusOr<v1::Job> f = SubmitRunning(c, a, TinySpec(1, 1, "filler"));
    ASSERT_TRUE(f.ok()) << f.status();
    filler = *f;
    absl::StatusOr<v1::Job> g = c.Submit(TinySpec(4, 1, "gang"));
    ASSERT_TRUE(g.ok()) << g.status();
    gang = *g;
    c.WaitForJob(gang.id(), [&](const v1::Job&) { return HasEvent(c, gang.id(), "Waiting"); });
    ASSERT_TRUE(HasEvent(c, gang.id(), "Waiting"));
    b.Disconnect();
    ASSERT_TRUE(c.WaitForWorkerState("node-b", v1::WORKER_STATE_LOST));
  }
  FakeWorker a, b;
  v1::Job filler, gang;
};

// A gang that waits for slots keeps them from the jobs behind it while one of the workers it
// needs is away for less than its lease (a network blip). (Before, the gang no longer fitted the
// READY workers alone, stopped holding back, and a small job took the free slot; once the worker
// was back the gang waited for that job too.)
TEST(CoordinatorWorkerChurnTest, AGangKeepsItsHoldWhileAWorkerIsAwayForLessThanItsLease) {
  auto c = CoordinatorUnderTest::Start("", kReconnectLeaseMs);  // b is back within its lease
  GangWaitingForAnAwayWorker w(*c);
  ASSERT_NO_FATAL_FAILURE(w.SetUp(*c));
  FakeWorker& a = w.a;
  FakeWorker& b = w.b;
  const v1::Job* filler = &w.filler;
  const v1::Job* gang = &w.gang;
  absl::StatusOr<v1::Job> small = c->Submit(TinySpec(1, 1, "small"));
  ASSERT_TRUE(small.ok()) << small.status();
  std::optional<v1::Assignment> backfilled = a.NextAssignment(absl::Milliseconds(1500));
  EXPECT_FALSE(backfilled.has_value())
      << "job " << backfilled->job_id() << " took the slot the gang waits for";
  EXPECT_EQ(c->Get(small->id())->state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(EventMessages(*c, small->id(), "Waiting"), HasSubstr("queued behind"));

  // b is back, the filler ends: the gang goes first, on both workers.
  ASSERT_TRUE(b.Register().ok());
  ASSERT_TRUE(b.Connect("boot-b").ok());
  ASSERT_TRUE(c->WaitForWorkerState("node-b", v1::WORKER_STATE_READY));
  ASSERT_TRUE(a.ReportRank(filler->id(), 1, 0, v1::RANK_STATE_SUCCEEDED).ok());
  std::optional<v1::Assignment> on_a = a.NextAssignment();
  std::optional<v1::Assignment> on_b = b.NextAssignment();
  ASSERT_TRUE(on_a.has_value() && on_b.has_value());
  EXPECT_EQ(on_a->job_id(), gang->id());
  EXPECT_EQ(on_b->job_id(), gang->id());
  EXPECT_EQ(c->Get(small->id())->state(), v1::JOB_STATE_PENDING);
}

// A worker whose daemon keeps registering but never gets a session up again (its Session
// stream fails, or its Hello is refused) is away for one lease from when its session ended, not
// for as long as it registers: then the gang no longer holds the free slots for it, and the job
// behind the gang runs. (Before, each registration renewed its lease, so it counted as away for
// good and the gang blocked its backend's queue.)
TEST(CoordinatorWorkerChurnTest, AWorkerThatOnlyRegistersHoldsNoSlotsPastItsLease) {
  auto c = CoordinatorUnderTest::Start();
  GangWaitingForAnAwayWorker w(*c);
  ASSERT_NO_FATAL_FAILURE(w.SetUp(*c));
  FakeWorker& a = w.a;
  FakeWorker& b = w.b;
  const v1::Job* filler = &w.filler;
  const v1::Job* gang = &w.gang;
  std::atomic<bool> stop{false};
  std::thread registering([&] {
    while (!stop) {
      (void)b.Register();
      absl::SleepFor(absl::Milliseconds(kHeartbeatMs));
    }
  });
  absl::StatusOr<v1::Job> small = c->Submit(TinySpec(1, 1, "small"));
  ASSERT_TRUE(small.ok()) << small.status();
  std::optional<v1::Assignment> placed = a.NextAssignment(absl::Seconds(10));
  stop = true;
  registering.join();
  ASSERT_TRUE(placed.has_value())
      << "the gang still holds the free slot for a worker that only registers";
  EXPECT_EQ(placed->job_id(), small->id());
  EXPECT_EQ(c->Get(gang->id())->state(), v1::JOB_STATE_PENDING);
}

// An attempt that ends before its Assignment reached the worker (cancelled at once): the worker's
// heartbeats written before the Assignment arrived do not list the rank, but the worker still
// starts it when the Assignment comes. The slot stays taken until the worker reports the rank's
// end, so no second job lands beside it. (Before, the next heartbeat freed the slot and the next
// job was placed on it.)
TEST(CoordinatorWorkerChurnTest, ASlotStaysTakenUntilTheWorkerReportsItsRank) {
  auto c = CoordinatorUnderTest::Start();
  FakeWorker w(c->channel(), "node-slot", 1);
  ASSERT_TRUE(w.Join().ok());
  absl::StatusOr<v1::Job> first = c->Submit(TinySpec(1, 1, "first"));
  ASSERT_TRUE(first.ok()) << first.status();
  std::optional<v1::Assignment> assignment = w.NextAssignment();
  ASSERT_TRUE(assignment.has_value());
  ASSERT_EQ(assignment->ranks_size(), 1);
  {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_id(first->id());
    v1::Job cancelled;
    ASSERT_TRUE(c->jobs().CancelJob(&context, request, &cancelled).ok());
    EXPECT_EQ(cancelled.state(), v1::JOB_STATE_CANCELLED);
  }
  absl::StatusOr<v1::Job> second = c->Submit(TinySpec(1, 1, "second"));
  ASSERT_TRUE(second.ok()) << second.status();
  // Several heartbeats (every 200 ms) that do not list the first job's rank.
  std::optional<v1::Assignment> beside = w.NextAssignment(absl::Milliseconds(1500));
  EXPECT_FALSE(beside.has_value())
      << "job " << beside->job_id() << " placed on the slot whose rank is about to start";
  EXPECT_EQ(c->Get(second->id())->state(), v1::JOB_STATE_PENDING);

  // The Assignment arrives: the rank starts, then its cancellation stops it.
  ASSERT_TRUE(w.ReportRank(first->id(), 1, 0, v1::RANK_STATE_STARTING).ok());
  absl::SleepFor(absl::Milliseconds(500));  // heartbeats listing it alive keep the slot too
  EXPECT_FALSE(w.NextAssignment(absl::Milliseconds(1)).has_value());
  ASSERT_TRUE(w.ReportRank(first->id(), 1, 0, v1::RANK_STATE_KILLED).ok());
  std::optional<v1::Assignment> placed = w.NextAssignment();
  ASSERT_TRUE(placed.has_value());
  EXPECT_EQ(placed->job_id(), second->id());
  EXPECT_EQ(placed->ranks(0).slot(), assignment->ranks(0).slot());
}

}  // namespace
}  // namespace dropless::testing
