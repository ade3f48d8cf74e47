// Jobs end to end: the real coordinator, two real workers with one CPU slot each (so the two
// expert-parallel ranks of tiny-cpu run on different workers), real rank processes.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/worker/worker_cluster.h"

namespace dropless::testing {
namespace {

namespace v1 = dropless::v1;

bool Has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

class WorkerJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.StartCoordinator().ok()) << cluster_.Diagnostics();
    for (const char* node : {"node-1", "node-2"}) {
      ASSERT_TRUE(cluster_.StartWorker(node).ok()) << cluster_.Diagnostics();
      ASSERT_TRUE(cluster_
                      .WaitForWorker(node,
                                     [](const v1::Worker& w) {
                                       return w.state() == v1::WORKER_STATE_READY;
                                     },
                                     absl::Seconds(30))
                      .has_value())
          << cluster_.Diagnostics();
    }
  }

  // Submits `spec` and waits until the job has succeeded or failed.
  absl::StatusOr<v1::Job> RunToEnd(const std::string& spec) {
    absl::StatusOr<v1::Job> job = cluster_.Submit(spec);
    if (!job.ok()) return job.status();
    return cluster_.WaitForState(job->id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED},
                                 absl::Seconds(120));
  }
  ::testing::AssertionResult RunToSuccess(const std::string& spec) {
    absl::StatusOr<v1::Job> done = RunToEnd(spec);
    if (!done.ok()) return ::testing::AssertionFailure() << done.status();
    if (done->state() != v1::JOB_STATE_SUCCEEDED) {
      return ::testing::AssertionFailure() << done->message() << cluster_.Diagnostics();
    }
    return ::testing::AssertionSuccess();
  }

  // Submits a long tiny-cpu job and waits until both ranks run; returns its id and rank pids.
  std::string StartLongJob(std::vector<pid_t>* pids) {
    absl::StatusOr<v1::Job> job = cluster_.Submit(TinyCpuSpec(1000000));
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return "";
    absl::StatusOr<v1::Job> running =
        cluster_.WaitForState(job->id(), {v1::JOB_STATE_RUNNING}, absl::Seconds(60));
    EXPECT_TRUE(running.ok() && running->state() == v1::JOB_STATE_RUNNING)
        << (running.ok() ? v1::JobState_Name(running->state()) : running.status().ToString())
        << "\n" << cluster_.Diagnostics();
    *pids = cluster_.RankPidsOf(job->id());
    EXPECT_EQ(pids->size(), 2u) << cluster_.Diagnostics();
    return job->id();
  }

  WorkerCluster cluster_;
};

