// The worker daemon's stop against a rank that ignores SIGTERM (a stand-in rank binary, as in
// rank_manager_test.cc): the first signal waits for the grace period, a second one does not.
#include "worker/daemon/daemon_stop.h"

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/daemon/outbound_queue.h"
#include "worker/daemon/rank_manager.h"
#include "worker/daemon/worker_metrics.h"

namespace dropless {
namespace {

namespace v1 = dropless::v1;

// A rank that is ready at once and ignores SIGTERM (its sleeps inherit the ignored disposition).
constexpr char kStubbornRank[] = R"SH(#!/bin/sh
trap '' TERM
echo ready >&3
while :; do sleep 0.05; done
)SH";

class DaemonStopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/dropless-daemon-stop-test-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(system(absl::StrCat("rm -rf '", dir_, "' && mkdir -p '", dir_, "'").c_str()), 0);
    script_ = dir_ + "/stubborn-rank";
    std::ofstream(script_) << kStubbornRank;
    ASSERT_EQ(chmod(script_.c_str(), 0755), 0);
    metrics_ = std::move(*WorkerMetrics::Create("node-a", "127.0.0.1", 0));
  }
  void TearDown() override {
    manager_.reset();
    ASSERT_EQ(system(absl::StrCat("rm -rf '", dir_, "'").c_str()), 0);
  }

  // A manager with `grace` between SIGTERM and SIGKILL, running one stubborn rank.
  void StartStubbornRank(absl::Duration grace) {
    RankManagerOptions o;
    o.rank_binary = script_;
    o.coordinator = "127.0.0.1:7070";
    o.node = "node-a";
    o.advertise_address = "127.0.0.1";
    o.work_dir = dir_ + "/work";
    o.slot_kind = "cpu";
    o.slots = 1;
    o.kill_grace = grace;
    manager_ = std::make_unique<RankManager>(o, &queue_, metrics_.get());
    v1::Assignment a;
    a.set_job_id("stubborn");
    a.set_attempt(1);
    a.set_world_size(1);
    a.set_spec_yaml("name: stubborn\n");
    v1::RankAssignment* r = a.add_ranks();
    r->set_rank(0);
    r->set_slot(0);
    manager_->HandleAssignment(a);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      std::vector<v1::RankStatus> live = manager_->LiveRanks();
      if (live.size() == 1 && live[0].state() == v1::RANK_STATE_RUNNING) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    pids_ = manager_->LivePids();
    ASSERT_EQ(pids_.size(), 1u);
  }

  DaemonStop::SessionHooks Hooks() {
    DaemonStop::SessionHooks hooks;
    hooks.say_goodbye = [this](absl::Duration) { ++goodbyes_; };
    hooks.flushed = [] { return true; };  // no session: nothing to wait for
    return hooks;
  }

  // The final status queued for the rank (state and message), once the stop returned.
  v1::RankStatus FinalStatus() {
    v1::RankStatus last;
    while (auto e = queue_.Peek(absl::Milliseconds(10))) {
      queue_.Pop(e->sequence);
      if (e->message.has_rank_status()) last = e->message.rank_status();
    }
    return last;
  }

  bool RankGone() const {
    for (pid_t pid : pids_) {
      if (kill(pid, 0) == 0) return false;
    }
    return true;
  }

  std::string dir_;
  std::string script_;
  OutboundQueue queue_;
  std::unique_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<RankManager> manager_;
  std::vector<pid_t> pids_;
  int goodbyes_ = 0;
};

sigset_t StopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  return signals;
}

// The first signal alone: SIGTERM is ignored, so the rank ends by SIGKILL after the grace period.
TEST_F(DaemonStopTest, TheFirstSignalAloneWaitsForTheGracePeriod) {
  const absl::Duration grace = absl::Seconds(1);
  ASSERT_NO_FATAL_FAILURE(StartStubbornRank(grace));
  DaemonStop stop(manager_.get(), "the worker daemon got Terminated", grace);
  const absl::Time start = absl::Now();
  stop.Run(Hooks());
  const absl::Duration took = absl::Now() - start;
  EXPECT_FALSE(stop.escalated());
  EXPECT_GE(took, grace - absl::Milliseconds(50));
  EXPECT_LT(took, grace + absl::Seconds(5));
  EXPECT_EQ(goodbyes_, 1);
  EXPECT_TRUE(RankGone());
  const v1::RankStatus status = FinalStatus();
  EXPECT_EQ(status.state(), v1::RANK_STATE_KILLED) << status.ShortDebugString();
  EXPECT_TRUE(absl::StartsWith(status.message(), "stopped: the worker daemon got Terminated"))
      << status.message();
}

