// RankManager against a stand-in rank binary (a shell script honouring the rank command line and
// the report pipe), so the daemon side is tested without the engine.
#include "worker/daemon/rank_manager.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace dropless {
namespace {

namespace v1 = dropless::v1;

constexpr char kFakeRank[] = R"SH(#!/bin/sh
echo "argv: $*"
echo "env: OPENBLAS_NUM_THREADS=$OPENBLAS_NUM_THREADS CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
[ "$1" = rank ] || { echo "error: not started as rank" >&2; exit 9; }
shift
while [ $# -gt 0 ]; do
  case "$1" in
    --job) job=$2 ;; --rank) rank=$2 ;; --spec) spec=$2 ;;
  esac
  shift 2
done
echo "spec: $(cat "$spec")"
report() {
  echo "step=$1 steps=2 loss=$2 aux_loss=0.5 step_seconds=0.25 flops=1e9 tokens=100 dispatch_seconds=0.01 combine_seconds=0.02 gemm_seconds=0.1 gemm_forward_seconds=0.03 gemm_dgrad_seconds=0.04 gemm_wgrad_seconds=0.03 load_imbalance=1.2 expert_tokens=60,40 dispatch_bytes=4096 combine_bytes=4096 device_memory_bytes=0 peak_flops=1e10" >&3
}
case "$job" in
  ok) echo ready >&3; echo "this is not a report" >&3; report 1 2.0; report 2 1.0; echo "rank $rank done"; exit 0 ;;
  fail) echo ready >&3; echo "error: boom on rank $rank" >&2; exit 4 ;;
  hang) echo ready >&3; echo "pid $$"; while :; do sleep 0.05; done ;;
  stubborn) trap '' TERM; echo ready >&3; while :; do sleep 0.05; done ;;
  own-end) trap 'echo "error: out of device memory" >&2; exit 79' TERM; echo ready >&3
           while :; do sleep 0.05; done ;;
esac
exit 7
)SH";

class RankManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/dropless-rank-manager-test-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(system(absl::StrCat("rm -rf '", dir_, "' && mkdir -p '", dir_, "'").c_str()), 0);
    script_ = dir_ + "/fake-rank";
    std::ofstream(script_) << kFakeRank;
    ASSERT_EQ(chmod(script_.c_str(), 0755), 0);
    metrics_ = std::move(*WorkerMetrics::Create("node-a", "127.0.0.1", 0));
    RankManagerOptions o;
    o.rank_binary = script_;
    o.coordinator = "127.0.0.1:7070";
    o.node = "node-a";
    o.advertise_address = "127.0.0.1";
    o.work_dir = dir_ + "/work";
    o.slot_kind = "cpu";
    o.slots = 2;
    o.kill_grace = absl::Milliseconds(500);
    manager_ = std::make_unique<RankManager>(o, &queue_, metrics_.get());
  }
  void TearDown() override {
    manager_.reset();
    ASSERT_EQ(system(absl::StrCat("rm -rf '", dir_, "'").c_str()), 0);
  }

  v1::Assignment Assignment(const std::string& job, std::vector<std::pair<int, int>> rank_slots,
                            int world_size) {
    v1::Assignment a;
    a.set_job_id(job);
    a.set_attempt(1);
    a.set_world_size(world_size);
    a.set_spec_yaml("name: " + job + "\n");
    for (auto [rank, slot] : rank_slots) {
      v1::RankAssignment* r = a.add_ranks();
      r->set_rank(rank);
      r->set_slot(slot);
    }
    return a;
  }

  // Pops messages until `terminal` rank statuses in a final state were seen.
  std::vector<v1::WorkerMessage> CollectUntilEnded(int terminal, absl::Duration timeout) {
    std::vector<v1::WorkerMessage> got;
    const absl::Time deadline = absl::Now() + timeout;
    int ended = 0;
    while (ended < terminal && absl::Now() < deadline) {
      auto e = queue_.Peek(absl::Milliseconds(50));
      if (!e) continue;
      queue_.Pop(e->sequence);
      const v1::WorkerMessage& m = e->message;
      if (m.has_rank_status() && m.rank_status().state() != v1::RANK_STATE_STARTING &&
          m.rank_status().state() != v1::RANK_STATE_RUNNING) {
        ++ended;
      }
      got.push_back(m);
    }
    // Log lines of the end may still sit in an open batch.
    while (auto e = queue_.Peek(OutboundQueue::kLogBatchDelay * 2)) {
      queue_.Pop(e->sequence);
      got.push_back(e->message);
    }
    return got;
  }

  bool WaitRunning(int count, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      int running = 0;
      for (const v1::RankStatus& s : manager_->LiveRanks()) {
        running += s.state() == v1::RANK_STATE_RUNNING;
      }
      if (running == count) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  static std::vector<v1::RankState> StatesOf(const std::vector<v1::WorkerMessage>& msgs, int rank) {
    std::vector<v1::RankState> states;
    for (const v1::WorkerMessage& m : msgs) {
      if (m.has_rank_status() && m.rank_status().rank() == rank) {
        states.push_back(m.rank_status().state());
      }
    }
    return states;
  }

  static std::string LogText(const std::vector<v1::WorkerMessage>& msgs, int rank) {
    std::vector<std::string> lines;
    for (const v1::WorkerMessage& m : msgs) {
      for (const v1::LogLine& l : m.logs().lines()) {
        if (l.rank() == rank) lines.push_back(l.text());
      }
    }
    return absl::StrJoin(lines, "\n");
  }

  std::string dir_;
  std::string script_;
  OutboundQueue queue_;
  std::unique_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<RankManager> manager_;
};

