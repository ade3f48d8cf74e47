// Refusals (ctest label `security`): rendezvous keys are readable and writable only by the ranks
// of their attempt, which hold the attempt's secret (Assignment.rendezvous_secret); with
// --worker-listen the users' and the workers' APIs answer only on their own port.
#include <signal.h>

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"

namespace dropless::testing {
namespace {

using ::testing::HasSubstr;

v1::Scope ScopeOf(const v1::Assignment& assignment) {
  v1::Scope scope;
  scope.set_job_id(assignment.job_id());
  scope.set_attempt(assignment.attempt());
  scope.set_secret(assignment.rendezvous_secret());
  return scope;
}

TEST(CoordinatorSecurityTest, RendezvousKeysAreRefusedWithoutTheAttemptsSecret) {
  auto c = CoordinatorUnderTest::Start("", kReconnectLeaseMs);
  FakeWorker w(c->channel(), "node-sec", 2);
  ASSERT_TRUE(w.Register().ok() && w.Connect().ok());
  ASSERT_TRUE(c->Submit(TinySpec(1, 1, "a")).ok());
  std::optional<v1::Assignment> a = w.NextAssignment();
  ASSERT_TRUE(c->Submit(TinySpec(1, 1, "b")).ok());
  std::optional<v1::Assignment> b = w.NextAssignment();
  ASSERT_TRUE(a.has_value() && b.has_value());
  ASSERT_EQ(a->rendezvous_secret().size(), 32u);
  EXPECT_NE(a->rendezvous_secret(), b->rendezvous_secret());
  const v1::Scope mine = ScopeOf(*a);
  ASSERT_TRUE(RendezvousPut(c->rendezvous(), mine, "nccl_unique_id", "secret-bytes").ok());

  // Job b's ranks hold b's secret, not a's: a's keys are not theirs to read or overwrite.
  v1::Scope borrowed = mine;
  borrowed.set_secret(b->rendezvous_secret());
  v1::Scope none = mine;
  none.clear_secret();
  v1::Scope guessed = mine;
  guessed.set_secret(std::string(32, '0'));
  for (const v1::Scope& intruder : {borrowed, none, guessed}) {
    v1::GetResponse got;
    grpc::Status get = RendezvousGet(c->rendezvous(), intruder, "nccl_unique_id", &got);
    EXPECT_EQ(get.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(get.error_message(), HasSubstr("scope.secret"));
    EXPECT_FALSE(got.found());
    EXPECT_EQ(RendezvousPut(c->rendezvous(), intruder, "nccl_unique_id", "forged").error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(RendezvousWait(c->rendezvous(), intruder, {"nccl_unique_id"}, 0).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }

  // The secret is stored with the attempt: after a restart the ranks keep theirs, intruders stay
  // out, and the key was not overwritten.
  c->KillAndRestart();
  v1::GetResponse got;
  grpc::Status after = grpc::Status(grpc::StatusCode::UNAVAILABLE, "");
  for (int i = 0; i < 100 && after.error_code() == grpc::StatusCode::UNAVAILABLE; ++i) {
    got.Clear();
    after = RendezvousGet(c->rendezvous(), mine, "nccl_unique_id", &got);
    if (after.error_code() == grpc::StatusCode::UNAVAILABLE) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(after.ok()) << after.error_message();
  EXPECT_TRUE(got.found());
  EXPECT_EQ(got.value(), "secret-bytes");
  EXPECT_EQ(RendezvousGet(c->rendezvous(), borrowed, "nccl_unique_id", &got).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

// Oversized requests are refused before any handler runs, and the server stays up.
TEST(CoordinatorSecurityTest, MessagesOverTheSizeLimitAreRefused) {
  auto c = CoordinatorUnderTest::Start();
  grpc::Status too_big;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::SubmitJobRequest request;
    request.set_spec_yaml(TinySpec(1) + "# " + std::string(5 << 20, 'x') + "\n");
    v1::Job job;
    too_big = c->jobs().SubmitJob(&context, request, &job);
  }
  EXPECT_EQ(too_big.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << too_big.error_message();
  // Under the message limit but over the spec limit (64 KiB): refused naming the size.
  absl::StatusOr<v1::Job> big_spec = c->Submit(TinySpec(1) + "# " + std::string(100 << 10, 'x'));
  EXPECT_EQ(big_spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(c->Submit(TinySpec(1)).ok());
}

TEST(CoordinatorSecurityTest, UserAndWorkerApisAnswerOnlyOnTheirOwnListener) {
  const int user_port = PickFreePort(), worker_port = PickFreePort();
  absl::StatusOr<std::unique_ptr<Process>> coordinator = Process::Start(
      {BinaryPath("dropless-coordinator"), "--insecure",
       absl::StrCat("--listen=127.0.0.1:", user_port),
       absl::StrCat("--worker-listen=127.0.0.1:", worker_port),
       absl::StrCat("--db=", MakeTempDir(), "/coordinator.db"), "--metrics-port=0"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  ASSERT_TRUE(WaitForTcpPort(user_port, absl::Seconds(20))) << (*coordinator)->Output();
  ASSERT_TRUE(WaitForTcpPort(worker_port, absl::Seconds(20))) << (*coordinator)->Output();
  auto user = grpc::CreateChannel(absl::StrCat("127.0.0.1:", user_port),
                                  grpc::InsecureChannelCredentials());
  auto worker = grpc::CreateChannel(absl::StrCat("127.0.0.1:", worker_port),
                                    grpc::InsecureChannelCredentials());
  auto deadline = [] {
    return std::chrono::system_clock::now() + std::chrono::seconds(10);
  };
  auto list_jobs = [&](const std::shared_ptr<grpc::Channel>& channel) {
    grpc::ClientContext context;
    context.set_deadline(deadline());
    v1::ListJobsResponse response;
    return v1::JobService::NewStub(channel)->ListJobs(&context, v1::ListJobsRequest(), &response);
  };
  auto register_worker = [&](const std::shared_ptr<grpc::Channel>& channel) {
    grpc::ClientContext context;
    context.set_deadline(deadline());
    v1::RegisterWorkerRequest request;
    request.set_node("node-listeners");
    request.set_slot_kind("cpu");
    request.add_devices("cpu");
    v1::RegisterWorkerResponse response;
    return v1::WorkerService::NewStub(channel)->RegisterWorker(&context, request, &response);
  };
  auto rendezvous_get = [&](const std::shared_ptr<grpc::Channel>& channel) {
    v1::Scope scope;
    scope.set_job_id("job-000001");
    scope.set_attempt(1);
    v1::GetResponse response;
    return RendezvousGet(*v1::RendezvousService::NewStub(channel), scope, "k", &response);
  };
  EXPECT_TRUE(list_jobs(user).ok());
  EXPECT_EQ(list_jobs(worker).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_TRUE(register_worker(worker).ok());
  EXPECT_EQ(register_worker(user).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(rendezvous_get(worker).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(rendezvous_get(user).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  ASSERT_TRUE((*coordinator)->Signal(SIGTERM).ok());
  absl::StatusOr<int> code = (*coordinator)->Wait(absl::Seconds(15));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0) << (*coordinator)->Output();
}

}  // namespace
}  // namespace dropless::testing
