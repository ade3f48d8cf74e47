// What a failing store or a restart of the real dropless-coordinator must not lose: a worker's
// rank status is acknowledged only once it is stored (the worker forgets it then), and an
// Assignment whose placement was stored but which never reached the worker's daemon run is sent
// again after a restart rather than costing the job an attempt; a worker that returns with the
// ranks of a failed attempt still running keeps each one's slot busy until it ends. (Suite
// CoordinatorRecoveryTest.)
#include <signal.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"

namespace dropless::testing {
namespace {

// A rank's end whose commit failed (the disk is full) is not acknowledged: the session ends and
// the worker keeps it and sends it again; once acknowledged it is in the store (fsync'ed), so a
// coordinator killed right after knows the rank ended although the worker has forgotten it.
TEST(CoordinatorRecoveryTest, ARankStatusIsAcknowledgedOnlyOnceStored) {
  signal(SIGXFSZ, SIG_IGN);
  auto coordinator = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  FakeWorker w(coordinator->channel(), "node-full", 2);
  ASSERT_TRUE(w.Join().ok());
  absl::StatusOr<v1::Job> job = SubmitRunning(*coordinator, w, TinySpec(2));
  ASSERT_TRUE(job.ok()) << job.status();

  const v1::RankStatus rank0_done = RankStatusOf(job->id(), 1, 0, v1::RANK_STATE_SUCCEEDED);
  ASSERT_NO_FATAL_FAILURE(LimitFileSize(coordinator->process(), 0));
  ASSERT_TRUE(w.Send(QueuedMessage(rank0_done, 1)).ok());
  EXPECT_FALSE(NextAck(w, 1, absl::Seconds(2))) << "acknowledged, yet the store refused it";
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (w.SessionOpen() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(w.SessionOpen()) << "the session goes on without the status stored";

  // Space again: the worker's next session sends the status again (its Hello lists it as ended).
  ASSERT_NO_FATAL_FAILURE(LimitFileSize(coordinator->process(), RLIM_INFINITY));
  (void)w.ReportRank(job->id(), 1, 0, v1::RANK_STATE_SUCCEEDED);  // no session: not delivered
  ASSERT_TRUE(RegisterAgain(w, "boot-1").ok());
  ASSERT_TRUE(w.Connect("boot-1", {rank0_done}).ok());
  ASSERT_TRUE(w.Send(QueuedMessage(rank0_done, 1)).ok());
  ASSERT_TRUE(NextAck(w, 1));

  // Acknowledged, so the worker drops it; killed now, the coordinator still has it.
  w.Disconnect();
  coordinator->KillAndRestart();
  ASSERT_TRUE(RegisterAgain(w, "boot-1").ok());
  ASSERT_TRUE(w.Connect("boot-1").ok());  // lists rank 1 only: rank 0's end was acknowledged
  ASSERT_TRUE(
      w.Send(QueuedMessage(RankStatusOf(job->id(), 1, 1, v1::RANK_STATE_SUCCEEDED), 2)).ok());
  ASSERT_TRUE(NextAck(w, 2));
  v1::Job done = coordinator->WaitForJob(job->id(), [](const v1::Job& j) {
    return j.state() == v1::JOB_STATE_SUCCEEDED || j.state() == v1::JOB_STATE_FAILED;
  });
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.message();
  EXPECT_EQ(done.attempt(), 1);
}

// The coordinator stored a placement and died before its Assignment reached the worker: the
// worker's daemon run (same boot_id, takes_resent_assignments) says Hello without the rank, and
// the restarted coordinator sends the Assignment again instead of failing the attempt.
TEST(CoordinatorRecoveryTest, AnAssignmentLostToACoordinatorRestartIsSentAgain) {
  auto coordinator = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  FakeWorker w(coordinator->channel(), "node-lost", 1);
  w.SetTakesResentAssignments(true);
  ASSERT_TRUE(w.Join().ok());
  absl::StatusOr<v1::Job> job = coordinator->Submit(TinySpec(1));  // max_attempts 1
  ASSERT_TRUE(job.ok()) << job.status();
  std::optional<v1::Assignment> first = w.NextAssignment();
  ASSERT_TRUE(first.has_value());  // as if it never arrived: the worker starts nothing

  w.Disconnect();
  coordinator->KillAndRestart();
  ASSERT_TRUE(RegisterAgain(w, "boot-1").ok());
  ASSERT_TRUE(w.Connect("boot-1").ok());
  std::optional<v1::Assignment> again = w.NextAssignment();
  ASSERT_TRUE(again.has_value()) << "attempt 1 was failed instead: "
                                 << coordinator->Get(job->id())->message();
  EXPECT_EQ(again->SerializeAsString(), first->SerializeAsString());
  EXPECT_TRUE(HasEvent(*coordinator, job->id(), "AssignmentResent"));

  ASSERT_TRUE(w.ReportRank(job->id(), 1, 0, v1::RANK_STATE_RUNNING).ok());
  coordinator->WaitForState(job->id(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(w.ReportRank(job->id(), 1, 0, v1::RANK_STATE_SUCCEEDED).ok());
  v1::Job done = coordinator->WaitForState(job->id(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.attempt(), 1);
}

// Sent again only where the rank cannot have started: to the daemon run it was assigned to, that
// takes resent assignments, and never after the rank was reported. Otherwise the rank is gone and
// its attempt fails: at the same run's Hello, or, where another run comes, when the assigned
// run's lease from the restart runs out.
TEST(CoordinatorRecoveryTest, AnAssignmentIsNotSentAgainWhereTheRankMayHaveRun) {
  struct Case {
    std::string name;
    std::string boot_after;  // the daemon run that says Hello after the restart
    bool takes_resent;
    bool reported;  // the rank was reported STARTING before the restart
  };
  for (const Case& c : {Case{"another daemon run", "boot-2", true, false},
                        Case{"an older daemon", "boot-1", false, false},
                        Case{"a rank reported before", "boot-1", true, true}}) {
    SCOPED_TRACE(c.name);
    auto coordinator = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
    FakeWorker w(coordinator->channel(), "node-gone", 1);
    w.SetTakesResentAssignments(c.takes_resent);
    ASSERT_TRUE(w.Join().ok());
    absl::StatusOr<v1::Job> job = coordinator->Submit(TinySpec(1));
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE(w.NextAssignment().has_value());
    if (c.reported) {
      ASSERT_TRUE(w.ReportRank(job->id(), 1, 0, v1::RANK_STATE_STARTING).ok());
      coordinator->WaitForJob(job->id(), [](const v1::Job&) { return true; });
      absl::SleepFor(absl::Milliseconds(300));  // stored before the kill
    }
    w.Disconnect();
    coordinator->KillAndRestart();
    // The rank died with its daemon: not alive, nothing queued.
    (void)w.ReportRank(job->id(), 1, 0, v1::RANK_STATE_KILLED);
    ASSERT_TRUE(RegisterAgain(w, c.boot_after).ok());
    ASSERT_TRUE(w.Connect(c.boot_after).ok());
    v1::Job failed = coordinator->WaitForState(job->id(), v1::JOB_STATE_FAILED);
    // Another run of the daemon gets the node only once the assigned run's lease from the restart
    // ran out (that run holds work and may be alive: docs/worker_session.md, step 1), and the
    // attempt fails as on any lease expiry; the same run's Hello fails it at once.
    const std::string why = c.boot_after == "boot-1" ? "was not running on node node-gone"
                                                     : "(node node-gone) lost: no message for";
    EXPECT_NE(failed.message().find(why), std::string::npos) << failed.message();
    EXPECT_FALSE(w.NextAssignment(absl::Milliseconds(500)).has_value());
    EXPECT_FALSE(HasEvent(*coordinator, job->id(), "AssignmentResent"));
  }
}

// A worker lost past its lease comes back with both ranks of the failed attempt still running:
// each is a stray, cancelled, and each keeps its slot until it is reported ended, so that no new
// attempt lands on a slot (a GPU) whose old process is still exiting. (Before, the cancellation's
// rate limit, one per attempt, also skipped holding the second rank's slot.)
TEST(CoordinatorRecoveryTest, EveryStrayRankOfAReturningWorkerHoldsItsSlotUntilItEnds) {
  auto coordinator = CoordinatorUnderTest::Start();
  FakeWorker w(coordinator->channel(), "node-stray", 2);
  ASSERT_TRUE(w.Join().ok());
  absl::StatusOr<v1::Job> job = SubmitRunning(*coordinator, w, TinySpec(2));
  ASSERT_TRUE(job.ok()) << job.status();

  w.StopHeartbeats();
  v1::Job failed = coordinator->WaitForState(job->id(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(), ::testing::HasSubstr("no message"));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (w.SessionOpen() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_FALSE(w.SessionOpen());

  // Back, its Hello listing both ranks as running.
  ASSERT_TRUE(RegisterAgain(w, "boot-1").ok());
  ASSERT_TRUE(w.Connect("boot-1").ok());
  std::optional<v1::Cancellation> cancel = w.NextCancellation();
  ASSERT_TRUE(cancel.has_value());
  EXPECT_EQ(cancel->job_id(), job->id());
  EXPECT_EQ(cancel->attempt(), 1);

  absl::StatusOr<v1::Job> next = coordinator->Submit(TinySpec(1, 1, "after-the-strays"));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FALSE(w.NextAssignment(absl::Seconds(2)).has_value())
      << "placed on a slot whose stray rank still runs";
  ASSERT_TRUE(w.ReportRank(job->id(), 1, 1, v1::RANK_STATE_KILLED).ok());
  std::optional<v1::Assignment> placed = w.NextAssignment();
  ASSERT_TRUE(placed.has_value());
  EXPECT_EQ(placed->job_id(), next->id());
}

// The same with a gang larger than the stray lookups one worker message may do (8): one read of
// the attempt holds every rank's slot, so none of the 16 is taken while its stray still runs.
TEST(CoordinatorRecoveryTest, EveryStrayRankOfAGangLargerThanTheLookupBoundHoldsItsSlot) {
  auto coordinator = CoordinatorUnderTest::Start();
  FakeWorker w(coordinator->channel(), "node-gang", 16);
  ASSERT_TRUE(w.Join().ok());
  absl::StatusOr<v1::Job> job = SubmitRunning(*coordinator, w, TinySpec(16));
  ASSERT_TRUE(job.ok()) << job.status();

  w.StopHeartbeats();
  coordinator->WaitForState(job->id(), v1::JOB_STATE_FAILED);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (w.SessionOpen() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_FALSE(w.SessionOpen());

  ASSERT_TRUE(RegisterAgain(w, "boot-1").ok());
  ASSERT_TRUE(w.Connect("boot-1").ok());  // its Hello lists all 16 ranks as running
  absl::StatusOr<v1::Job> next = coordinator->Submit(TinySpec(1, 1, "after-the-gang"));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FALSE(w.NextAssignment(absl::Seconds(2)).has_value())
      << "placed on a slot whose stray rank still runs";
  ASSERT_TRUE(w.ReportRank(job->id(), 1, 11, v1::RANK_STATE_KILLED).ok());
  std::optional<v1::Assignment> placed = w.NextAssignment();
  ASSERT_TRUE(placed.has_value());
  EXPECT_EQ(placed->job_id(), next->id());
  ASSERT_EQ(placed->ranks_size(), 1);
  EXPECT_EQ(placed->ranks(0).slot(), 11) << "the slot rank 11 held";
}

}  // namespace
}  // namespace dropless::testing