TEST_F(RankManagerTest, RunsRanksToSuccessWithStatusMetricsAndLogs) {
  manager_->HandleAssignment(Assignment("ok", {{0, 0}, {1, 1}}, 2));
  std::vector<v1::WorkerMessage> msgs = CollectUntilEnded(2, absl::Seconds(20));
  for (int rank : {0, 1}) {
    EXPECT_EQ(StatesOf(msgs, rank),
              (std::vector<v1::RankState>{v1::RANK_STATE_STARTING, v1::RANK_STATE_RUNNING,
                                          v1::RANK_STATE_SUCCEEDED}))
        << "rank " << rank;
    const std::string log = LogText(msgs, rank);
    EXPECT_NE(log.find(absl::StrCat("argv: rank --coordinator 127.0.0.1:7070 --job ok --attempt 1 "
                                    "--rank ", rank, " --world-size 2 --slot ", rank, " --spec ")),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("--host 127.0.0.1 --node node-a --report-fd 3"), std::string::npos) << log;
    EXPECT_NE(log.find("env: OPENBLAS_NUM_THREADS=1 CUDA_VISIBLE_DEVICES="), std::string::npos) << log;
    EXPECT_NE(log.find("spec: name: ok"), std::string::npos) << log;
    EXPECT_NE(log.find(absl::StrCat("rank ", rank, " done")), std::string::npos) << log;
  }
  std::vector<v1::StepMetrics> steps;
  for (const v1::WorkerMessage& m : msgs) {
    if (m.has_metrics() && m.metrics().rank() == 0) steps.push_back(m.metrics());
  }
  ASSERT_EQ(steps.size(), 2u);  // the malformed report line was skipped
  EXPECT_EQ(steps[0].job_id(), "ok");
  EXPECT_EQ(steps[0].attempt(), 1);
  EXPECT_EQ(steps[0].step(), 1);
  EXPECT_EQ(steps[1].step(), 2);
  EXPECT_EQ(steps[1].steps(), 2);
  EXPECT_DOUBLE_EQ(steps[0].loss(), 2.0);
  EXPECT_DOUBLE_EQ(steps[1].loss(), 1.0);
  EXPECT_DOUBLE_EQ(steps[1].tflops(), 1e9 / 0.25 / 1e12);
  EXPECT_DOUBLE_EQ(steps[1].mfu(), 1e9 / 0.25 / 1e10);
  ASSERT_EQ(steps[1].expert_tokens_size(), 2);  // the per-expert counts reach the API
  EXPECT_EQ(steps[1].expert_tokens(0), 60);
  EXPECT_EQ(steps[1].dispatch_bytes(), 4096);
  EXPECT_DOUBLE_EQ(steps[1].tokens_per_second(), 400);
  EXPECT_DOUBLE_EQ(steps[1].gemm_seconds(), 0.1);
  EXPECT_DOUBLE_EQ(steps[1].gemm_forward_seconds(), 0.03);
  EXPECT_DOUBLE_EQ(steps[1].gemm_dgrad_seconds(), 0.04);
  EXPECT_DOUBLE_EQ(steps[1].gemm_wgrad_seconds(), 0.03);
  EXPECT_DOUBLE_EQ(steps[1].load_imbalance(), 1.2);
  EXPECT_EQ(steps[1].node(), "node-a");
  EXPECT_GT(steps[1].time_ms(), 0);

  std::ifstream spec(dir_ + "/work/jobs/ok/attempt-1/spec.yaml");
  std::string spec_text((std::istreambuf_iterator<char>(spec)), std::istreambuf_iterator<char>());
  EXPECT_EQ(spec_text, "name: ok\n");
  std::ifstream log(dir_ + "/work/jobs/ok/attempt-1/rank-1.log");
  std::string log_text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(log_text.find("rank 1 done"), std::string::npos) << log_text;

  EXPECT_TRUE(manager_->LiveRanks().empty());
  const std::string exposition = metrics_->Serialize();
  EXPECT_NE(exposition.find("dropless_rank_steps_total{Hostname=\"node-a\",UUID=\"\",gpu=\"\","
                            "job_id=\"ok\",node=\"node-a\",rank=\"1\"} 2"),
            std::string::npos)
      << exposition;
  EXPECT_NE(exposition.find("dropless_worker_rank_exits_total{node=\"node-a\",result=\"succeeded\"} 2"),
            std::string::npos)
      << exposition;
  EXPECT_NE(exposition.find("dropless_worker_slots{node=\"node-a\",state=\"free\"} 2"),
            std::string::npos)
      << exposition;
}

