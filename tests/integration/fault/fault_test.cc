// Fault tests (ctest label `fault`): real coordinator, worker daemons and rank processes on
// loopback, killed with SIGKILL mid-job, and a burst of parallel submits. Each test is bounded in
// time and prints its figure (recovery time, submits per second) as a "FAULT-FIGURE" line.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "dropless/v1/job_service.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"
#include "tests/integration/worker/worker_cluster.h"

namespace dropless::testing {
namespace {

namespace v1 = dropless::v1;

void Figure(const std::string& text) {
  std::printf("FAULT-FIGURE %s\n", text.c_str());
  std::fflush(stdout);
  ::testing::Test::RecordProperty("figure", text);
}

bool ReadyWorker(const v1::Worker& w) { return w.state() == v1::WORKER_STATE_READY; }

void StartWorkers(WorkerCluster& cluster, const std::vector<std::string>& nodes) {
  for (const std::string& node : nodes) {
    ASSERT_TRUE(cluster.StartWorker(node).ok()) << cluster.Diagnostics();
  }
  for (const std::string& node : nodes) {
    ASSERT_TRUE(cluster.WaitForWorker(node, ReadyWorker, absl::Seconds(30)).has_value())
        << cluster.Diagnostics();
  }
}

// The highest step of any rank of `attempt` (0: any attempt) the coordinator stored.
int64_t LatestStep(WorkerCluster& cluster, const std::string& job_id, int attempt = 0) {
  absl::StatusOr<std::vector<v1::StepMetrics>> metrics = cluster.StepMetrics(job_id);
  int64_t latest = 0;
  if (!metrics.ok()) return latest;
  for (const v1::StepMetrics& m : *metrics) {
    if (attempt == 0 || m.attempt() == attempt) latest = std::max(latest, m.step());
  }
  return latest;
}

// Waits until the job's stored step passes `step` (of `attempt`); the time it took, or nullopt.
std::optional<absl::Duration> WaitForStepPast(WorkerCluster& cluster, const std::string& job_id,
                                              int64_t step, absl::Duration timeout,
                                              int attempt = 0) {
  const absl::Time start = absl::Now();
  while (absl::Now() - start < timeout) {
    if (LatestStep(cluster, job_id, attempt) > step) return absl::Now() - start;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return std::nullopt;
}

TEST(FaultTest, CoordinatorKilledMidJobRestartsAndTheJobCompletes) {
  WorkerCluster cluster;
  cluster.set_lease_timeout(absl::Seconds(20));  // the daemons reconnect after the restart
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.Diagnostics();
  StartWorkers(cluster, {"node-1", "node-2"});
  absl::StatusOr<v1::Job> job = cluster.Submit(TinyCpuSpec(600));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitForStepPast(cluster, job->id(), 20, absl::Seconds(60)).has_value())
      << cluster.Diagnostics();
  const std::vector<pid_t> ranks = cluster.RankPidsOf(job->id());
  ASSERT_EQ(ranks.size(), 2u);

  cluster.KillCoordinator();
  absl::SleepFor(absl::Seconds(1));  // the ranks keep training meanwhile
  const absl::Time restart = absl::Now();
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.Diagnostics();
  const int64_t before = LatestStep(cluster, job->id());
  std::optional<absl::Duration> resumed =
      WaitForStepPast(cluster, job->id(), before, absl::Seconds(60));
  ASSERT_TRUE(resumed.has_value()) << cluster.Diagnostics();
  Figure(absl::StrFormat("coordinator SIGKILL: restart -> step metrics flowing again in %.2f s",
                         absl::ToDoubleSeconds(absl::Now() - restart)));

  absl::StatusOr<v1::Job> done =
      cluster.WaitForState(job->id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED},
                           absl::Seconds(180));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->message() << cluster.Diagnostics();
  EXPECT_EQ(done->attempt(), 1) << "the running attempt was re-attached, not restarted";
  // No step of any rank is lost, the ones run while the coordinator was down included. (A record
  // stored just before the kill but not yet acknowledged is stored again by the successor: the
  // documented at-least-once window, counted here.)
  absl::StatusOr<std::vector<v1::StepMetrics>> metrics = cluster.StepMetrics(job->id());
  ASSERT_TRUE(metrics.ok());
  std::map<std::pair<int, int64_t>, int> copies;
  for (const v1::StepMetrics& m : *metrics) ++copies[{m.rank(), m.step()}];
  EXPECT_EQ(copies.size(), 2u * 600u);
  int twice = 0;
  for (const auto& [key, n] : copies) twice += n > 1 ? 1 : 0;
  EXPECT_LE(twice, 20);
  Figure(absl::StrFormat("coordinator SIGKILL: job %s SUCCEEDED in attempt %d; %d of %d step "
                         "records present, %d stored twice",
                         done->id(), done->attempt(), copies.size(), 2 * 600, twice));
}

TEST(FaultTest, WorkerKilledMidJobTheJobCompletesFromItsCheckpoint) {
  WorkerCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.Diagnostics();
  // Three one-slot workers: the retry finds two without waiting for the dead one.
  StartWorkers(cluster, {"node-1", "node-2", "node-3"});
  std::string spec = TinyCpuSpec(400);
  auto replace = [&](const std::string& from, const std::string& to) {
    ASSERT_NE(spec.find(from), std::string::npos) << from;
    spec.replace(spec.find(from), from.size(), to);
  };
  replace("max_attempts: 1", "max_attempts: 3");
  replace("checkpoint: {dir: \"\", every: 0}",
          absl::StrCat("checkpoint: {dir: \"", cluster.dir(), "/ckpt\", every: 20}"));
  absl::StatusOr<v1::Job> job = cluster.Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitForStepPast(cluster, job->id(), 60, absl::Seconds(90)).has_value())
      << cluster.Diagnostics();
  absl::StatusOr<v1::Job> running = cluster.Get(job->id());
  ASSERT_TRUE(running.ok());
  ASSERT_EQ(running->placement_size(), 2);
  const std::string victim = running->placement(1).node();