TEST_F(WorkerJobTest, TinyCpuRunsToSuccessAcrossTwoWorkers) {
  absl::StatusOr<v1::Job> submitted = cluster_.Submit(TinyCpuSpec());
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  std::vector<v1::StepMetrics> metrics;
  absl::StatusOr<v1::Job> job = cluster_.Watch(submitted->id(), absl::Seconds(180), &metrics);
  ASSERT_TRUE(job.ok()) << job.status() << "\n" << cluster_.Diagnostics();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->message() << "\n" << cluster_.Diagnostics();

  // The two ranks ran on different workers.
  ASSERT_EQ(job->placement_size(), 2);
  std::set<std::string> nodes;
  for (const v1::RankPlacement& p : job->placement()) nodes.insert(p.node());
  EXPECT_EQ(nodes, (std::set<std::string>{"node-1", "node-2"}));

  // The loss fell: first vs last step of rank 0 (the loss is averaged over the job's ranks).
  const v1::StepMetrics* first = nullptr;
  const v1::StepMetrics* last = nullptr;
  for (const v1::StepMetrics& m : metrics) {
    if (m.rank() != 0) continue;
    if (first == nullptr || m.step() < first->step()) first = &m;
    if (last == nullptr || m.step() > last->step()) last = &m;
  }
  ASSERT_NE(first, nullptr) << "no step metrics in WatchJob";
  EXPECT_EQ(first->step(), 1);
  EXPECT_EQ(last->step(), 40);
  EXPECT_EQ(last->steps(), 40);
  EXPECT_LT(last->loss(), 0.8 * first->loss()) << "first " << first->loss() << " last " << last->loss();
  EXPECT_GT(last->tflops(), 0);
  EXPECT_GT(last->mfu(), 0);
  EXPECT_LT(last->mfu(), 1);
  EXPECT_GT(last->tokens_per_second(), 0);
  EXPECT_GE(last->load_imbalance(), 1);
  EXPECT_FALSE(last->node().empty());
  // Every step of every rank timed its expert GEMMs by phase; gemm_seconds is their sum.
  for (const v1::StepMetrics& m : metrics) {
    SCOPED_TRACE(absl::StrCat("rank ", m.rank(), " step ", m.step()));
    EXPECT_GT(m.gemm_forward_seconds(), 0);
    EXPECT_GT(m.gemm_dgrad_seconds(), 0);
    EXPECT_GT(m.gemm_wgrad_seconds(), 0);
    EXPECT_NEAR(m.gemm_seconds(),
                m.gemm_forward_seconds() + m.gemm_dgrad_seconds() + m.gemm_wgrad_seconds(),
                1e-12 * (1 + m.gemm_seconds()));
    EXPECT_LE(m.gemm_seconds(), m.step_seconds());
  }

  // Each worker's /metrics has the job's step series for the rank it ran, after the job ended.
  for (const v1::RankPlacement& p : job->placement()) {
    const std::string text = HttpGet(cluster_.metrics_port(p.node()), "/metrics");
    // A CPU slot: DCGM's gpu and UUID labels are empty.
    auto labels_with = [&](const std::string& extra) {
      return absl::StrCat("{Hostname=\"", p.node(), "\",UUID=\"\",gpu=\"\",job_id=\"", job->id(),
                          "\",node=\"", p.node(), "\"", extra, ",rank=\"", p.rank(), "\"}");
    };
    const std::string labels = labels_with("");
    EXPECT_TRUE(Has(text, "dropless_rank_step_duration_seconds_count" + labels + " 40")) << text;
    EXPECT_TRUE(Has(text, "dropless_rank_steps_total" + labels + " 40")) << text;
    // The last step's gauges went with the rank's process (docs/metrics.md).
    EXPECT_FALSE(Has(text, "dropless_rank_loss" + labels)) << text;
    EXPECT_FALSE(Has(text, "dropless_rank_mfu_ratio" + labels)) << text;
    EXPECT_TRUE(Has(text, "dropless_rank_tokens_total" + labels)) << text;
    for (const char* phase : {"forward", "dgrad", "wgrad"}) {
      EXPECT_TRUE(Has(text, absl::StrCat("dropless_rank_expert_gemm_duration_seconds_count",
                                         labels_with(absl::StrCat(",phase=\"", phase, "\"")),
                                         " 40")))
          << phase << "\n" << text;
    }
    EXPECT_TRUE(Has(text, absl::StrCat("dropless_worker_rank_exits_total{node=\"", p.node(),
                                       "\",result=\"succeeded\"} 1")))
        << text;
  }
  EXPECT_TRUE(cluster_.RankPidsOf(job->id()).empty());
}

TEST_F(WorkerJobTest, CancelStopsTheRankProcessesWithinSeconds) {
  std::vector<pid_t> pids;
  const std::string id = StartLongJob(&pids);
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(pids.size(), 2u);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::Job> cancelled = cluster_.Cancel(id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_TRUE(WaitGone(pids, absl::Seconds(10))) << cluster_.Diagnostics();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  absl::StatusOr<v1::Job> job = cluster_.Get(id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::JOB_STATE_CANCELLED);
  // Both workers stay up and report the kill.
  for (const char* node : {"node-1", "node-2"}) {
    EXPECT_TRUE(cluster_.worker(node)->Running());
    std::string text;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline &&
           !Has(text, absl::StrCat("dropless_worker_rank_exits_total{node=\"", node,
                                   "\",result=\"killed\"} 1"))) {
      absl::SleepFor(absl::Milliseconds(100));
      text = HttpGet(cluster_.metrics_port(node), "/metrics");
    }
    EXPECT_TRUE(Has(text, absl::StrCat("dropless_worker_rank_exits_total{node=\"", node,
                                       "\",result=\"killed\"} 1")))
        << text;
    EXPECT_TRUE(Has(text, absl::StrCat("dropless_worker_ranks_running{node=\"", node, "\"} 0")))
        << text;
  }
}

