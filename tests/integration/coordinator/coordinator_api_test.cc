// The coordinator's API surface against the real binary: errors for malformed requests (and the
// server staying up), the worker protocol's rules, health, reflection, /metrics, rendezvous.
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"

namespace dropless::testing {
namespace {

using ::testing::HasSubstr;

// grpc.health.v1.HealthCheckResponse{status: SERVING}, encoded.
const std::string kServing("\x08\x01", 2);

std::string HealthRequest(const std::string& service) {
  if (service.empty()) return "";
  return absl::StrCat(std::string(1, '\x0a'), std::string(1, static_cast<char>(service.size())),
                      service);
}

bool Serving(CoordinatorUnderTest& c) {
  std::string response;
  grpc::Status status =
      RawUnaryCall(c.channel().get(), "/grpc.health.v1.Health/Check", "", &response);
  return status.ok() && response == kServing;
}

TEST(CoordinatorApiTest, MalformedJobRequestsGetClearErrorsAndTheServerStaysUp) {
  auto c = CoordinatorUnderTest::Start();
  auto submit_error = [&](const std::string& spec) {
    absl::StatusOr<v1::Job> job = c->Submit(spec);
    EXPECT_FALSE(job.ok());
    return job.status();
  };
  absl::Status empty = submit_error("");
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.message(), HasSubstr("spec_yaml"));

  std::string bad_rule = TinySpec(2);
  bad_rule.replace(bad_rule.find("experts: 8"), 10, "experts: 7");
  absl::Status rule = submit_error(bad_rule);
  EXPECT_EQ(rule.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rule.message(), HasSubstr("experts"));