  ASSERT_TRUE(cluster.worker(victim)->Signal(SIGKILL).ok());
  const absl::Time killed = absl::Now();
  const int64_t at_kill = LatestStep(cluster, job->id(), 1);
  std::optional<absl::Duration> recovered =
      WaitForStepPast(cluster, job->id(), 0, absl::Seconds(120), /*attempt=*/2);
  ASSERT_TRUE(recovered.has_value()) << cluster.Diagnostics();
  Figure(absl::StrFormat("worker SIGKILL (%s) at step %d: first step of attempt 2 after %.2f s "
                         "(lease 5 s)",
                         victim, at_kill, absl::ToDoubleSeconds(absl::Now() - killed)));

  absl::StatusOr<v1::Job> done =
      cluster.WaitForState(job->id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED},
                           absl::Seconds(180));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->message() << cluster.Diagnostics();
  EXPECT_EQ(done->attempt(), 2);
  for (const v1::RankPlacement& p : done->placement()) EXPECT_NE(p.node(), victim);

  // Attempt 2 resumed from the last checkpoint (a multiple of 20 at or before the kill), and the
  // loss curve goes on from there: its first loss matches attempt 1's loss at that step.
  absl::StatusOr<std::vector<v1::StepMetrics>> metrics = cluster.StepMetrics(job->id());
  ASSERT_TRUE(metrics.ok());
  std::map<std::pair<int, int64_t>, double> loss;  // (attempt, step) of rank 0
  int64_t first_resumed = 0;
  for (const v1::StepMetrics& m : *metrics) {
    if (m.rank() != 0) continue;
    loss[{m.attempt(), m.step()}] = m.loss();
    if (m.attempt() == 2 && (first_resumed == 0 || m.step() < first_resumed)) {
      first_resumed = m.step();
    }
  }
  ASSERT_GT(first_resumed, 1) << "attempt 2 started from scratch";
  EXPECT_EQ((first_resumed - 1) % 20, 0);
  EXPECT_LE(first_resumed - 1, at_kill + 20);
  ASSERT_TRUE(loss.count(std::make_pair(1, first_resumed)) == 1) << "attempt 1 never ran step " << first_resumed;
  const double resumed_loss = loss[{2, first_resumed}];
  const double original_loss = loss[{1, first_resumed}];
  EXPECT_NEAR(resumed_loss, original_loss, 1e-4 * std::abs(original_loss));
  EXPECT_EQ(loss.count(std::make_pair(2, int64_t{400})), 1u);
  Figure(absl::StrFormat("worker SIGKILL: attempt 2 resumed at step %d (loss %.6g, attempt 1 "
                         "had %.6g there), finished 400 steps",
                         first_resumed, resumed_loss, original_loss));
}

