// The job list and job limits against the real coordinator: ListJobs filtered by labels and read a
// page at a time (page tokens), labels kept across a restart, time_limit failing a job that runs
// too long, attempts left or not; and durations as google.protobuf.Duration next to the older
// millisecond fields.
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/time_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"

namespace dropless::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// TinySpec with more top-level fields before `priority:`.
std::string SpecWith(const std::string& fields, int max_attempts = 1) {
  return absl::StrReplaceAll(TinySpec(1, max_attempts),
                             {{"priority: 0\n", fields + "\npriority: 0\n"}});
}

grpc::Status List(CoordinatorUnderTest& c, const v1::ListJobsRequest& request,
                  v1::ListJobsResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return c.jobs().ListJobs(&context, request, response);
}

#define ASSERT_OK(call)                                                  \
  do {                                                                   \
    const grpc::Status status_ = (call);                                 \
    ASSERT_TRUE(status_.ok()) << status_.error_code() << ": " << status_.error_message(); \
  } while (0)

std::vector<std::string> Ids(const v1::ListJobsResponse& response) {
  std::vector<std::string> ids;
  for (const v1::Job& job : response.jobs()) ids.push_back(job.id());
  return ids;
}

TEST(CoordinatorJobsApiTest, ListJobsFiltersByLabelsAndReadsPages) {
  auto c = CoordinatorUnderTest::Start();
  // No worker: every job stays PENDING.
  for (const char* labels : {"labels: {team: a, tier: gold}", "labels: {team: b, tier: gold}",
                             "labels: {team: a}", "labels: {team: a}", "labels: {}"}) {
    ASSERT_TRUE(c->Submit(SpecWith(labels)).ok());
  }
  v1::ListJobsRequest request;
  v1::ListJobsResponse response;
  (*request.mutable_labels())["team"] = "a";
  ASSERT_OK(List(*c, request, &response));
  EXPECT_THAT(Ids(response), ElementsAre("job-000001", "job-000003", "job-000004"));
  EXPECT_EQ(response.jobs(0).labels().at("tier"), "gold");
  EXPECT_TRUE(response.next_page_token().empty());
  (*request.mutable_labels())["tier"] = "gold";
  ASSERT_OK(List(*c, request, &response));
  EXPECT_THAT(Ids(response), ElementsAre("job-000001"));
  // A selector no job's labels could satisfy is refused naming the label, not answered empty.
  v1::ListJobsRequest impossible;
  (*impossible.mutable_labels())["team"] = "a=b";
  grpc::Status refused = List(*c, impossible, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), ::testing::HasSubstr("labels.team: value must"));

  // Pages of two of team a: the token carries on after the last job of the page.
  request.mutable_labels()->erase("tier");
  request.set_page_size(2);
  ASSERT_OK(List(*c, request, &response));
  EXPECT_THAT(Ids(response), ElementsAre("job-000001", "job-000003"));
  ASSERT_FALSE(response.next_page_token().empty());
  request.set_page_token(response.next_page_token());
  ASSERT_OK(List(*c, request, &response));
  EXPECT_THAT(Ids(response), ElementsAre("job-000004"));
  EXPECT_TRUE(response.next_page_token().empty());

  // Every job, one page at a time, in submission order.
  v1::ListJobsRequest one;
  one.set_page_size(1);
  std::vector<std::string> all;
  do {
    ASSERT_OK(List(*c, one, &response));
    ASSERT_LE(response.jobs_size(), 1);
    for (const v1::Job& job : response.jobs()) all.push_back(job.id());
    one.set_page_token(response.next_page_token());
  } while (!one.page_token().empty());
  EXPECT_THAT(all, ElementsAre("job-000001", "job-000002", "job-000003", "job-000004",
                               "job-000005"));

  // Errors name the field.
  v1::ListJobsRequest bad;
  bad.set_page_token("not-a-token");
  grpc::Status status = List(*c, bad, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("page_token"));
  bad.Clear();
  bad.set_page_size(1001);
  status = List(*c, bad, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("page_size"));
  bad.Clear();
  bad.set_limit(2);
  bad.set_page_size(2);
  status = List(*c, bad, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("limit"));

  // Labels are stored with the job: a restarted coordinator filters the same.
  c->KillAndRestart();
  v1::Job reloaded =
      c->WaitForJob("job-000002", [](const v1::Job& j) { return !j.labels().empty(); });
  EXPECT_EQ(reloaded.labels().at("tier"), "gold");
  v1::ListJobsRequest team_b;
  (*team_b.mutable_labels())["team"] = "b";
  ASSERT_OK(List(*c, team_b, &response));
  EXPECT_THAT(Ids(response), ElementsAre("job-000002"));
}