// Sends `sig` to this process from another one (as a user or an orchestrator would).
void SignalFromAnotherProcess(int sig) {
  const pid_t self = getpid();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(kill(self, sig) == 0 ? 0 : 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// A second SIGTERM while the daemon waits for the grace period (30 s here) SIGKILLs the rank at
// once and the stop returns within a few seconds, the rank's end still reported as a stop. A
// SIGTERM the daemon sent itself (its session thread does when the session fails) is no second
// signal.
TEST_F(DaemonStopTest, ASecondSignalEndsTheStopWellBeforeTheGracePeriod) {
  // Blocked in every thread (the rank supervisor's too), as RunWorkerDaemon does: the signals
  // below are the watcher's to take, never a default action that ends this test.
  const sigset_t signals = StopSignals();
  sigset_t old_mask;
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &signals, &old_mask), 0);
  const absl::Duration grace = absl::Seconds(30);
  ASSERT_NO_FATAL_FAILURE(StartStubbornRank(grace));
  DaemonStop stop(manager_.get(), "the worker daemon got Terminated", grace);
  std::thread watcher([&stop, &signals] { stop.WatchForSecondSignal(signals); });
  std::thread second_signal([&stop] {
    kill(getpid(), SIGTERM);  // the daemon's own: ignored
    absl::SleepFor(absl::Milliseconds(500));
    EXPECT_FALSE(stop.escalated()) << "a SIGTERM of the daemon's own escalated the stop";
    SignalFromAnotherProcess(SIGTERM);
  });

  const absl::Time start = absl::Now();
  stop.Run(Hooks());
  const absl::Duration took = absl::Now() - start;
  second_signal.join();
  stop.Finish();
  watcher.join();

  EXPECT_TRUE(stop.escalated());
  EXPECT_GE(took, absl::Milliseconds(450));  // it did wait, until the second signal
  EXPECT_LT(took, absl::Seconds(5)) << "waited for the grace period";
  EXPECT_TRUE(RankGone());
  EXPECT_TRUE(manager_->LivePids().empty());
  const v1::RankStatus status = FinalStatus();
  EXPECT_EQ(status.state(), v1::RANK_STATE_KILLED) << status.ShortDebugString();
  EXPECT_TRUE(absl::StartsWith(status.message(), "stopped: the worker daemon got Terminated"))
      << status.message();
  // The manager's destruction does not wait for anything any more.
  const absl::Time destroy = absl::Now();
  manager_.reset();
  EXPECT_LT(absl::Now() - destroy, absl::Seconds(2));
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &old_mask, nullptr), 0);
}

// A second signal before the ranks were even told to stop (during the Goodbye) still ends them as
// stopped by the daemon, at once.
TEST_F(DaemonStopTest, AnEscalationBeforeTheStopBeganSkipsTheGracePeriodToo) {
  const absl::Duration grace = absl::Seconds(30);
  ASSERT_NO_FATAL_FAILURE(StartStubbornRank(grace));
  DaemonStop stop(manager_.get(), "the worker daemon got Interrupt", grace);
  DaemonStop::SessionHooks hooks = Hooks();
  absl::Duration goodbye_timeout;
  hooks.say_goodbye = [&](absl::Duration timeout) {
    goodbye_timeout = timeout;
    stop.Escalate(SIGINT);
    stop.Escalate(SIGINT);  // a third signal: nothing more
  };
  const absl::Time start = absl::Now();
  stop.Run(hooks);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(goodbye_timeout, DaemonStop::kGoodbyeTimeout);
  EXPECT_TRUE(RankGone());
  const v1::RankStatus status = FinalStatus();
  EXPECT_EQ(status.state(), v1::RANK_STATE_KILLED) << status.ShortDebugString();
  EXPECT_TRUE(absl::StartsWith(status.message(), "stopped: the worker daemon got Interrupt"))
      << status.message();
}

// After an escalation the flush of the final statuses gets kEscalatedWait, not kFlushTimeout.
TEST_F(DaemonStopTest, AfterAnEscalationTheFlushIsCutShort) {
  ASSERT_NO_FATAL_FAILURE(StartStubbornRank(absl::Seconds(30)));
  DaemonStop stop(manager_.get(), "stop", absl::Seconds(30));
  DaemonStop::SessionHooks hooks = Hooks();
  hooks.flushed = [] { return false; };  // a coordinator that never takes them
  stop.Escalate(SIGTERM);
  const absl::Time start = absl::Now();
  stop.Run(hooks);
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, DaemonStop::kEscalatedWait - absl::Milliseconds(50));
  EXPECT_LT(took, DaemonStop::kFlushTimeout);
}

}  // namespace
}  // namespace dropless