// The ranks finish while the coordinator is down, then both worker daemons are SIGKILLed before
// they could report it: their outbound journals keep the final statuses, so the restarted daemons
// report the ranks as ended and the job succeeds instead of failing for ranks gone missing.
TEST(FaultTest, RankResultsQueuedWhenTheDaemonDiesAreDeliveredAfterItsRestart) {
  WorkerCluster cluster;
  cluster.set_lease_timeout(absl::Seconds(20));  // both daemons restart after the coordinator
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.Diagnostics();
  StartWorkers(cluster, {"node-1", "node-2"});
  absl::StatusOr<v1::Job> job = cluster.Submit(TinyCpuSpec(120));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitForStepPast(cluster, job->id(), 5, absl::Seconds(60)).has_value())
      << cluster.Diagnostics();
  const std::vector<pid_t> ranks = cluster.RankPidsOf(job->id());
  ASSERT_EQ(ranks.size(), 2u);
  cluster.KillCoordinator();
  ASSERT_TRUE(WaitGone(ranks, absl::Seconds(120))) << cluster.Diagnostics();  // they finished
  for (const char* node : {"node-1", "node-2"}) {
    ASSERT_TRUE(cluster.worker(node)->Signal(SIGKILL).ok());
    ASSERT_TRUE(cluster.worker(node)->Wait(absl::Seconds(10)).ok());
  }
  const absl::Time restart = absl::Now();
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.Diagnostics();
  for (const char* node : {"node-1", "node-2"}) {
    ASSERT_TRUE(cluster.StartWorker(node).ok()) << cluster.Diagnostics();
  }
  absl::StatusOr<v1::Job> done = cluster.WaitForState(
      job->id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->message() << cluster.Diagnostics();
  EXPECT_EQ(done->attempt(), 1);
  EXPECT_EQ(LatestStep(cluster, job->id()), 120) << "the last steps' metrics were delivered too";
  Figure(absl::StrFormat("worker daemons SIGKILLed with undelivered results: job SUCCEEDED "
                         "%.2f s after the restarts",
                         absl::ToDoubleSeconds(absl::Now() - restart)));
}

// pid's parent, from /proc; 0 when it is gone.
pid_t ParentOf(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "PPid:")) return static_cast<pid_t>(std::atoi(line.c_str() + 5));
  }
  return 0;
}

