// What a user may do with the API beyond their role's methods (ctest label `security`), against
// the real dropless-coordinator on loopback with TLS and tokens from scripts/dev-certs: priorities
// above --max-user-priority need an admin; a stream ends when its token expires; another user's
// job is answered as one that does not exist; a tokens file others may read stops the coordinator.
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"
#include "tests/integration/coordinator/secure_coordinator.h"

namespace dropless::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A submit of TinySpec(1) with `spec_priority` in the spec and `override_priority` in the
// request (0: none).
grpc::Status SubmitWithPriority(const std::shared_ptr<grpc::Channel>& channel, int spec_priority,
                                int override_priority, bool dry_run, v1::Job* job) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::SubmitJobRequest request;
  request.set_spec_yaml(absl::StrReplaceAll(
      TinySpec(1), {{"priority: 0\n", absl::StrCat("priority: ", spec_priority, "\n")}}));
  request.set_priority(override_priority);
  request.set_dry_run(dry_run);
  return v1::JobService::NewStub(channel)->SubmitJob(&context, request, job);
}

// A server stream read to its end: its status, after at most `deadline`.
template <typename Message, typename Open>
grpc::Status DrainStream(Open open, std::chrono::seconds deadline = std::chrono::seconds(20)) {
  grpc::ClientContext context;
  SetDeadline(&context, deadline);
  auto reader = open(&context);
  Message message;
  while (reader->Read(&message)) {
  }
  return reader->Finish();
}

TEST(CoordinatorAccessTest, PrioritiesAboveTheLimitNeedAnAdmin) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  SecureCoordinator c(certs, /*worker_listener=*/true, {"--max-user-priority=50"});
  auto alice = UserChannel(c.user_port(), certs, Token(certs, "alice"));
  auto admin = UserChannel(c.user_port(), certs, Token(certs, "admin"));
  const std::string refusal =
      "priority: user alice may give a job a priority of at most 50 "
      "(--max-user-priority), not ";
  // The request's override, the spec's own priority, an override of a low spec: each refused,
  // dry runs too, and nothing stored.
  struct Case {
    int spec, override_priority, effective;
    bool dry_run;
  };
  for (const Case& k : {Case{0, 51, 51, false}, Case{1000, 0, 1000, false}, Case{60, 0, 60, true},
                        Case{10, 700, 700, true}, Case{60, 40, -1, false}}) {
    v1::Job job;
    const grpc::Status status =
        SubmitWithPriority(alice, k.spec, k.override_priority, k.dry_run, &job);
    if (k.effective < 0) {  // an override down to the limit is allowed
      EXPECT_TRUE(status.ok()) << status.error_message() << c.Output();
      EXPECT_EQ(job.priority(), 40);
      continue;
    }
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << k.spec << "/" << k.override_priority << ": " << status.error_message();
    EXPECT_EQ(status.error_message(),
              absl::StrCat(refusal, k.effective, "; higher priorities need role admin"));
  }
  // Up to the limit, and below zero, a submitter's own choice.
  for (int priority : {50, -1000}) {
    v1::Job job;
    ASSERT_TRUE(SubmitWithPriority(alice, priority, 0, false, &job).ok());
    EXPECT_EQ(job.priority(), priority);
  }
  // An admin may use the spec's whole range.
  v1::Job urgent;
  ASSERT_TRUE(SubmitWithPriority(admin, 0, 1000, false, &urgent).ok());
  EXPECT_EQ(urgent.priority(), 1000);
  // The refused ones left nothing: the three accepted jobs of alice and the admin's.
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::ListJobsResponse listed;
  ASSERT_TRUE(
      v1::JobService::NewStub(admin)->ListJobs(&context, v1::ListJobsRequest(), &listed).ok());
  EXPECT_EQ(listed.jobs_size(), 4);
}