TEST_F(RankManagerTest, FailingRankReportsExitCodeAndItsLastWords) {
  manager_->HandleAssignment(Assignment("fail", {{1, 0}}, 2));
  std::vector<v1::WorkerMessage> msgs = CollectUntilEnded(1, absl::Seconds(20));
  ASSERT_FALSE(msgs.empty());
  const v1::RankStatus* last = nullptr;
  for (const v1::WorkerMessage& m : msgs) {
    if (m.has_rank_status()) last = &m.rank_status();
  }
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->state(), v1::RANK_STATE_FAILED);
  EXPECT_EQ(last->exit_code(), 4);
  EXPECT_EQ(last->rank(), 1);
  EXPECT_NE(last->message().find("exit code 4"), std::string::npos) << last->message();
  EXPECT_NE(last->message().find("boom on rank 1"), std::string::npos) << last->message();
}

TEST_F(RankManagerTest, CancellationStopsTheAttemptsRanksOnly) {
  manager_->HandleAssignment(Assignment("hang", {{0, 0}}, 1));
  manager_->HandleAssignment(Assignment("stubborn", {{0, 1}}, 1));
  ASSERT_TRUE(WaitRunning(2, absl::Seconds(10)));
  std::vector<pid_t> pids = manager_->LivePids();
  ASSERT_EQ(pids.size(), 2u);

  v1::Cancellation other;
  other.set_job_id("hang");
  other.set_attempt(2);  // not the running attempt: nothing happens
  manager_->HandleCancellation(other);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(manager_->LiveRanks().size(), 2u);

  const absl::Time start = absl::Now();
  v1::Cancellation cancel;
  cancel.set_job_id("hang");
  cancel.set_attempt(1);
  manager_->HandleCancellation(cancel);
  v1::Cancellation cancel_all;
  cancel_all.set_job_id("stubborn");  // attempt 0: every attempt
  manager_->HandleCancellation(cancel_all);
  std::vector<v1::WorkerMessage> msgs = CollectUntilEnded(2, absl::Seconds(10));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  int killed = 0;
  for (const v1::WorkerMessage& m : msgs) {
    if (m.has_rank_status() && m.rank_status().state() == v1::RANK_STATE_KILLED) {
      ++killed;
      if (m.rank_status().job_id() == "stubborn") {
        EXPECT_EQ(m.rank_status().exit_code(), 128 + SIGKILL);  // ignored SIGTERM
      } else {
        EXPECT_EQ(m.rank_status().exit_code(), 128 + SIGTERM);
      }
    }
  }
  EXPECT_EQ(killed, 2);
  for (pid_t pid : pids) EXPECT_NE(kill(pid, 0), 0) << "pid " << pid << " still exists";
  EXPECT_TRUE(manager_->LiveRanks().empty());
}