// A worker whose daemon stops answering (SIGSTOP: its connection stays open, silent) for longer
// than the lease: its attempt fails and is retried on the other workers; once it is back, the rank
// it still had is cancelled as a stray of an attempt that is over.
TEST(FaultTest, AWorkerSilentForLongerThanTheLeaseIsReplacedAndItsStrayRankStopped) {
  WorkerCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.Diagnostics();
  StartWorkers(cluster, {"node-1", "node-2", "node-3"});
  std::string spec = TinyCpuSpec(300);
  spec.replace(spec.find("max_attempts: 1"), 15, "max_attempts: 2");
  absl::StatusOr<v1::Job> job = cluster.Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitForStepPast(cluster, job->id(), 10, absl::Seconds(60)).has_value())
      << cluster.Diagnostics();
  absl::StatusOr<v1::Job> running = cluster.Get(job->id());
  ASSERT_TRUE(running.ok());
  const std::string victim = running->placement(1).node();
  Process* daemon = cluster.worker(victim);
  pid_t stray = 0;
  for (pid_t pid : cluster.RankPidsOf(job->id())) {
    if (ParentOf(pid) == daemon->pid()) stray = pid;
  }
  ASSERT_NE(stray, 0) << "no rank of " << victim;

  ASSERT_TRUE(daemon->Signal(SIGSTOP).ok());
  const absl::Time stopped = absl::Now();
  std::optional<absl::Duration> replaced =
      WaitForStepPast(cluster, job->id(), 0, absl::Seconds(60), /*attempt=*/2);
  const double replaced_s = absl::ToDoubleSeconds(absl::Now() - stopped);
  ASSERT_TRUE(daemon->Signal(SIGCONT).ok());
  ASSERT_TRUE(replaced.has_value()) << cluster.Diagnostics();
  absl::StatusOr<v1::Job> retried = cluster.Get(job->id());
  ASSERT_TRUE(retried.ok());
  for (const v1::RankPlacement& p : retried->placement()) EXPECT_NE(p.node(), victim);

  // Back from its stall, the daemon reconnects and its rank of the failed attempt is stopped.
  const absl::Time resumed = absl::Now();
  EXPECT_TRUE(WaitGone({stray}, absl::Seconds(30))) << cluster.Diagnostics();
  EXPECT_TRUE(cluster
                  .WaitForWorker(victim, ReadyWorker, absl::Seconds(30))
                  .has_value());
  Figure(absl::StrFormat("worker silent (SIGSTOP) past the 5 s lease: attempt 2 stepping on the "
                         "other workers %.2f s after the stall began; its stray rank gone %.2f s "
                         "after it resumed",
                         replaced_s, absl::ToDoubleSeconds(absl::Now() - resumed)));
  absl::StatusOr<v1::Job> done = cluster.WaitForState(
      job->id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->message() << cluster.Diagnostics();
  EXPECT_EQ(done->attempt(), 2);
}

// Clients that vanish mid-watch (SIGKILLed `dropless watch` processes) free their streams on the
// coordinator at once, and the job and the server carry on.
TEST(FaultTest, WatchersKilledMidStreamAreReleased) {
  constexpr int kWatchers = 20;
  auto c = CoordinatorUnderTest::Start();
  FakeWorker worker(c->channel(), "node-watch", 1);
  ASSERT_TRUE(worker.Register().ok() && worker.Connect().ok());
  absl::StatusOr<v1::Job> job = c->Submit(TinySpec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(worker.NextAssignment().has_value());
  ASSERT_TRUE(worker.ReportRank(job->id(), 1, 0, v1::RANK_STATE_RUNNING).ok());
  c->WaitForState(job->id(), v1::JOB_STATE_RUNNING);

  std::vector<std::unique_ptr<Process>> watchers;
  for (int i = 0; i < kWatchers; ++i) {
    absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(
        {BinaryPath("dropless"), "--insecure", "--coordinator", c->address(), "watch", job->id()});
    ASSERT_TRUE(p.ok()) << p.status();
    watchers.push_back(std::move(*p));
  }
  // Every watcher has its stream open once it printed the job's first line.
  const absl::Time open_deadline = absl::Now() + absl::Seconds(30);
  for (auto& w : watchers) {
    while (w->Output().empty() && absl::Now() < open_deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_FALSE(w->Output().empty()) << "a watcher never started";
  }
  const absl::Time killed = absl::Now();
  for (auto& w : watchers) ASSERT_TRUE(w->Signal(SIGKILL).ok());

  // The coordinator counts a WatchJob call when its stream ends.
  auto ended_watches = [&] {
    int ended = 0;
    for (absl::string_view line : absl::StrSplit(HttpGet(c->metrics_port(), "/metrics"), '\n')) {
      if (!absl::StartsWith(line, "dropless_coordinator_rpcs_total{") ||
          !absl::StrContains(line, "method=\"JobService/WatchJob\"")) {
        continue;
      }
      double n = 0;
      if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &n)) ended += static_cast<int>(n);
    }
    return ended;
  };
  while (ended_watches() < kWatchers && absl::Now() - killed < absl::Seconds(20)) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(ended_watches(), kWatchers) << "streams of dead watchers still open";
  Figure(absl::StrFormat("%d watchers SIGKILLed mid-stream: all %d streams released within "
                         "%.2f s",
                         kWatchers, kWatchers, absl::ToDoubleSeconds(absl::Now() - killed)));
  ASSERT_TRUE(worker.ReportRank(job->id(), 1, 0, v1::RANK_STATE_SUCCEEDED).ok());
  EXPECT_EQ(c->WaitForState(job->id(), v1::JOB_STATE_SUCCEEDED).state(),
            v1::JOB_STATE_SUCCEEDED);
}

