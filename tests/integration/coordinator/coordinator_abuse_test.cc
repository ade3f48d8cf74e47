// The real coordinator under abuse: absurd registrations, garbage and lies on worker sessions,
// rendezvous misuse, many watchers at once. Each bad request gets one error naming the field, the
// server keeps serving, and nothing already accepted is lost or polluted.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"

namespace dropless::testing {
namespace {

using ::testing::HasSubstr;

bool Serving(CoordinatorUnderTest& c) {
  std::string response;
  grpc::Status status =
      RawUnaryCall(c.channel().get(), "/grpc.health.v1.Health/Check", "", &response);
  return status.ok() && response == std::string("\x08\x01", 2);
}

v1::RegisterWorkerRequest CpuWorker(const std::string& node, int slots) {
  v1::RegisterWorkerRequest request;
  request.set_node(node);
  request.set_address("127.0.0.1");
  request.set_slot_kind("cpu");
  for (int i = 0; i < slots; ++i) request.add_devices("cpu");
  return request;
}

grpc::Status Register(CoordinatorUnderTest& c, const v1::RegisterWorkerRequest& request) {
  auto stub = v1::WorkerService::NewStub(c.channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::RegisterWorkerResponse response;
  return stub->RegisterWorker(&context, request, &response);
}

TEST(CoordinatorAbuseTest, AbsurdRegistrationsAreRefusedNamingTheFieldAndNothingIsStored) {
  auto c = CoordinatorUnderTest::Start();
  struct Case {
    const char* what;
    v1::RegisterWorkerRequest request;
    const char* field;
  };
  std::vector<Case> cases;
  {
    v1::RegisterWorkerRequest r = CpuWorker("n1", 1);
    r.set_metrics_port(-1);
    cases.push_back({"negative port", r, "metrics_port"});
    r.set_metrics_port(70000);
    cases.push_back({"port above 65535", r, "metrics_port"});
  }
  cases.push_back({"5000 slots", CpuWorker("n1", 5000), "devices"});
  cases.push_back({"no slots", CpuWorker("n1", 0), "devices"});
  cases.push_back({"empty node", CpuWorker("", 1), "node"});
  cases.push_back({"node with a space", CpuWorker("node a", 1), "node"});
  cases.push_back({"node with a newline", CpuWorker("node\nb", 1), "node"});
  cases.push_back({"300-byte node", CpuWorker(std::string(300, 'n'), 1), "node"});
  {
    v1::RegisterWorkerRequest r = CpuWorker("n1", 1);
    r.set_devices(0, std::string(300, 'd'));
    cases.push_back({"300-byte device name", r, "devices"});
    r = CpuWorker("n1", 1);
    r.set_address("host name");
    cases.push_back({"address with a space", r, "address"});
    r = CpuWorker("n1", 1);
    r.set_slot_kind("");
    cases.push_back({"no slot kind", r, "slot_kind"});
    r = CpuWorker("n1", 1);
    r.set_version("1.0\n\x1b[31mforged event");
    cases.push_back({"version with control characters", r, "version"});
    r = CpuWorker("n1", 1);
    r.set_boot_id(std::string(100000, 'b'));
    cases.push_back({"100 kB boot id", r, "boot_id"});
  }
  for (const Case& k : cases) {
    grpc::Status status = Register(*c, k.request);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << k.what;
    EXPECT_THAT(status.error_message(), HasSubstr(k.field)) << k.what;
  }
  // A million slots is past any message size the server takes: refused before it is parsed.
  grpc::Status million = Register(*c, CpuWorker("n1", 1000000));
  EXPECT_FALSE(million.ok());

  EXPECT_TRUE(c->Workers().empty());
  EXPECT_TRUE(Serving(*c));
  EXPECT_TRUE(c->process().Running());
  // A sane worker still registers and gets work.
  FakeWorker w(c->channel(), "node-sane", 1);
  ASSERT_TRUE(w.Register().ok());
  ASSERT_TRUE(w.Connect().ok());
  ASSERT_TRUE(c->Submit(TinySpec(1)).ok());
  EXPECT_TRUE(w.NextAssignment().has_value());
}

TEST(CoordinatorAbuseTest, GarbageAndLiesOnSessionsEndOnlyThoseSessions) {
  auto c = CoordinatorUnderTest::Start();
  FakeWorker honest(c->channel(), "node-honest", 2);
  ASSERT_TRUE(honest.Register().ok() && honest.Connect().ok());
  absl::StatusOr<v1::Job> job = c->Submit(TinySpec(2));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(honest.NextAssignment().has_value());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(honest.ReportRank(job->id(), 1, r, v1::RANK_STATE_RUNNING).ok());
  }
  c->WaitForState(job->id(), v1::JOB_STATE_RUNNING);

  // Bytes that are no WorkerMessage on a Session stream: gRPC drops the message and the stream
  // ends without a Hello, so nothing is sent down and nothing is registered.
  std::string ignored;
  (void)RawBidiExchange(c->channel().get(), "/dropless.v1.WorkerService/Session",
                        std::string("\xff\xff\xff\xff\x0f junk", 10), &ignored);
  EXPECT_TRUE(ignored.empty());
  EXPECT_EQ(c->Workers().size(), 1u);

  // Hello twice on one session.
  FakeWorker twice(c->channel(), "node-twice", 1);
  ASSERT_TRUE(twice.Register().ok() && twice.Connect().ok());
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id(twice.id());
  (void)twice.Send(hello);
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (twice.SessionOpen() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  std::optional<grpc::Status> twice_status = twice.SessionStatus();
  ASSERT_TRUE(twice_status.has_value());
  EXPECT_EQ(twice_status->error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(twice_status->error_message(), HasSubstr("hello"));

  // A registered worker that claims ranks, metrics and logs it has nothing to do with.
  FakeWorker liar(c->channel(), "node-liar", 1);
  ASSERT_TRUE(liar.Register().ok() && liar.Connect().ok());
  ASSERT_TRUE(liar.ReportRank(job->id(), 1, 0, v1::RANK_STATE_FAILED, 1).ok());  // not its rank
  ASSERT_TRUE(liar.ReportRank(job->id(), 1, 7, v1::RANK_STATE_SUCCEEDED).ok());  // no such rank
  ASSERT_TRUE(liar.ReportRank(job->id(), 99, 0, v1::RANK_STATE_RUNNING).ok());   // no such attempt
  ASSERT_TRUE(liar.ReportRank("job-ghost", 1, 0, v1::RANK_STATE_RUNNING).ok());
  {
    v1::WorkerMessage odd;
    v1::RankStatus* s = odd.mutable_rank_status();
    s->set_job_id(job->id());
    s->set_attempt(1);
    s->set_rank(1);
    s->set_state(static_cast<v1::RankState>(99));
    ASSERT_TRUE(liar.Send(odd).ok());
  }
  ASSERT_TRUE(liar.ReportMetrics(job->id(), 1, 0, 1, 5, -1.0).ok());
  ASSERT_TRUE(liar.ReportMetrics("job-ghost", 1, 0, 1, 5, 1.0).ok());
  ASSERT_TRUE(liar.ReportLog("job-ghost", 1, 0, "not a job of ours").ok());
  // Output forged for ranks placed on another worker, of an existing and of a missing attempt.
  ASSERT_TRUE(liar.ReportLog(job->id(), 1, 0, "forged by the liar").ok());
  ASSERT_TRUE(liar.ReportLog(job->id(), 1, 1, std::string(1 << 20, 'y')).ok());
  ASSERT_TRUE(liar.ReportLog(job->id(), 7, 0, "forged attempt").ok());
  // The honest worker's own rank prints a line far over the limit.
  ASSERT_TRUE(honest.ReportLog(job->id(), 1, 0, std::string(1 << 20, 'z')).ok());
  {
    v1::WorkerMessage empty;  // no message kind set at all
    ASSERT_TRUE(liar.Send(empty).ok());
  }
  // The coordinator answers the stray ranks with Cancellations and carries on.
  std::optional<v1::Cancellation> stray = liar.NextCancellation();
  ASSERT_TRUE(stray.has_value());

  // The honest job is untouched: still RUNNING on attempt 1, no metrics from the liar.
  absl::SleepFor(absl::Milliseconds(500));
  absl::StatusOr<v1::Job> after = c->Get(job->id());
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(after->attempt(), 1);
  EXPECT_FALSE(after->has_latest()) << after->latest().DebugString();
  absl::StatusOr<v1::Job> ghost = c->Get("job-ghost");
  EXPECT_EQ(ghost.status().code(), absl::StatusCode::kNotFound);
  // The job's log holds the honest rank's long line, stored truncated (not refused and not
  // whole), and nothing the liar sent.
  {
    grpc::ClientContext context;
    v1::GetLogsRequest request;
    request.set_job_id(job->id());
    auto reader = c->jobs().GetLogs(&context, request);
    v1::LogLine line;
    int lines = 0;
    while (reader->Read(&line)) {
      ++lines;
      EXPECT_EQ(line.rank(), 0);
      EXPECT_EQ(line.attempt(), 1);
      EXPECT_GT(line.text().size(), 0u);
      EXPECT_LE(line.text().size(), 16u * 1024);
      EXPECT_EQ(line.text().find_first_not_of('z'), std::string::npos) << line.text().substr(0, 40);
    }
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(lines, 1);
  }
  EXPECT_TRUE(honest.SessionOpen());
  EXPECT_TRUE(liar.SessionOpen());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(honest.ReportRank(job->id(), 1, r, v1::RANK_STATE_SUCCEEDED).ok());
  }
  EXPECT_EQ(c->WaitForState(job->id(), v1::JOB_STATE_SUCCEEDED).state(),
            v1::JOB_STATE_SUCCEEDED);
  // After the attempt ended, the placement comes from the store: the worker that ran rank 1 may
  // still deliver its last output; the liar may not.
  ASSERT_TRUE(liar.ReportLog(job->id(), 1, 1, "liar after the end").ok());
  ASSERT_TRUE(honest.ReportLog(job->id(), 1, 1, "rank 1 after the end").ok());
  std::vector<v1::LogLine> stored;
  for (absl::Time until = absl::Now() + absl::Seconds(20); absl::Now() < until;) {
    stored.clear();
    grpc::ClientContext context;
    v1::GetLogsRequest request;
    request.set_job_id(job->id());
    auto reader = c->jobs().GetLogs(&context, request);
    v1::LogLine line;
    while (reader->Read(&line)) stored.push_back(line);
    EXPECT_TRUE(reader->Finish().ok());
    if (stored.size() >= 2) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(stored.size(), 2u);
  EXPECT_EQ(stored[1].rank(), 1);
  EXPECT_EQ(stored[1].text(), "rank 1 after the end");
  EXPECT_TRUE(Serving(*c));
}

// Two daemons configured with one node name: the run that holds the node keeps it and its job,
// also across a reconnect; the other is refused with an error naming the node until the first
// run's lease runs out. (Before, each took the node from the other forever, and the jobs failed.)
TEST(CoordinatorAbuseTest, ASecondDaemonOfAHeldNodeIsRefused) {
  auto c = CoordinatorUnderTest::Start("", kReconnectLeaseMs);  // the first run reconnects in it
  FakeWorker first(c->channel(), "node-dup", 1);
  ASSERT_TRUE(first.Register("run-a").ok());
  ASSERT_TRUE(first.Connect("run-a").ok());
  absl::StatusOr<v1::Job> job = c->Submit(TinySpec(1));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(first.NextAssignment().has_value());
  ASSERT_TRUE(first.ReportRank(job->id(), 1, 0, v1::RANK_STATE_RUNNING).ok());
  c->WaitForState(job->id(), v1::JOB_STATE_RUNNING);

  FakeWorker second(c->channel(), "node-dup", 1);
  absl::Status refused = second.Register("run-b");
  EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("node \"node-dup\""));
  // The first run's session drops: it still holds the node (it reconnects) ...
  first.Disconnect();
  ASSERT_TRUE(c->WaitForWorkerState("node-dup", v1::WORKER_STATE_LOST));
  EXPECT_EQ(second.Register("run-b").code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(first.Register().ok());
  ASSERT_TRUE(first.Connect("run-a").ok());
  ASSERT_TRUE(c->WaitForWorkerState("node-dup", v1::WORKER_STATE_READY));
  // ... and kept its job.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(first.SessionOpen());
  EXPECT_EQ(c->Get(job->id())->state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(first.ReportRank(job->id(), 1, 0, v1::RANK_STATE_SUCCEEDED).ok());
  EXPECT_EQ(c->WaitForState(job->id(), v1::JOB_STATE_SUCCEEDED).state(), v1::JOB_STATE_SUCCEEDED);

  // Once the first run is gone for longer than its lease, the node is free for the other.
  first.Disconnect();
  absl::Status taken = second.Register("run-b");
  for (absl::Time until = absl::Now() + absl::Seconds(30); !taken.ok() && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(100));
    taken = second.Register("run-b");
  }
  ASSERT_TRUE(taken.ok()) << taken;
  ASSERT_TRUE(second.Connect("run-b").ok());
  EXPECT_TRUE(c->WaitForWorkerState("node-dup", v1::WORKER_STATE_READY));
  // The first run, back, is refused now.
  EXPECT_EQ(first.Register("run-a").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(Serving(*c));
}

TEST(CoordinatorAbuseTest, RendezvousMisuseGetsNamedErrorsAndBoundedMemory) {
  auto c = CoordinatorUnderTest::Start();
  FakeWorker w(c->channel(), "node-rdv", 1);
  ASSERT_TRUE(w.Register().ok() && w.Connect().ok());
  absl::StatusOr<v1::Job> job = c->Submit(TinySpec(1));
  ASSERT_TRUE(job.ok());
  std::optional<v1::Assignment> assignment = w.NextAssignment();
  ASSERT_TRUE(assignment.has_value());
  v1::Scope scope;
  scope.set_job_id(job->id());
  scope.set_attempt(1);
  scope.set_secret(assignment->rendezvous_secret());
  auto put = [&](const v1::Scope& s, const std::string& key, const std::string& value) {
    return RendezvousPut(c->rendezvous(), s, key, value);
  };
  auto wait = [&](const v1::Scope& s, const std::vector<std::string>& keys, int64_t timeout_ms) {
    return RendezvousWait(c->rendezvous(), s, keys, timeout_ms);
  };

  grpc::Status empty_key = put(scope, "", "v");
  EXPECT_EQ(empty_key.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(empty_key.error_message(), HasSubstr("key"));
  grpc::Status long_key = put(scope, std::string(1025, 'k'), "v");
  EXPECT_EQ(long_key.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(long_key.error_message(), HasSubstr("key"));
  v1::Scope zero = scope;
  zero.set_attempt(0);
  grpc::Status attempt_zero = put(zero, "k", "v");
  EXPECT_EQ(attempt_zero.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(attempt_zero.error_message(), HasSubstr("scope.attempt"));
  v1::Scope ghost = scope;
  ghost.set_job_id("job-ghost");
  EXPECT_EQ(put(ghost, "k", "v").error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  grpc::Status negative = wait(scope, {"k"}, -5);
  EXPECT_EQ(negative.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(negative.error_message(), HasSubstr("timeout_ms"));

  // Waiting on thousands of missing keys: the error names some of them, not megabytes of them.
  std::vector<std::string> many;
  for (int i = 0; i < 5000; ++i) many.push_back(absl::StrCat("missing-key-", i, std::string(100, 'x')));
  grpc::Status timed_out = wait(scope, many, 50);
  EXPECT_EQ(timed_out.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(timed_out.error_message(), HasSubstr("missing-key-0"));
  EXPECT_LT(timed_out.error_message().size(), 4096u);

  // One attempt cannot fill the coordinator's memory with values: 1 MiB values stop at 256 MiB,
  // well before 16384 of them (16 GiB) would be held.
  const std::string mib(1 << 20, 'v');
  grpc::Status last = grpc::Status::OK;
  int stored = 0;
  for (; stored < 1000; ++stored) {
    last = put(scope, absl::StrCat("big-", stored), mib);
    if (!last.ok()) break;
  }
  EXPECT_EQ(last.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << last.error_message();
  EXPECT_LE(stored, 256);
  // Overwriting a key in a full attempt is still allowed (a rank re-publishing its address).
  EXPECT_TRUE(put(scope, "big-0", "small").ok());
  EXPECT_TRUE(Serving(*c));
}

TEST(CoordinatorAbuseTest, ManyConcurrentWatchersAllSeeTheEnd) {
  auto c = CoordinatorUnderTest::Start();
  absl::StatusOr<v1::Job> job = c->Submit(TinySpec(1));  // no worker: stays PENDING
  ASSERT_TRUE(job.ok());
  constexpr int kWatchers = 64;
  struct Watch {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::JobUpdate>> reader;
    std::atomic<v1::JobState> last{v1::JOB_STATE_UNSPECIFIED};
    std::atomic<int> updates{0};
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Watch>> watches;
  std::vector<std::thread> threads;
  for (int i = 0; i < kWatchers; ++i) {
    Watch* w = watches.emplace_back(std::make_unique<Watch>()).get();
    v1::WatchJobRequest request;
    request.set_id(job->id());
    w->reader = c->jobs().WatchJob(&w->context, request);
    threads.emplace_back([w] {
      v1::JobUpdate update;
      while (w->reader->Read(&update)) {
        ++w->updates;
        w->last = update.job().state();
      }
      w->status = w->reader->Finish();
    });
  }
  // Watchers that walk away mid-stream must not disturb the others.
  std::vector<std::unique_ptr<grpc::ClientContext>> quitters;
  for (int i = 0; i < 16; ++i) {
    auto& context = quitters.emplace_back(std::make_unique<grpc::ClientContext>());
    v1::WatchJobRequest request;
    request.set_id(job->id());
    auto reader = c->jobs().WatchJob(context.get(), request);
    v1::JobUpdate first;
    EXPECT_TRUE(reader->Read(&first));
    context->TryCancel();
    (void)reader->Finish();
  }
  // Every watcher has its snapshot (so it is subscribed) before the job ends.
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  auto all_subscribed = [&] {
    for (auto& w : watches) {
      if (w->updates.load() == 0) return false;
    }
    return true;
  };
  while (!all_subscribed() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(all_subscribed());
  {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_id(job->id());
    v1::Job cancelled;
    ASSERT_TRUE(c->jobs().CancelJob(&context, request, &cancelled).ok());
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kWatchers; ++i) {
    EXPECT_TRUE(watches[i]->status.ok()) << i << ": " << watches[i]->status.error_message();
    EXPECT_EQ(watches[i]->last, v1::JOB_STATE_CANCELLED) << i;
    EXPECT_GE(watches[i]->updates, 1) << i;
  }
  EXPECT_TRUE(Serving(*c));
}

// A cancel reason is stored and printed: one with control characters (a forged log line, a
// terminal escape) is refused naming the field, and the job is not cancelled by it.
TEST(CoordinatorAbuseTest, ACancelReasonWithControlCharactersIsRefused) {
  auto c = CoordinatorUnderTest::Start();
  absl::StatusOr<v1::Job> job = c->Submit(TinySpec(1));  // no worker: it stays pending
  ASSERT_TRUE(job.ok()) << job.status();
  auto cancel = [&](const std::string& reason, v1::Job* out) {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_id(job->id());
    request.set_reason(reason);
    return c->jobs().CancelJob(&context, request, out);
  };
  v1::Job out;
  for (const std::string& bad : {std::string("done\n2026-12-04 I coordinator: forged"),
                                 std::string("\x1b[2Jcleared"), std::string("tab\there"),
                                 std::string("c1 \xc2\x9b"
                                             "31m csi")}) {
    grpc::Status refused = cancel(bad, &out);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(refused.error_message(), HasSubstr("reason: "));
  }
  EXPECT_EQ(c->Get(job->id())->state(), v1::JOB_STATE_PENDING);
  ASSERT_TRUE(cancel("not needed anymore", &out).ok());
  EXPECT_EQ(out.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(out.message(), "cancelled: not needed anymore");
}

TEST(CoordinatorAbuseTest, SecondCoordinatorOnATakenPortRefusesToStart) {
  auto c = CoordinatorUnderTest::Start();
  const std::string port = c->address().substr(c->address().rfind(':') + 1);
  CommandResult second = RunCommand({BinaryPath("dropless-coordinator"), "--insecure",
                                     "--listen=127.0.0.1:" + port,
                                     "--db=" + MakeTempDir() + "/second.db", "--metrics-port=0"},
                                    absl::Seconds(30));
  EXPECT_EQ(second.exit_code, 1) << second.out << second.err;
  EXPECT_THAT(second.err, HasSubstr("could not listen")) << second.err;
  EXPECT_TRUE(Serving(*c));
}

// SubmitJob's name and priority overrides go into the stored spec that every rank parses again:
// they must pass the spec's own rules, or the job is accepted and then fails at its start.
TEST(CoordinatorAbuseTest, OverridesFollowTheSpecRules) {
  auto c = CoordinatorUnderTest::Start();
  absl::StatusOr<v1::Job> upper = c->Submit(TinySpec(1), "Not A Valid Name");
  EXPECT_EQ(upper.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(upper.status().message(), HasSubstr("name"));
  absl::StatusOr<v1::Job> priority = c->Submit(TinySpec(1), "", 5000);
  EXPECT_EQ(priority.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(priority.status().message(), HasSubstr("priority"));
  grpc::ClientContext context;
  v1::ListJobsResponse listed;
  ASSERT_TRUE(c->jobs().ListJobs(&context, v1::ListJobsRequest(), &listed).ok());
  EXPECT_EQ(listed.jobs_size(), 0);
  absl::StatusOr<v1::Job> fine = c->Submit(TinySpec(1), "renamed-job", -7);
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(fine->name(), "renamed-job");
  EXPECT_EQ(fine->priority(), -7);
  EXPECT_THAT(fine->spec_yaml(), HasSubstr("name: \"renamed-job\""));
}

TEST(CoordinatorAbuseTest, LogsOfARankOutsideTheJobAreRefused) {
  auto c = CoordinatorUnderTest::Start();
  absl::StatusOr<v1::Job> job = c->Submit(TinySpec(2));
  ASSERT_TRUE(job.ok());
  auto logs = [&](int rank) {
    grpc::ClientContext context;
    v1::GetLogsRequest request;
    request.set_job_id(job->id());
    request.set_rank(rank);
    auto reader = c->jobs().GetLogs(&context, request);
    v1::LogLine line;
    while (reader->Read(&line)) {
    }
    return reader->Finish();
  };
  EXPECT_TRUE(logs(1).ok());
  grpc::Status outside = logs(2);
  EXPECT_EQ(outside.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(outside.error_message(), HasSubstr("rank: job " + job->id() + " has ranks 0..1"));
  EXPECT_EQ(logs(-1).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(CoordinatorAbuseTest, ARanksFailureMessageLosesItsControlCharacters) {
  auto c = CoordinatorUnderTest::Start();
  FakeWorker w(c->channel(), "node-escape", 1);
  ASSERT_TRUE(w.Register().ok() && w.Connect().ok());
  absl::StatusOr<v1::Job> job = c->Submit(TinySpec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(w.NextAssignment().has_value());
  v1::WorkerMessage failed;
  v1::RankStatus* s = failed.mutable_rank_status();
  s->set_job_id(job->id());
  s->set_attempt(1);
  s->set_rank(0);
  s->set_state(v1::RANK_STATE_FAILED);
  s->set_exit_code(1);
  s->set_message(
      "boom\x1b[2J\nforged line \xc2\x9b"
      "31m");
  ASSERT_TRUE(w.Send(failed).ok());
  const v1::Job ended = c->WaitForState(job->id(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(ended.message(), HasSubstr("boom?[2J?forged line ?31m"));
  std::vector<std::string> texts = {ended.message()};
  for (const v1::Event& event : c->Events(job->id())) texts.push_back(event.message());
  bool exited = false;
  for (const std::string& text : texts) {
    exited = exited || absl::StrContains(text, "boom?[2J?forged");
    EXPECT_FALSE(absl::StrContains(text, "\x1b") || absl::StrContains(text, "\n") ||
                 absl::StrContains(text, "\xc2\x9b"))
        << text;
  }
  EXPECT_TRUE(exited);
}

// A backlog of several pages (1000 lines each) arrives whole and in order, a tail too.
TEST(CoordinatorAbuseTest, ALogBacklogOfSeveralPagesArrivesCompleteAndInOrder) {
  auto c = CoordinatorUnderTest::Start();
  FakeWorker w(c->channel(), "node-pages", 1);
  ASSERT_TRUE(w.Register().ok() && w.Connect().ok());
  absl::StatusOr<v1::Job> job = c->Submit(TinySpec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(w.NextAssignment().has_value());
  ASSERT_TRUE(w.ReportRank(job->id(), 1, 0, v1::RANK_STATE_RUNNING).ok());
  constexpr int kLines = 2500;
  for (int i = 0; i < kLines; ++i) {
    ASSERT_TRUE(w.ReportLog(job->id(), 1, 0, absl::StrCat("line ", i)).ok());
  }
  auto read = [&](int tail_lines) {
    grpc::ClientContext context;
    v1::GetLogsRequest request;
    request.set_job_id(job->id());
    request.set_tail_lines(tail_lines);
    auto reader = c->jobs().GetLogs(&context, request);
    std::vector<std::string> texts;
    v1::LogLine line;
    while (reader->Read(&line)) texts.push_back(line.text());
    EXPECT_TRUE(reader->Finish().ok());
    return texts;
  };
  std::vector<std::string> all;
  for (int i = 0; i < 100 && all.size() < kLines; ++i) {
    all = read(0);
    if (all.size() < kLines) absl::SleepFor(absl::Milliseconds(100));  // still being stored
  }
  ASSERT_EQ(all.size(), static_cast<size_t>(kLines));
  for (int i = 0; i < kLines; ++i) ASSERT_EQ(all[i], absl::StrCat("line ", i));
  const std::vector<std::string> tail = read(1500);
  ASSERT_EQ(tail.size(), 1500u);
  EXPECT_EQ(tail.front(), "line 1000");
  EXPECT_EQ(tail.back(), "line 2499");
}

}  // namespace
}  // namespace dropless::testing