// A stream checks its caller's token at each wake-up, not only when it opened: it ends
// UNAUTHENTICATED when the token expires, while a stream of a token that has not expired goes on.
// That holds for a GetLogs without follow too, whose backlog takes longer to read than the token
// lasts: it ends at the first page it sends after the expiry, not with the backlog.
TEST(CoordinatorAccessTest, AStreamEndsWhenItsTokenExpires) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  constexpr char kBriefToken[] = "brief-token-0123456789abcdef";
  // The token must outlive the set-up below (a coordinator started, a job run, a backlog stored)
  // on a loaded machine too; the test then waits for it to expire.
  constexpr absl::Duration kTokenLifetime = absl::Seconds(25);
  const absl::Time expires =
      absl::FromUnixSeconds(absl::ToUnixSeconds(absl::Now() + kTokenLifetime));
  SecureCoordinator c(
      certs, /*worker_listener=*/true, {},
      {absl::StrCat("  - {token: ", kBriefToken, ", user: brief, role: viewer, expires: \"",
                    absl::FormatTime(absl::RFC3339_sec, expires, absl::UTCTimeZone()), "\"}")});
  auto admin = UserChannel(c.user_port(), certs, Token(certs, "admin"));
  auto brief = UserChannel(c.user_port(), certs, kBriefToken);
  // A running job with a backlog of 10 pages of 1000 lines (the store keeps 10000 a job), 30 MB
  // in all: more than loopback and gRPC buffer for a reader that stops reading.
  FakeWorker worker(WorkerChannel(c.worker_port(), certs, certs + "/workers/node-a"), "node-a", 1);
  ASSERT_TRUE(worker.Join().ok()) << c.Output();
  v1::Job job;
  ASSERT_TRUE(Submit(admin, &job).ok()) << c.Output();
  ASSERT_TRUE(worker.NextAssignment().has_value());
  ASSERT_TRUE(worker.ReportRank(job.id(), 1, 0, v1::RANK_STATE_RUNNING).ok());
  constexpr int kLines = 10000;
  constexpr int kLinesPerMessage = 1000;  // 3 MB, below the 4 MB message limit
  for (int first = 0; first < kLines; first += kLinesPerMessage) {
    v1::WorkerMessage message;
    for (int i = first; i < first + kLinesPerMessage; ++i) {
      v1::LogLine* line = message.mutable_logs()->add_lines();
      line->set_job_id(job.id());
      line->set_attempt(1);
      line->set_rank(0);
      line->set_text(absl::StrCat(i, " ", std::string(3000, 'x')));
    }
    ASSERT_TRUE(worker.Send(message).ok());
  }
  // Wait until the last line is stored.
  auto last_stored = [&] {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::GetLogsRequest request;
    request.set_job_id(job.id());
    request.set_tail_lines(1);
    auto reader = v1::JobService::NewStub(admin)->GetLogs(&context, request);
    v1::LogLine line, last;
    while (reader->Read(&line)) last = line;
    return reader->Finish().ok() && absl::StartsWith(last.text(), absl::StrCat(kLines - 1, " "));
  };
  for (int i = 0; i < 200 && !last_stored(); ++i) absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(last_stored()) << "the coordinator did not store the backlog";
  ASSERT_LT(absl::Now(), expires - absl::Seconds(2))
      << "the set-up took longer than the token's lifetime (" << kTokenLifetime << ")";

  // Opened while the token is valid: the watch's snapshot arrives, the log streams open.
  grpc::ClientContext watch_context, follow_context, backlog_context, admin_context;
  for (auto* context : {&watch_context, &follow_context, &backlog_context, &admin_context}) {
    SetDeadline(context, std::chrono::seconds(90));
  }
  v1::WatchJobRequest watch_request;
  watch_request.set_id(job.id());
  auto watch = v1::JobService::NewStub(brief)->WatchJob(&watch_context, watch_request);
  v1::JobUpdate first;
  ASSERT_TRUE(watch->Read(&first)) << watch->Finish().error_message();
  EXPECT_EQ(first.job().id(), job.id());
  // The follower asks for the last line only: it waits for live lines, which never come.
  v1::GetLogsRequest logs_request;
  logs_request.set_job_id(job.id());
  logs_request.set_follow(true);
  logs_request.set_tail_lines(1);
  auto follow = v1::JobService::NewStub(brief)->GetLogs(&follow_context, logs_request);
  follow->WaitForInitialMetadata();
  // The backlog's reader (every line) reads one line, then stops until the token has expired.
  logs_request.set_follow(false);
  logs_request.set_tail_lines(0);
  auto backlog = v1::JobService::NewStub(brief)->GetLogs(&backlog_context, logs_request);
  v1::LogLine line;
  ASSERT_TRUE(backlog->Read(&line)) << backlog->Finish().error_message();
  EXPECT_TRUE(absl::StartsWith(line.text(), "0 ")) << line.text().substr(0, 20);
  auto admins_watch = v1::JobService::NewStub(admin)->WatchJob(&admin_context, watch_request);
  ASSERT_TRUE(admins_watch->Read(&first));

  // The watch and the follower end at the expiry (within a poll), with the reason.
  while (watch->Read(&first)) {
  }
  const grpc::Status watch_end = watch->Finish();
  const absl::Time ended = absl::Now();
  while (follow->Read(&line)) {
  }
  const grpc::Status follow_end = follow->Finish();
  // The backlog, read on after the expiry, ends before its last line.
  int backlog_lines = 1;
  while (backlog->Read(&line)) ++backlog_lines;
  const grpc::Status backlog_end = backlog->Finish();
  EXPECT_LT(backlog_lines, kLines);
  for (const grpc::Status& end : {watch_end, follow_end, backlog_end}) {
    EXPECT_EQ(end.error_code(), grpc::StatusCode::UNAUTHENTICATED) << end.error_message();
    EXPECT_EQ(end.error_message(),
              absl::StrCat("expired bearer token of user brief (expired ",
                           absl::FormatTime(absl::RFC3339_sec, expires, absl::UTCTimeZone()),
                           "): the stream ends; open it again with a valid token"));
    EXPECT_THAT(end.error_message(), Not(HasSubstr(kBriefToken)));
  }
  EXPECT_GE(ended, expires - absl::Milliseconds(50));
  EXPECT_LT(ended, expires + absl::Seconds(5));
  // The admin's watch of the same job is still open: cancelling it is what ends it.
  admin_context.TryCancel();
  while (admins_watch->Read(&first)) {
  }
  EXPECT_EQ(admins_watch->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // And a new call with the expired token is refused at its start.
  EXPECT_EQ(GetJob(brief, job.id()).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

// A call carries one `authorization` header: with two, the check at the call's start and the
// handler could each take another one for the caller (a viewer's token checked, an admin's acted
// on). Refused UNAUTHENTICATED naming the reason, whichever tokens they hold.
TEST(CoordinatorAccessTest, ACallWithTwoAuthorizationHeadersIsRefused) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  SecureCoordinator c(certs, /*worker_listener=*/true);
  auto stub = v1::JobService::NewStub(UserChannel(c.user_port(), certs, ""));  // TLS only
  auto list = [&](const std::vector<std::string>& users) {
    grpc::ClientContext context;
    SetDeadline(&context);
    for (const std::string& user : users) {
      context.AddMetadata("authorization", "Bearer " + Token(certs, user));
    }
    v1::ListJobsResponse response;
    return stub->ListJobs(&context, v1::ListJobsRequest(), &response);
  };
  ASSERT_TRUE(list({"viewer"}).ok()) << c.Output();
  for (const std::vector<std::string>& users :
       {std::vector<std::string>{"viewer", "admin"}, {"admin", "viewer"}, {"alice", "alice"}}) {
    const grpc::Status refused = list(users);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED) << refused.error_message();
    EXPECT_EQ(refused.error_message(),
              "the call has 2 authorization headers; send exactly one `authorization: Bearer "
              "<token>`");
  }
}