  EXPECT_EQ(submit_error("{{{{ not yaml").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(submit_error("- a\n- list\n").code(), absl::StatusCode::kInvalidArgument);
  absl::Status huge = submit_error(TinySpec(2) + "# " + std::string(1 << 20, 'x') + "\n");
  EXPECT_EQ(huge.code(), absl::StatusCode::kInvalidArgument);

  {
    grpc::ClientContext context;
    v1::GetJobRequest request;
    v1::Job job;
    grpc::Status status = c->jobs().GetJob(&context, request, &job);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("id"));
  }
  absl::StatusOr<v1::Job> missing = c->Get("job-nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("job-nope"));
  {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_id("job-ghost");
    v1::Job job;
    grpc::Status status = c->jobs().CancelJob(&context, request, &job);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(status.error_message(), HasSubstr("job-ghost"));
  }
  {
    grpc::ClientContext context;
    v1::WatchJobRequest request;
    request.set_id("job-ghost");
    auto reader = c->jobs().WatchJob(&context, request);
    v1::JobUpdate update;
    EXPECT_FALSE(reader->Read(&update));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext context;
    v1::GetLogsRequest request;
    request.set_job_id("job-ghost");
    auto reader = c->jobs().GetLogs(&context, request);
    v1::LogLine line;
    EXPECT_FALSE(reader->Read(&line));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext context;
    v1::ListJobsRequest request;
    request.add_states(static_cast<v1::JobState>(42));
    v1::ListJobsResponse response;
    grpc::Status status = c->jobs().ListJobs(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("states"));
  }
  {
    grpc::ClientContext context;
    v1::ListEventsRequest request;
    request.set_job_id("job-ghost");
    v1::ListEventsResponse response;
    EXPECT_EQ(c->jobs().ListEvents(&context, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  // Bytes that are no protobuf at all.
  std::string ignored;
  grpc::Status garbage = RawUnaryCall(c->channel().get(), "/dropless.v1.JobService/SubmitJob",
                                      std::string("\xff\xff\xff\xff\x0f garbage", 13), &ignored);
  EXPECT_FALSE(garbage.ok());

  EXPECT_TRUE(Serving(*c));
  absl::StatusOr<v1::Job> fine = c->Submit(TinySpec(2), "after-the-noise");
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(fine->state(), v1::JOB_STATE_PENDING);  // no workers yet
  EXPECT_TRUE(c->process().Running());
}

TEST(CoordinatorApiTest, BadRegistrationsAreRejectedNamingTheField) {
  auto c = CoordinatorUnderTest::Start();
  auto stub = v1::WorkerService::NewStub(c->channel());
  auto register_error = [&](const v1::RegisterWorkerRequest& request) {
    grpc::ClientContext context;
    v1::RegisterWorkerResponse response;
    return stub->RegisterWorker(&context, request, &response);
  };
  v1::RegisterWorkerRequest request;
  request.set_slot_kind("cpu");
  request.add_devices("cpu");
  grpc::Status no_node = register_error(request);
  EXPECT_EQ(no_node.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(no_node.error_message(), HasSubstr("node"));
  request.set_node("n1");
  request.set_slot_kind("tpu");
  grpc::Status kind = register_error(request);
  EXPECT_EQ(kind.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(kind.error_message(), HasSubstr("slot_kind"));
  request.set_slot_kind("cuda");
  request.clear_devices();
  grpc::Status devices = register_error(request);
  EXPECT_EQ(devices.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(devices.error_message(), HasSubstr("devices"));
  EXPECT_TRUE(Serving(*c));
}

TEST(CoordinatorApiTest, SessionsMustStartWithHelloFromARegisteredWorker) {
  auto c = CoordinatorUnderTest::Start();
  auto stub = v1::WorkerService::NewStub(c->channel());
  {
    grpc::ClientContext context;
    auto stream = stub->Session(&context);
    v1::WorkerMessage beat;
    beat.mutable_heartbeat()->set_time_ms(1);
    ASSERT_TRUE(stream->Write(beat));
    v1::CoordinatorMessage in;
    EXPECT_FALSE(stream->Read(&in));
    grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("hello"));
  }
  {
    grpc::ClientContext context;
    auto stream = stub->Session(&context);
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id("worker-9999");
    ASSERT_TRUE(stream->Write(hello));
    v1::CoordinatorMessage in;
    EXPECT_FALSE(stream->Read(&in));
    grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(status.error_message(), HasSubstr("worker-9999"));
  }
  {
    // Says nothing at all: closed once the lease timeout has passed.
    grpc::ClientContext context;
    absl::Time start = absl::Now();
    auto stream = stub->Session(&context);
    v1::CoordinatorMessage in;
    EXPECT_FALSE(stream->Read(&in));
    (void)stream->Finish();
    EXPECT_GE(absl::Now() - start, absl::Milliseconds(kLeaseMs));
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  }
  EXPECT_TRUE(Serving(*c));
}

TEST(CoordinatorApiTest, WorkerThatDisconnectsMidJobIsLostAndItsJobFails) {
  auto c = CoordinatorUnderTest::Start();
  FakeWorker w(c->channel(), "node-gone", 1);
  ASSERT_TRUE(w.Register().ok() && w.Connect().ok());
  absl::StatusOr<v1::Job> job = c->Submit(TinySpec(1));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(w.NextAssignment().has_value());
  ASSERT_TRUE(w.ReportRank(job->id(), 1, 0, v1::RANK_STATE_RUNNING).ok());
  c->WaitForState(job->id(), v1::JOB_STATE_RUNNING);
  w.Disconnect();
  v1::Job failed = c->WaitForState(job->id(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr(w.id()));
  std::vector<v1::Worker> workers = c->Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].state(), v1::WORKER_STATE_LOST);
  EXPECT_EQ(workers[0].slots_busy(), 0);
  EXPECT_TRUE(Serving(*c));
}

TEST(CoordinatorApiTest, HealthAndReflectionAnswer) {
  auto c = CoordinatorUnderTest::Start();
  EXPECT_TRUE(Serving(*c));
  std::string response;
  ASSERT_TRUE(RawUnaryCall(c->channel().get(), "/grpc.health.v1.Health/Check",
                           HealthRequest("dropless.v1.JobService"), &response)
                  .ok());
  EXPECT_EQ(response, kServing);
  // ServerReflectionRequest{list_services: ""}: field 7, length 0.
  grpc::Status reflection =
      RawBidiExchange(c->channel().get(),
                      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                      std::string("\x3a\x00", 2), &response);
  EXPECT_TRUE(reflection.ok()) << reflection.error_message();
  EXPECT_THAT(response, HasSubstr("dropless.v1.JobService"));
  EXPECT_THAT(response, HasSubstr("dropless.v1.WorkerService"));
  EXPECT_THAT(response, HasSubstr("dropless.v1.RendezvousService"));
}

TEST(CoordinatorApiTest, MetricsExposeEveryFamily) {
  auto c = CoordinatorUnderTest::Start();
  FakeWorker w(c->channel(), "node-m", 4);
  ASSERT_TRUE(w.Register().ok() && w.Connect().ok());
  ASSERT_TRUE(c->Submit(TinySpec(2)).ok());
  ASSERT_TRUE(w.NextAssignment().has_value());
  ASSERT_TRUE(c->Submit(TinySpec(8)).ok());  // cannot fit on 4 slots: stays PENDING
  (void)c->Get("job-nope");

  std::string text;
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline) {
    text = HttpGet(c->metrics_port(), "/metrics");
    if (absl::StrContains(text, "dropless_coordinator_slots{state=\"busy\"} 2")) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  for (const char* family :
       {"dropless_coordinator_jobs", "dropless_coordinator_workers",
        "dropless_coordinator_slots", "dropless_coordinator_scheduling_latency_seconds_bucket",
        "dropless_coordinator_job_pending_seconds_count",
        "dropless_coordinator_lease_expiries_total", "dropless_coordinator_rpcs_total",
        "dropless_coordinator_rpc_duration_seconds_bucket",
        "dropless_coordinator_jobs_finished_total"}) {
    EXPECT_THAT(text, HasSubstr(family)) << family;
  }
  EXPECT_THAT(text, HasSubstr("dropless_coordinator_jobs{state=\"PENDING\"} 1"));
  EXPECT_THAT(text, HasSubstr("dropless_coordinator_jobs{state=\"SCHEDULED\"} 1"));
  EXPECT_THAT(text, HasSubstr("dropless_coordinator_workers{state=\"READY\"} 1"));
  EXPECT_THAT(text, HasSubstr("dropless_coordinator_slots{state=\"busy\"} 2"));
  EXPECT_THAT(text, HasSubstr("dropless_coordinator_slots{state=\"free\"} 2"));
  EXPECT_THAT(text, HasSubstr("dropless_coordinator_scheduling_latency_seconds_count 1"));
  bool submit_ok = false, get_not_found = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, "dropless_coordinator_rpcs_total{")) continue;
    submit_ok |= absl::StrContains(line, "method=\"JobService/SubmitJob\"") &&
                 absl::StrContains(line, "code=\"OK\"");
    get_not_found |= absl::StrContains(line, "method=\"JobService/GetJob\"") &&
                     absl::StrContains(line, "code=\"NOT_FOUND\"");
  }
  EXPECT_TRUE(submit_ok) << text;
  EXPECT_TRUE(get_not_found) << text;
}

// The stored step metrics of a job, oldest first, filtered by rank and cut to the most recent;
// unknown jobs and ranks get errors naming them.
TEST(CoordinatorApiTest, ListStepMetricsServesTheStoredHistory) {
  auto c = CoordinatorUnderTest::Start();
  FakeWorker w(c->channel(), "node-metrics", 2);
  ASSERT_TRUE(w.Register().ok() && w.Connect().ok());
  absl::StatusOr<v1::Job> job = c->Submit(TinySpec(2));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(w.NextAssignment().has_value());
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(w.ReportRank(job->id(), 1, r, v1::RANK_STATE_RUNNING).ok());
  // Rank 1 first at each step: rank 0's step 5 (the job's latest once it lands) is then the last
  // report on the stream, so every report is stored when the wait below returns.
  for (int step = 1; step <= 5; ++step) {
    ASSERT_TRUE(w.ReportMetrics(job->id(), 1, 1, step, 5, 1.0 / step + 1).ok());
    // Rank 0's reports claim another node: the reporting worker's node is stored instead.
    v1::WorkerMessage forged;
    v1::StepMetrics* m = forged.mutable_metrics();
    m->set_job_id(job->id());
    m->set_attempt(1);
    m->set_rank(0);
    m->set_step(step);
    m->set_steps(5);
    m->set_loss(1.0 / step);
    m->set_step_seconds(0.01);
    m->set_node("some-other-node");
    ASSERT_TRUE(w.Send(forged).ok());
  }
  c->WaitForJob(job->id(),
                [](const v1::Job& j) { return j.latest().step() == 5 && j.latest().rank() == 0; });
  auto list = [&](std::optional<int32_t> rank, int limit, v1::ListStepMetricsResponse* response,
                  const std::string& id) {
    grpc::ClientContext context;
    v1::ListStepMetricsRequest request;
    request.set_job_id(id);
    if (rank.has_value()) request.set_rank(*rank);
    request.set_limit(limit);
    return c->jobs().ListStepMetrics(&context, request, response);
  };
  v1::ListStepMetricsResponse all;
  ASSERT_TRUE(list(std::nullopt, 0, &all, job->id()).ok());
  ASSERT_EQ(all.metrics_size(), 10);
  EXPECT_EQ(all.metrics(0).step(), 1);
  EXPECT_EQ(all.metrics(9).step(), 5);
  for (const v1::StepMetrics& m : all.metrics()) EXPECT_EQ(m.node(), "node-metrics");
  v1::ListStepMetricsResponse rank1;
  ASSERT_TRUE(list(1, 3, &rank1, job->id()).ok());
  ASSERT_EQ(rank1.metrics_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(rank1.metrics(i).rank(), 1);
    EXPECT_EQ(rank1.metrics(i).step(), 3 + i);
    EXPECT_DOUBLE_EQ(rank1.metrics(i).loss(), 1.0 / (3 + i) + 1);
  }
  v1::ListStepMetricsResponse none;
  grpc::Status unknown = list(std::nullopt, 0, &none, "job-999999");
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(unknown.error_message(), HasSubstr("job-999999"));
  grpc::Status bad_rank = list(2, 0, &none, job->id());
  EXPECT_EQ(bad_rank.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad_rank.error_message(), HasSubstr("rank"));
  grpc::Status bad_limit = list(std::nullopt, -1, &none, job->id());
  EXPECT_EQ(bad_limit.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad_limit.error_message(), HasSubstr("limit"));
}

TEST(CoordinatorApiTest, RendezvousPutGetWaitAndTimeout) {
  auto c = CoordinatorUnderTest::Start();
  FakeWorker w(c->channel(), "node-rdv", 2);
  ASSERT_TRUE(w.Register().ok() && w.Connect().ok());
  absl::StatusOr<v1::Job> job = c->Submit(TinySpec(2));
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
  auto get = [&](const v1::Scope& s, const std::string& key, v1::GetResponse* response) {
    return RendezvousGet(c->rendezvous(), s, key, response);
  };
  auto wait = [&](const std::vector<std::string>& keys, int64_t timeout_ms) {
    return RendezvousWait(c->rendezvous(), scope, keys, timeout_ms);
  };

  const std::string nccl_id(128, '\x07');
  ASSERT_TRUE(put(scope, "nccl_unique_id", nccl_id).ok());
  v1::GetResponse got;
  ASSERT_TRUE(get(scope, "nccl_unique_id", &got).ok());
  EXPECT_TRUE(got.found());
  EXPECT_EQ(got.value(), nccl_id);
  ASSERT_TRUE(get(scope, "not_yet", &got).ok());
  EXPECT_FALSE(got.found());

  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(200));
    EXPECT_TRUE(put(scope, "rank1", "addr1").ok());
  });
  absl::Time start = absl::Now();
  grpc::Status waited = wait({"nccl_unique_id", "rank1"}, 10000);
  late.join();
  EXPECT_TRUE(waited.ok()) << waited.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  grpc::Status timed_out = wait({"rank1", "rank2", "rank3"}, 300);
  EXPECT_EQ(timed_out.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(timed_out.error_message(), HasSubstr("rank2, rank3"));

  v1::Scope other = scope;
  other.set_attempt(2);
  EXPECT_EQ(put(other, "k", "v").error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  v1::Scope no_job;
  no_job.set_attempt(1);
  grpc::Status bad_scope = put(no_job, "k", "v");
  EXPECT_EQ(bad_scope.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad_scope.error_message(), HasSubstr("scope.job_id"));
  grpc::Status too_big = put(scope, "big", std::string((1 << 20) + 1, 'x'));
  EXPECT_EQ(too_big.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(too_big.error_message(), HasSubstr("value"));

  // The attempt ends: its keys are gone.
  grpc::ClientContext context;
  v1::CancelJobRequest cancel;
  cancel.set_id(job->id());
  v1::Job cancelled;
  ASSERT_TRUE(c->jobs().CancelJob(&context, cancel, &cancelled).ok());
  EXPECT_EQ(get(scope, "nccl_unique_id", &got).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

}  // namespace
}  // namespace dropless::testing