// A rank that ends with an exit code of its own while a cancel is on its way (its failure racing
// the peer's that led to the cancel; ranks handle no SIGTERM) is reported FAILED with that code,
// not KILLED: the coordinator records it (a 79 moves the job to larger GPUs). The trap stands in
// for the race: the exit code comes after the stop's SIGTERM.
TEST_F(RankManagerTest, AnExitCodeDuringACancelIsTheRanksOwnFailure) {
  manager_->HandleAssignment(Assignment("own-end", {{0, 0}}, 1));
  ASSERT_TRUE(WaitRunning(1, absl::Seconds(10)));
  v1::Cancellation cancel;
  cancel.set_job_id("own-end");
  cancel.set_attempt(1);
  manager_->HandleCancellation(cancel);
  std::vector<v1::WorkerMessage> msgs = CollectUntilEnded(1, absl::Seconds(10));
  const v1::RankStatus* last = nullptr;
  for (const v1::WorkerMessage& m : msgs) {
    if (m.has_rank_status()) last = &m.rank_status();
  }
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->state(), v1::RANK_STATE_FAILED) << last->ShortDebugString();
  EXPECT_EQ(last->exit_code(), 79);
  EXPECT_NE(last->message().find("out of device memory"), std::string::npos) << last->message();
}

// The daemon's Hello lists LiveRanks() and then the ended statuses still queued: a rank ending
// meanwhile must be in one of the two (its status is queued before it leaves the live list), or
// the coordinator would take it for missing and fail its attempt. Each round races the check
// against two ranks that end at once; a rank in neither list fails the test.
TEST_F(RankManagerTest, AnEndingRankIsAlwaysListedLiveOrQueuedAsEnded) {
  auto ended = [](v1::RankState state) {
    return state == v1::RANK_STATE_SUCCEEDED || state == v1::RANK_STATE_FAILED ||
           state == v1::RANK_STATE_KILLED;
  };
  for (int round = 0; round < 10; ++round) {
    v1::Assignment assignment = Assignment("ok", {{0, 0}, {1, 1}}, 2);
    assignment.set_attempt(round + 1);
    manager_->HandleAssignment(assignment);
    int ended_seen = 0;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (ended_seen < 2 && absl::Now() < deadline) {
      const std::vector<v1::RankStatus> live = manager_->LiveRanks();
      const std::vector<v1::RankStatus> queued = queue_.PendingRankStatuses();
      ended_seen = 0;
      for (int rank : {0, 1}) {
        bool listed = false;
        for (const v1::RankStatus& s : live) listed |= s.rank() == rank;
        for (const v1::RankStatus& s : queued) {
          if (s.attempt() == round + 1 && s.rank() == rank && ended(s.state())) {
            listed = true;
            ++ended_seen;
          }
        }
        ASSERT_TRUE(listed) << "round " << round << ": rank " << rank
                            << " neither live nor queued as ended";
      }
    }
    ASSERT_EQ(ended_seen, 2) << "round " << round;
    ASSERT_TRUE(manager_->LiveRanks().empty());
    while (auto e = queue_.Peek(absl::ZeroDuration())) queue_.Pop(e->sequence);  // next round
    // Log lines of the end may still sit in an open batch.
    while (auto e = queue_.Peek(OutboundQueue::kLogBatchDelay * 2)) queue_.Pop(e->sequence);
  }
}