TEST_F(WorkerJobTest, ARankCrashFailsTheJobNotTheWorker) {
  std::vector<pid_t> pids;
  const std::string id = StartLongJob(&pids);
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(kill(pids[0], SIGKILL), 0);
  absl::StatusOr<v1::Job> job =
      cluster_.WaitForState(id, {v1::JOB_STATE_FAILED}, absl::Seconds(60));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED) << cluster_.Diagnostics();
  EXPECT_TRUE(WaitGone(pids, absl::Seconds(20))) << "the other rank must be stopped too\n"
                                                 << cluster_.Diagnostics();
  for (const char* node : {"node-1", "node-2"}) {
    EXPECT_TRUE(cluster_.worker(node)->Running()) << node;
    EXPECT_TRUE(cluster_
                    .WaitForWorker(node,
                                   [](const v1::Worker& w) {
                                     return w.state() == v1::WORKER_STATE_READY &&
                                            w.slots_busy() == 0;
                                   },
                                   absl::Seconds(20))
                    .has_value())
        << node << "\n" << cluster_.Diagnostics();
  }
}

// tiny-cpu with `steps`, checkpointing into the cluster's ckpt/ every `every` steps (0: at its
// end) and allowed 3 attempts.
std::string CheckpointedSpec(const std::string& cluster_dir, int steps, int every = 0) {
  std::string spec = TinyCpuSpec(steps);
  for (auto [from, to] :
       {std::pair<std::string, std::string>{
            "checkpoint: {dir: \"\", every: 0}",
            absl::StrCat("checkpoint: {dir: \"", cluster_dir, "/ckpt\", every: ", every, "}")},
        {"max_attempts: 1", "max_attempts: 3"}}) {
    EXPECT_NE(spec.find(from), std::string::npos) << from;
    spec.replace(spec.find(from), from.size(), to);
  }
  return spec;
}

// A job whose checkpoint.dir holds a longer run's checkpoint (the same spec resubmitted with fewer
// steps) fails naming the directory and the steps, instead of running nothing and succeeding; and
// at once, although it may take 3 attempts: another attempt would meet the same checkpoint.
TEST_F(WorkerJobTest, ACheckpointBeyondTheJobsStepsFailsIt) {
  ASSERT_TRUE(RunToSuccess(CheckpointedSpec(cluster_.dir(), 6)));
  absl::StatusOr<v1::Job> failed = RunToEnd(CheckpointedSpec(cluster_.dir(), 4));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED) << cluster_.Diagnostics();
  EXPECT_NE(failed->message().find("holds step 6, beyond this job's steps (4)"), std::string::npos)
      << failed->message();
  EXPECT_EQ(failed->attempt(), 1) << failed->message();
  EXPECT_NE(failed->message().find("not retried"), std::string::npos) << failed->message();
}

// A damaged checkpoint is found while the engine is built (the rank wraps the engine's error in
// where it happened): it is still the job's error, so the job fails at once instead of meeting the
// same files in two more attempts. Only rank 1's file is damaged: rank 0 fails as a job error too
// (the ranks agree on the outcome of their reads), whichever exit the coordinator hears first.
TEST_F(WorkerJobTest, ADamagedCheckpointFailsTheJobUnretried) {
  ASSERT_TRUE(RunToSuccess(CheckpointedSpec(cluster_.dir(), 4)));
  const std::string data = cluster_.dir() + "/ckpt/rank-1-step-4.safetensors";
  ASSERT_TRUE(std::filesystem::exists(data)) << data;
  std::filesystem::resize_file(data, std::filesystem::file_size(data) / 2);  // a write cut short
  absl::StatusOr<v1::Job> failed = RunToEnd(CheckpointedSpec(cluster_.dir(), 8));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED) << cluster_.Diagnostics();
  EXPECT_NE(failed->message().find("building the cpu engine"), std::string::npos)
      << failed->message();
  EXPECT_TRUE(Has(failed->message(), "rank-1-step-4.safetensors") ||
              Has(failed->message(), "rank 1 could not restore its checkpoint (damaged"))
      << failed->message();
  EXPECT_EQ(failed->attempt(), 1) << failed->message();
  EXPECT_NE(failed->message().find("not retried"), std::string::npos) << failed->message();
}