TEST(CoordinatorJobsApiTest, TimeLimitFailsARunningJobWithAttemptsLeft) {
  auto c = CoordinatorUnderTest::Start();
  FakeWorker w(c->channel(), "node-slow", 1);
  ASSERT_TRUE(w.Register().ok() && w.Connect().ok());
  absl::StatusOr<v1::Job> job = c->Submit(SpecWith("time_limit: 2s", /*max_attempts=*/3));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->time_limit().seconds(), 2);
  ASSERT_TRUE(w.NextAssignment().has_value());
  ASSERT_TRUE(w.ReportRank(job->id(), 1, 0, v1::RANK_STATE_RUNNING).ok());
  c->WaitForState(job->id(), v1::JOB_STATE_RUNNING);
  const absl::Time running = absl::Now();

  v1::Job failed = c->WaitForState(job->id(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_GE(absl::Now() - running, absl::Seconds(1));  // not before its time
  EXPECT_THAT(failed.message(), HasSubstr("time limit of 2s exceeded"));
  EXPECT_EQ(failed.attempt(), 1);  // not retried
  // The worker is told to stop the rank.
  std::optional<v1::Cancellation> cancel = w.NextCancellation();
  ASSERT_TRUE(cancel.has_value());
  EXPECT_EQ(cancel->job_id(), job->id());
}

// A job whose ranks never get to run (stuck in their set-up) is held to its time limit from its
// placement: it does not stay SCHEDULED forever.
TEST(CoordinatorJobsApiTest, TimeLimitFailsAJobThatNeverStarts) {
  auto c = CoordinatorUnderTest::Start();
  FakeWorker w(c->channel(), "node-stuck", 1);
  ASSERT_TRUE(w.Register().ok() && w.Connect().ok());
  const absl::Time submitted = absl::Now();  // before the placement the limit counts from
  absl::StatusOr<v1::Job> job = c->Submit(SpecWith("time_limit: 2s", /*max_attempts=*/3));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(w.NextAssignment().has_value());
  ASSERT_TRUE(w.ReportRank(job->id(), 1, 0, v1::RANK_STATE_STARTING).ok());
  v1::Job failed = c->WaitForState(job->id(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_GE(absl::Now() - submitted, absl::Seconds(2));
  EXPECT_THAT(failed.message(), HasSubstr("time limit of 2s exceeded (placed, never running"));
  EXPECT_EQ(failed.attempt(), 1);
  std::optional<v1::Cancellation> cancel = w.NextCancellation();
  ASSERT_TRUE(cancel.has_value());
  EXPECT_EQ(cancel->job_id(), job->id());
}

TEST(CoordinatorJobsApiTest, NoTimeLimitMeansNone) {
  auto c = CoordinatorUnderTest::Start();
  absl::StatusOr<v1::Job> job = c->Submit(TinySpec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FALSE(job->has_time_limit());
  EXPECT_TRUE(job->labels().empty());
}

TEST(CoordinatorJobsApiTest, DurationsAreDurationsNextToTheirMillisecondFields) {
  using google::protobuf::util::TimeUtil;
  auto c = CoordinatorUnderTest::Start();
  auto workers = v1::WorkerService::NewStub(c->channel());
  v1::RegisterWorkerRequest registration;
  registration.set_node("node-d");
  registration.set_address("127.0.0.1");
  registration.set_slot_kind("cpu");
  registration.add_devices("cpu");
  v1::RegisterWorkerResponse registered;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    ASSERT_OK(workers->RegisterWorker(&context, registration, &registered));
  }
  EXPECT_EQ(TimeUtil::DurationToMilliseconds(registered.heartbeat_interval()), kHeartbeatMs);
  EXPECT_EQ(registered.heartbeat_interval_ms(), kHeartbeatMs);
  EXPECT_EQ(TimeUtil::DurationToMilliseconds(registered.lease_timeout()), kLeaseMs);
  EXPECT_EQ(registered.lease_timeout_ms(), kLeaseMs);

  // Rendezvous Wait: the Duration wins over timeout_ms; a negative one is refused by name.
  FakeWorker w(c->channel(), "node-rdv", 1);
  ASSERT_TRUE(w.Register().ok() && w.Connect().ok());
  absl::StatusOr<v1::Job> job = c->Submit(TinySpec(1));
  ASSERT_TRUE(job.ok());
  std::optional<v1::Assignment> assignment = w.NextAssignment();
  ASSERT_TRUE(assignment.has_value());
  v1::WaitRequest wait;
  wait.mutable_scope()->set_job_id(job->id());
  wait.mutable_scope()->set_attempt(1);
  wait.mutable_scope()->set_secret(assignment->rendezvous_secret());
  wait.add_keys("never");
  wait.set_timeout_ms(60000);
  *wait.mutable_timeout() = TimeUtil::MillisecondsToDuration(300);
  const absl::Time start = absl::Now();
  v1::WaitResponse waited;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status status = c->rendezvous().Wait(&context, wait, &waited);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("never"));
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // 300 ms, not the 60 s of timeout_ms
  *wait.mutable_timeout() = TimeUtil::MillisecondsToDuration(-5);
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status status = c->rendezvous().Wait(&context, wait, &waited);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("timeout: must not be negative"));
  }
  // Past protobuf's range (the milliseconds would overflow): refused by name, not wrapped around.
  wait.mutable_timeout()->set_seconds(int64_t{1} << 62);
  wait.mutable_timeout()->set_nanos(0);
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status status = c->rendezvous().Wait(&context, wait, &waited);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("timeout: out of range"));
  }
  // GetLogs' `since` likewise (before, it wrapped and silently filtered out every line).
  v1::GetLogsRequest logs;
  logs.set_job_id(job->id());
  logs.mutable_since()->set_seconds(int64_t{1} << 62);
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = c->jobs().GetLogs(&context, logs);
    v1::LogLine line;
    while (reader->Read(&line)) {
    }
    grpc::Status status = reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("since: out of range"));
  }
}

}  // namespace
}  // namespace dropless::testing