// Job ids are sequential: a submitter asking for another user's job gets exactly the answer for a
// job that does not exist (code and message, the id aside), from every call about one job, so
// probing ids tells nothing of who runs what. The job itself is untouched.
TEST(CoordinatorAccessTest, AnotherUsersJobIsAnsweredAsOneThatDoesNotExist) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  SecureCoordinator c(certs, /*worker_listener=*/true);
  auto alice = UserChannel(c.user_port(), certs, Token(certs, "alice"));
  auto bob = UserChannel(c.user_port(), certs, Token(certs, "bob"));
  v1::Job alices, bobs;
  ASSERT_TRUE(Submit(alice, &alices).ok()) << c.Output();
  ASSERT_TRUE(Submit(bob, &bobs).ok());
  const std::string missing = "job-099999";  // the store's id format, never made here
  auto stub = v1::JobService::NewStub(bob);
  using Call = std::function<grpc::Status(const std::string& id)>;
  const std::vector<std::pair<const char*, Call>> calls = {
      {"GetJob", [&](const std::string& id) { return GetJob(bob, id); }},
      {"CancelJob", [&](const std::string& id) { return CancelJob(bob, id); }},
      {"WatchJob",
       [&](const std::string& id) {
         v1::WatchJobRequest request;
         request.set_id(id);
         return DrainStream<v1::JobUpdate>(
             [&](grpc::ClientContext* context) { return stub->WatchJob(context, request); });
       }},
      {"GetLogs",
       [&](const std::string& id) {
         v1::GetLogsRequest request;
         request.set_job_id(id);
         return DrainStream<v1::LogLine>(
             [&](grpc::ClientContext* context) { return stub->GetLogs(context, request); });
       }},
      {"GetLogs --follow",
       [&](const std::string& id) {
         v1::GetLogsRequest request;
         request.set_job_id(id);
         request.set_follow(true);
         return DrainStream<v1::LogLine>(
             [&](grpc::ClientContext* context) { return stub->GetLogs(context, request); });
       }},
      {"ListEvents",
       [&](const std::string& id) {
         grpc::ClientContext context;
         SetDeadline(&context);
         v1::ListEventsRequest request;
         request.set_job_id(id);
         v1::ListEventsResponse response;
         return stub->ListEvents(&context, request, &response);
       }},
      {"ListStepMetrics",
       [&](const std::string& id) {
         grpc::ClientContext context;
         SetDeadline(&context);
         v1::ListStepMetricsRequest request;
         request.set_job_id(id);
         v1::ListStepMetricsResponse response;
         return stub->ListStepMetrics(&context, request, &response);
       }},
  };
  for (const auto& [name, call] : calls) {
    const grpc::Status others = call(alices.id());
    const grpc::Status none = call(missing);
    EXPECT_EQ(others.error_code(), grpc::StatusCode::NOT_FOUND) << name;
    EXPECT_EQ(none.error_code(), others.error_code()) << name;
    EXPECT_EQ(absl::StrReplaceAll(others.error_message(), {{alices.id(), "ID"}}),
              absl::StrReplaceAll(none.error_message(), {{missing, "ID"}}))
        << name;
    EXPECT_EQ(others.error_message(), absl::StrCat("job \"", alices.id(), "\" not found"))
        << name;
    EXPECT_THAT(others.error_message(), Not(HasSubstr("alice"))) << name;
    // Bob's own job answers.
    if (std::string(name) != "CancelJob" && std::string(name) != "GetLogs --follow" &&
        std::string(name) != "WatchJob") {
      EXPECT_TRUE(call(bobs.id()).ok()) << name;
    }
  }
  // Alice's job was not cancelled, and she (and an admin) still see it.
  v1::Job now;
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::GetJobRequest request;
  request.set_id(alices.id());
  ASSERT_TRUE(v1::JobService::NewStub(alice)->GetJob(&context, request, &now).ok());
  EXPECT_EQ(now.state(), v1::JOB_STATE_PENDING);
}

// As ssh refuses a private key others may read, the coordinator does not start on a tokens file
// its group or others may read, naming the file, its mode and the fix.
TEST(CoordinatorAccessTest, ATokensFileOthersMayReadStopsTheCoordinator) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  const std::string dir = MakeTempDir();
  const std::string tokens = dir + "/tokens.yaml";
  std::ofstream(tokens) << ReadWholeFile(certs + "/tokens.yaml");
  ASSERT_EQ(chmod(tokens.c_str(), 0644), 0);
  absl::StatusOr<std::unique_ptr<Process>> coordinator =
      Process::Start(SecureCoordinatorArgv(certs, dir, PickFreePort(), tokens));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<int> exit_code = (*coordinator)->Wait(absl::Seconds(20));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_NE(*exit_code, 0);
  EXPECT_THAT((*coordinator)->Output(),
              HasSubstr(absl::StrCat("tokens file ", tokens,
                                     ": mode 0644 gives others than its owner access (group "
                                     "read, others read); a file of bearer tokens must be "
                                     "readable by its owner only: chmod 600 ",
                                     tokens)));
}

}  // namespace
}  // namespace dropless::testing