// A newest checkpoint damaged on one rank while every rank also holds the previous one: the ranks
// all go back to the previous step (and say so) instead of failing the job.
TEST_F(WorkerJobTest, ADamagedNewestCheckpointFallsBackToThePreviousOne) {
  ASSERT_TRUE(RunToSuccess(CheckpointedSpec(cluster_.dir(), 4, 2)));  // steps 4 and 2 kept
  const std::string data = cluster_.dir() + "/ckpt/rank-1-step-4.safetensors";
  ASSERT_TRUE(std::filesystem::exists(data)) << data;
  std::filesystem::resize_file(data, std::filesystem::file_size(data) / 2);
  absl::StatusOr<v1::Job> job = cluster_.Submit(CheckpointedSpec(cluster_.dir(), 8, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::Job> done = cluster_.WaitForState(
      job->id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->message() << cluster_.Diagnostics();
  EXPECT_EQ(done->attempt(), 1);
  absl::StatusOr<std::vector<v1::StepMetrics>> metrics = cluster_.StepMetrics(job->id());
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  ASSERT_FALSE(metrics->empty());
  int64_t first = 1 << 30;
  for (const v1::StepMetrics& m : *metrics) first = std::min<int64_t>(first, m.step());
  EXPECT_EQ(first, 3) << "resumed from step 2, the step before the damaged one";
  absl::StatusOr<std::vector<v1::LogLine>> lines = cluster_.Logs(job->id());
  ASSERT_TRUE(lines.ok()) << lines.status();
  int said = 0;
  for (const v1::LogLine& l : *lines)
    said += Has(l.text(), "every rank resumes from step 2 instead");
  EXPECT_EQ(said, 2) << "each rank says it went back";
}

// A rank of an attempt the coordinator has moved on from (its worker was cut off, say) and the
// next attempt must not both write the rank's checkpoints: the attempt that started last owns
// them, and a rank of an earlier one stops at its next save. Here the record says attempt 2 while
// attempt 1 runs; its rank 0 stops, and attempt 2 claims the directory and trains on.
TEST_F(WorkerJobTest, ARankOfASupersededAttemptStopsInsteadOfSaving) {
  absl::StatusOr<v1::Job> job = cluster_.Submit(CheckpointedSpec(cluster_.dir(), 1000000, 5));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string owner = cluster_.dir() + "/ckpt/owner-rank-0.txt";
  const std::string manifest = cluster_.dir() + "/ckpt/manifest-rank-0.json";
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!(std::filesystem::exists(owner) && std::filesystem::exists(manifest)) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(std::filesystem::exists(manifest)) << cluster_.Diagnostics();
  std::ofstream(owner, std::ios::trunc)
      << "dropless-checkpoint-owner job=" << job->id() << " attempt=2\n";
  absl::StatusOr<v1::Job> second = cluster_.Get(job->id());
  const absl::Time second_by = absl::Now() + absl::Seconds(60);
  while (second.ok() && !(second->attempt() == 2 && second->state() == v1::JOB_STATE_RUNNING) &&
         absl::Now() < second_by) {
    absl::SleepFor(absl::Milliseconds(100));
    second = cluster_.Get(job->id());
  }
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->attempt(), 2) << second->message() << "\n" << cluster_.Diagnostics();
  ASSERT_EQ(second->state(), v1::JOB_STATE_RUNNING) << second->message() << cluster_.Diagnostics();
  // Rank 0 said why it stopped (the attempt's failure may name rank 1 instead, whose exchange with
  // it broke off, if that exit came first).
  bool stopped = false;
  const absl::Time logged_by = absl::Now() + absl::Seconds(10);
  while (!stopped && absl::Now() < logged_by) {
    absl::StatusOr<std::vector<v1::LogLine>> lines = cluster_.Logs(job->id());
    ASSERT_TRUE(lines.ok()) << lines.status();
    for (const v1::LogLine& l : *lines) {
      stopped |= l.attempt() == 1 && l.rank() == 0 &&
                 Has(l.text(), "attempt 2 of this job writes rank 0's checkpoints now");
    }
    if (!stopped) absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(stopped) << cluster_.Diagnostics();
  // Attempt 2 saves on (its record is its own): its manifest moves past where attempt 1 stopped.
  auto read = [&]() {
    std::ifstream in(manifest);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  const std::string before = read();
  const absl::Time saved_by = absl::Now() + absl::Seconds(30);
  while (read() == before && absl::Now() < saved_by) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_NE(read(), before) << cluster_.Diagnostics();
  ASSERT_TRUE(cluster_.Cancel(job->id()).ok());
}

TEST_F(WorkerJobTest, RanksKeepRunningThroughACoordinatorRestart) {
  std::vector<pid_t> pids;
  const std::string id = StartLongJob(&pids);
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(pids.size(), 2u);
  cluster_.KillCoordinator();
  ASSERT_TRUE(cluster_.StartCoordinator().ok()) << cluster_.Diagnostics();
  const int64_t restart_ms = absl::ToUnixMillis(absl::Now());
  for (const char* node : {"node-1", "node-2"}) {
    ASSERT_TRUE(cluster_
                    .WaitForWorker(node,
                                   [&](const v1::Worker& w) {
                                     return w.state() == v1::WORKER_STATE_READY &&
                                            w.last_heartbeat_ms() > restart_ms;
                                   },
                                   absl::Seconds(30))
                    .has_value())
        << node << "\n" << cluster_.Diagnostics();
  }
  // Past the lease timeout the attempt is still the one running: its ranks were reported back.
  absl::SleepFor(absl::Seconds(6));
  EXPECT_FALSE(WaitGone(pids, absl::ZeroDuration())) << cluster_.Diagnostics();
  for (pid_t pid : pids) EXPECT_EQ(kill(pid, 0), 0) << "rank pid " << pid << " is gone";
  absl::StatusOr<v1::Job> job = cluster_.Get(id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING) << job->message() << "\n" << cluster_.Diagnostics();

  ASSERT_TRUE(cluster_.Cancel(id).ok());
  EXPECT_TRUE(WaitGone(pids, absl::Seconds(10))) << cluster_.Diagnostics();
}

TEST_F(WorkerJobTest, SigtermOnAWorkerStopsItsRanks) {
  std::vector<pid_t> pids;
  const std::string id = StartLongJob(&pids);
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_TRUE(cluster_.worker("node-1")->Signal(SIGTERM).ok());
  absl::StatusOr<int> code = cluster_.worker("node-1")->Wait(absl::Seconds(15));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  // node-1's rank is gone with its daemon; the job fails, so node-2's rank is stopped as well.
  EXPECT_TRUE(WaitGone(pids, absl::Seconds(30))) << cluster_.Diagnostics();
  absl::StatusOr<v1::Job> job = cluster_.WaitForState(id, {v1::JOB_STATE_FAILED}, absl::Seconds(30));
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED) << cluster_.Diagnostics();
  // The failure names the daemon that went away, whichever rank's end the coordinator heard first
  // (node-2's, which only saw its peer vanish, or node-1's own stopped rank).
  EXPECT_TRUE(Has(job->message(), "node-1")) << job->message();
  EXPECT_TRUE(Has(job->message(), "the worker daemon got Terminated")) << job->message();
  EXPECT_FALSE(Has(job->message(), "stopped on cancel")) << job->message();
  absl::StatusOr<std::vector<v1::Event>> events = cluster_.Events(id);
  ASSERT_TRUE(events.ok()) << events.status();
  bool leaving = false;
  for (const v1::Event& e : *events)
    leaving |= e.type() == "WorkerLeaving" && Has(e.message(), "node-1");
  EXPECT_TRUE(leaving) << cluster_.Diagnostics();
}

// A worker daemon killed outright says nothing: its session ends, which is recorded on the job,
// and the failure of the peer rank it leaves behind names it as the cause.
TEST_F(WorkerJobTest, ASigkilledWorkerIsNamedInItsPeersFailure) {
  std::vector<pid_t> pids;
  const std::string id = StartLongJob(&pids);
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(cluster_.worker("node-1")->Signal(SIGKILL).ok());
  absl::StatusOr<v1::Job> job =
      cluster_.WaitForState(id, {v1::JOB_STATE_FAILED}, absl::Seconds(60));
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->state(), v1::JOB_STATE_FAILED) << cluster_.Diagnostics();
  EXPECT_TRUE(Has(job->message(), "node-1")) << job->message();
  // Either node-2's rank failed first (its peer vanished) or node-1's lease ran out first.
  EXPECT_TRUE(Has(job->message(), "the worker of node node-1 (rank ") ||
              Has(job->message(), "(node node-1) lost"))
      << job->message();
  absl::StatusOr<std::vector<v1::Event>> events = cluster_.Events(id);
  ASSERT_TRUE(events.ok()) << events.status();
  bool disconnected = false;
  for (const v1::Event& e : *events) {
    disconnected |= e.type() == "WorkerDisconnected" && Has(e.message(), "node-1");
  }
  EXPECT_TRUE(disconnected) << cluster_.Diagnostics();
  EXPECT_TRUE(WaitGone(pids, absl::Seconds(30))) << cluster_.Diagnostics();
}

}  // namespace
}  // namespace dropless::testing