TEST_F(RankManagerTest, DuplicateAssignmentIsIgnoredAndLiveRanksAreListed) {
  manager_->HandleAssignment(Assignment("hang", {{0, 0}}, 1));
  ASSERT_TRUE(WaitRunning(1, absl::Seconds(10)));
  manager_->HandleAssignment(Assignment("hang", {{0, 0}}, 1));  // e.g. resent after a reconnect
  std::vector<v1::RankStatus> live = manager_->LiveRanks();
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].job_id(), "hang");
  EXPECT_EQ(live[0].attempt(), 1);
  EXPECT_EQ(live[0].state(), v1::RANK_STATE_RUNNING);
  EXPECT_TRUE(manager_->StopAllAndWait(absl::Seconds(5)));
  EXPECT_TRUE(manager_->LiveRanks().empty());
}

// An Assignment that comes again (a coordinator resends one it placed but never heard of) never
// starts a rank twice: one that already ran and ended, its statuses still queued (not yet
// acknowledged), is not started again. Once the coordinator acknowledged them it knows the rank
// and sends nothing again; a fresh assignment of another attempt starts as usual.
TEST_F(RankManagerTest, AssignmentOfARankWithAQueuedStatusIsNotStartedAgain) {
  manager_->HandleAssignment(Assignment("ok", {{0, 0}}, 1));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  auto ended = [&] {
    for (const v1::RankStatus& s : queue_.PendingRankStatuses()) {
      if (s.state() == v1::RANK_STATE_SUCCEEDED) return true;
    }
    return false;
  };
  while (!ended() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(ended());
  ASSERT_TRUE(manager_->LiveRanks().empty());
  const size_t queued = queue_.size();

  manager_->HandleAssignment(Assignment("ok", {{0, 0}}, 1));  // the same attempt again
  EXPECT_TRUE(manager_->LiveRanks().empty()) << "rank 0 of attempt 1 started a second time";
  EXPECT_EQ(queue_.size(), queued) << "nothing new to report";

  v1::Assignment next = Assignment("ok", {{0, 0}}, 1);
  next.set_attempt(2);
  manager_->HandleAssignment(next);
  std::vector<v1::WorkerMessage> got = CollectUntilEnded(2, absl::Seconds(20));
  int starts_of_attempt_2 = 0;
  for (const v1::WorkerMessage& m : got) {
    starts_of_attempt_2 += m.has_rank_status() && m.rank_status().attempt() == 2 &&
                           m.rank_status().state() == v1::RANK_STATE_STARTING;
  }
  EXPECT_EQ(starts_of_attempt_2, 1);
}

// A daemon that stops: its ranks end KILLED "stopped: <why>" (not "on cancel"), and an
// assignment that arrives meanwhile starts nothing and fails "not started: <why>".
TEST_F(RankManagerTest, StoppingKillsRanksWithTheReasonAndStartsNoMore) {
  manager_->HandleAssignment(Assignment("hang", {{0, 0}}, 1));
  ASSERT_TRUE(WaitRunning(1, absl::Seconds(10)));
  EXPECT_TRUE(manager_->StopAllAndWait(absl::Seconds(5), "the worker daemon got Terminated"));
  manager_->HandleAssignment(Assignment("late", {{0, 1}}, 1));
  EXPECT_TRUE(manager_->LiveRanks().empty());
  std::vector<v1::WorkerMessage> msgs = CollectUntilEnded(2, absl::Seconds(5));
  std::vector<std::string> ends;
  for (const v1::WorkerMessage& m : msgs) {
    if (!m.has_rank_status()) continue;
    const v1::RankStatus& st = m.rank_status();
    if (st.state() == v1::RANK_STATE_KILLED || st.state() == v1::RANK_STATE_FAILED) {
      ends.push_back(
          absl::StrCat(st.job_id(), " ", v1::RankState_Name(st.state()), " ", st.message()));
    }
  }
  ASSERT_EQ(ends.size(), 2u) << ::testing::PrintToString(ends);
  EXPECT_EQ(ends[0].rfind("hang RANK_STATE_KILLED stopped: the worker daemon got Terminated (", 0),
            0u)
      << ends[0];
  EXPECT_EQ(ends[1], "late RANK_STATE_FAILED not started: the worker daemon got Terminated");
}

// How many of this process's file descriptors are open on `path`.
int OpenDescriptorsOn(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path target = fs::weakly_canonical(path, ec);
  int count = 0;
  for (const fs::directory_entry& fd : fs::directory_iterator("/proc/self/fd", ec)) {
    std::error_code link_ec;
    count += fs::read_symlink(fd.path(), link_ec) == target;
  }
  return count;
}

// An Assignment racing the daemon's stop: the stop begins after HandleAssignment looked for one
// and before the rank is added (here while it writes the spec file: a FIFO whose pipe is full
// holds it up). The rank is refused "not started: <why>"; added, it would never get its SIGTERM.
TEST_F(RankManagerTest, AnAssignmentRacingTheStopStartsNothing) {
  const std::string attempt_dir = dir_ + "/work/jobs/hang/attempt-1";
  std::filesystem::create_directories(attempt_dir);
  const std::string fifo = attempt_dir + "/spec.yaml.tmp";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  int filler = open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(filler, 0);
  const std::string chunk(4096, 'x');
  while (write(filler, chunk.data(), chunk.size()) > 0) {
  }
  std::thread assign([&] { manager_->HandleAssignment(Assignment("hang", {{0, 0}}, 1)); });
  // Its spec file open (past its look for a stop), its write waiting for room in the pipe.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (OpenDescriptorsOn(fifo) < 3 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(OpenDescriptorsOn(fifo), 3);
  EXPECT_TRUE(manager_->StopAllAndWait(absl::Seconds(5), "the worker daemon got Terminated"));
  close(filler);
  fcntl(reader, F_SETFL, O_RDONLY);  // blocking: read to the end, the spec writer's close
  char buffer[4096];
  while (read(reader, buffer, sizeof buffer) > 0) {
  }
  close(reader);
  assign.join();
  EXPECT_TRUE(manager_->LiveRanks().empty()) << "a rank started after the stop";
  std::vector<std::string> ends;
  for (const v1::WorkerMessage& m : CollectUntilEnded(1, absl::Seconds(5))) {
    if (m.has_rank_status() && m.rank_status().state() != v1::RANK_STATE_STARTING) {
      ends.push_back(absl::StrCat(v1::RankState_Name(m.rank_status().state()), " ",
                                  m.rank_status().message()));
    }
  }
  EXPECT_EQ(ends, std::vector<std::string>{
                      "RANK_STATE_FAILED not started: the worker daemon got Terminated"});
}

// An Assignment that comes again while the daemon stops (a coordinator resends it after a
// reconnect) for a rank that already ended here, its status still queued: it is ignored, not
// refused. A refusal would queue a FAILED behind the rank's real end.
TEST_F(RankManagerTest, AResentAssignmentOfAReportedRankIsIgnoredEvenWhileStopping) {
  manager_->HandleAssignment(Assignment("hang", {{0, 0}}, 1));
  ASSERT_TRUE(WaitRunning(1, absl::Seconds(10)));
  EXPECT_TRUE(manager_->StopAllAndWait(absl::Seconds(5), "the worker daemon got Terminated"));
  manager_->HandleAssignment(Assignment("hang", {{0, 0}}, 1));
  std::vector<v1::RankState> ends;
  for (const v1::RankState state : StatesOf(CollectUntilEnded(2, absl::Seconds(2)), 0)) {
    if (state == v1::RANK_STATE_KILLED || state == v1::RANK_STATE_FAILED) ends.push_back(state);
  }
  EXPECT_EQ(ends, std::vector<v1::RankState>{v1::RANK_STATE_KILLED})
      << "the resent assignment queued a second end for rank 0";
}

TEST_F(RankManagerTest, BadAssignmentsFailWithoutStartingAnything) {
  manager_->HandleAssignment(Assignment("ok", {{0, 5}, {3, 0}}, 2));  // slot 5 of 2; rank 3 of 2
  std::vector<v1::WorkerMessage> msgs = CollectUntilEnded(2, absl::Seconds(5));
  std::vector<std::string> messages;
  for (const v1::WorkerMessage& m : msgs) {
    ASSERT_TRUE(m.has_rank_status());
    EXPECT_EQ(m.rank_status().state(), v1::RANK_STATE_FAILED);
    messages.push_back(m.rank_status().message());
  }
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_NE(messages[0].find("slot 5"), std::string::npos) << messages[0];
  EXPECT_NE(messages[1].find("rank 3"), std::string::npos) << messages[1];
  EXPECT_TRUE(manager_->LiveRanks().empty());
}

TEST_F(RankManagerTest, OldJobDirectoriesArePrunedLiveOnesKept) {
  RankManagerOptions o;
  o.rank_binary = script_;
  o.coordinator = "127.0.0.1:7070";
  o.node = "node-a";
  o.advertise_address = "127.0.0.1";
  o.work_dir = dir_ + "/prune";
  o.slot_kind = "cpu";
  o.slots = 2;
  o.retained_job_dirs = 2;
  RankManager manager(o, &queue_, metrics_.get());
  auto exists = [&](const std::string& job) {
    return access((o.work_dir + "/jobs/" + job).c_str(), F_OK) == 0;
  };
  manager.HandleAssignment(Assignment("hang", {{0, 0}}, 1));  // stays live
  for (const char* job : {"ok", "fail"}) {
    absl::SleepFor(absl::Milliseconds(20));  // distinct modification times
    manager.HandleAssignment(Assignment(job, {{0, 1}}, 1));
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (manager.LiveRanks().size() > 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  }
  // Three directories, two kept: the oldest without a live rank ("ok") went.
  EXPECT_TRUE(exists("hang")) << "a job with a live rank keeps its directory";
  EXPECT_FALSE(exists("ok"));
  EXPECT_TRUE(exists("fail"));
  absl::SleepFor(absl::Milliseconds(20));
  manager.HandleAssignment(Assignment("new", {{0, 1}}, 1));
  EXPECT_TRUE(exists("hang"));
  EXPECT_FALSE(exists("fail"));
  EXPECT_TRUE(exists("new"));
  EXPECT_TRUE(manager.StopAllAndWait(absl::Seconds(10)));
}

// Finished jobs' directories are also bounded by their bytes (retained_job_bytes): the oldest
// go first until the rest fit, whatever their count; a live job's directory stays however large.
TEST_F(RankManagerTest, OldJobDirectoriesArePrunedToTheByteBudget) {
  RankManagerOptions o;
  o.rank_binary = script_;
  o.coordinator = "127.0.0.1:7070";
  o.node = "node-a";
  o.advertise_address = "127.0.0.1";
  o.work_dir = dir_ + "/prune-bytes";
  o.slot_kind = "cpu";
  o.slots = 2;
  o.retained_job_dirs = 100;
  o.retained_job_bytes = (3 << 20) + (1 << 19);  // three of the 1 MiB logs below, and their specs
  RankManager manager(o, &queue_, metrics_.get());
  const std::string jobs = o.work_dir + "/jobs/";
  auto exists = [&](const std::string& job) { return access((jobs + job).c_str(), F_OK) == 0; };
  // A file of `bytes` random bytes in the job's directory (a rank's log, as it would be).
  std::mt19937_64 rng(std::random_device{}());
  auto fill = [&](const std::string& job, size_t bytes) {
    std::string data(bytes, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    std::ofstream(jobs + job + "/attempt-1/rank-0.log", std::ios::binary) << data;
  };
  manager.HandleAssignment(Assignment("hang", {{0, 0}}, 1));  // stays live
  ASSERT_EQ(manager.LiveRanks().size(), 1u);
  fill("hang", 8 << 20);  // over the budget by itself: live, never removed, not counted
  std::vector<std::string> done;
  for (int j = 0; j < 5; ++j) {
    const std::string job = absl::StrCat("ok-", j);
    absl::SleepFor(absl::Milliseconds(20));  // distinct modification times
    v1::Assignment ok = Assignment("ok", {{0, 1}}, 1);  // the fake rank's "ok" mode
    ok.set_attempt(j + 1);  // a new attempt each round: the same one again would be ignored
    manager.HandleAssignment(ok);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (manager.LiveRanks().size() > 1 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    // The finished job's directory, renamed to this round's name with 1 MiB in it.
    std::filesystem::rename(jobs + "ok", jobs + job);
    std::filesystem::rename(jobs + job + absl::StrCat("/attempt-", j + 1), jobs + job + "/attempt-1");
    fill(job, 1 << 20);
    done.push_back(job);
  }
  absl::SleepFor(absl::Milliseconds(20));
  manager.HandleAssignment(Assignment("new", {{0, 1}}, 1));
  // Five finished MiB against a 3 MiB budget: the two oldest went.
  EXPECT_TRUE(exists("hang"));
  EXPECT_TRUE(exists("new"));
  for (int j = 0; j < 5; ++j) EXPECT_EQ(exists(done[j]), j >= 2) << done[j];
  EXPECT_TRUE(manager.StopAllAndWait(absl::Seconds(10)));
}

TEST_F(RankManagerTest, CudaSlotsMapThroughTheDaemonsVisibleDevices) {
  RankManagerOptions o;
  o.rank_binary = script_;
  o.coordinator = "127.0.0.1:7070";
  o.node = "node-a";
  o.advertise_address = "127.0.0.1";
  o.work_dir = dir_ + "/cuda";
  o.slot_kind = "cuda";
  o.slots = 2;
  setenv("CUDA_VISIBLE_DEVICES", "5,7", 1);
  {
    RankManager manager(o, &queue_, metrics_.get());
    manager.HandleAssignment(Assignment("ok", {{0, 1}}, 1));
    std::vector<v1::WorkerMessage> msgs = CollectUntilEnded(1, absl::Seconds(20));
    // Slot 1 of a daemon that sees devices 5,7 is device 7.
    EXPECT_NE(LogText(msgs, 0).find("CUDA_VISIBLE_DEVICES=7"),
              std::string::npos)
        << LogText(msgs, 0);
  }
  unsetenv("CUDA_VISIBLE_DEVICES");
  RankManager manager(o, &queue_, metrics_.get());
  manager.HandleAssignment(Assignment("ok", {{0, 1}}, 1));
  std::vector<v1::WorkerMessage> msgs = CollectUntilEnded(1, absl::Seconds(20));
  EXPECT_NE(LogText(msgs, 0).find("CUDA_VISIBLE_DEVICES=1"), std::string::npos) << LogText(msgs, 0);
}

TEST(SafePathComponentTest, KeepsIdsInsideTheWorkDir) {
  EXPECT_EQ(SafePathComponent("job-00012"), "job-00012");
  EXPECT_EQ(SafePathComponent("../../etc"), ".._.._etc");
  EXPECT_EQ(SafePathComponent(".."), "_..");
  EXPECT_EQ(SafePathComponent(""), "_");
}

}  // namespace
}  // namespace dropless