TEST(FaultTest, AThousandSubmitsFromFiftyClientsAreAllAccountedForOnce) {
  constexpr int kClients = 50;
  constexpr int kPerClient = 20;
  WorkerCluster cluster;  // no workers: the jobs wait, which is all this test needs
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.Diagnostics();
  const std::string spec = TinyCpuSpec(10);

  absl::Mutex mu;
  std::map<std::string, std::string> job_of_request;  // request id -> job id
  std::vector<std::string> failures;
  const absl::Time start = absl::Now();
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      // A client of its own: its own channel and connection.
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      auto stub = v1::JobService::NewStub(grpc::CreateCustomChannel(
          cluster.coordinator_address(), grpc::InsecureChannelCredentials(), args));
      for (int i = 0; i < kPerClient; ++i) {
        v1::SubmitJobRequest request;
        request.set_spec_yaml(spec);
        request.set_request_id(absl::StrCat("client-", c, "-submit-", i));
        // Every fifth submit is sent twice, as a client that lost the first answer would.
        std::set<std::string> ids;
        for (int send = 0; send < (i % 5 == 0 ? 2 : 1); ++send) {
          grpc::ClientContext context;
          context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
          // 50 connections opening at once on a loaded 2-core machine: a connect attempt that
          // fails is retried by the channel within the deadline instead of failing the call.
          context.set_wait_for_ready(true);
          v1::Job job;
          grpc::Status status = stub->SubmitJob(&context, request, &job);
          absl::MutexLock lock(&mu);
          if (!status.ok()) {
            failures.push_back(absl::StrCat(request.request_id(), ": ", status.error_message()));
            continue;
          }
          ids.insert(job.id());
        }
        absl::MutexLock lock(&mu);
        if (ids.size() != 1) {
          failures.push_back(absl::StrCat(request.request_id(), ": ", ids.size(), " job ids"));
        } else {
          job_of_request[request.request_id()] = *ids.begin();
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  EXPECT_TRUE(failures.empty()) << failures.size() << " failures, first: " << failures.front();
  ASSERT_EQ(job_of_request.size(), static_cast<size_t>(kClients * kPerClient));
  std::set<std::string> distinct;
  for (const auto& [request, job] : job_of_request) distinct.insert(job);
  EXPECT_EQ(distinct.size(), static_cast<size_t>(kClients * kPerClient)) << "a job id answered "
                                                                            "two requests";

  // The coordinator holds exactly these jobs (listed a page at a time, as the CLI does).
  auto stub = v1::JobService::NewStub(
      grpc::CreateChannel(cluster.coordinator_address(), grpc::InsecureChannelCredentials()));
  std::set<std::string> stored;
  v1::ListJobsRequest list;
  list.set_page_size(1000);
  for (int page = 0; page < 100; ++page) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    v1::ListJobsResponse listed;
    ASSERT_TRUE(stub->ListJobs(&context, list, &listed).ok());
    for (const v1::Job& j : listed.jobs()) stored.insert(j.id());
    if (listed.next_page_token().empty()) break;
    list.set_page_token(listed.next_page_token());
  }
  EXPECT_EQ(stored, distinct);
  const int sent = kClients * kPerClient + kClients * kPerClient / 5;
  Figure(absl::StrFormat("%d submits (%d retried with their request id) from %d clients in "
                         "%.2f s: %.0f submits/s, %d jobs, none duplicated",
                         sent, kClients * kPerClient / 5, kClients, seconds, sent / seconds,
                         stored.size()));
}

}  // namespace
}  // namespace dropless::testing
