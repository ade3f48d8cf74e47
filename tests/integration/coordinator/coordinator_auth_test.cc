// Refusals of TLS, worker certificates and user tokens (ctest label `security`), against the real
// dropless-coordinator on loopback with certificates and tokens from scripts/dev-certs. Every
// refusal is checked for its exact status code and for a message that names the problem.
#include <grpcpp/impl/client_unary_call.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"
#include "tests/integration/coordinator/secure_coordinator.h"

namespace dropless::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

grpc::Status Register(const std::shared_ptr<grpc::Channel>& channel, const std::string& node,
                      std::string* worker_id = nullptr) {
  auto stub = v1::WorkerService::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::RegisterWorkerRequest request;
  request.set_node(node);
  request.set_slot_kind("cpu");
  request.add_devices("cpu");
  v1::RegisterWorkerResponse response;
  grpc::Status status = stub->RegisterWorker(&context, request, &response);
  if (worker_id != nullptr) *worker_id = response.worker_id();
  return status;
}

grpc::Status ListJobs(const std::shared_ptr<grpc::Channel>& channel, const std::string& owner,
                      std::vector<std::string>* ids) {
  auto stub = v1::JobService::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::ListJobsRequest request;
  request.set_owner(owner);
  v1::ListJobsResponse response;
  grpc::Status status = stub->ListJobs(&context, request, &response);
  for (const v1::Job& job : response.jobs()) ids->push_back(job.id());
  return status;
}

std::vector<std::string> ListJobIds(const std::shared_ptr<grpc::Channel>& channel,
                                    const std::string& owner = "") {
  std::vector<std::string> ids;
  grpc::Status status = ListJobs(channel, owner, &ids);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return ids;
}

// One unary call of `path` with an empty message, whatever the method's type.
grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel, const char* path) {
  grpc::ClientContext context;
  SetDeadline(&context);
  grpc::Slice empty{std::string()};
  grpc::ByteBuffer request(&empty, 1), response;
  const grpc::internal::RpcMethod method(path, grpc::internal::RpcMethod::NORMAL_RPC);
  return grpc::internal::BlockingUnaryCall(channel.get(), method, &context, request, &response);
}

TEST(CoordinatorAuthTest, WorkerPortRefusesAClientWithoutCertificate) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  SecureCoordinator c(certs, /*worker_listener=*/true);
  grpc::Status none = Register(WorkerChannel(c.worker_port(), certs, ""), "node-a");
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << none.error_message();
  EXPECT_THAT(none.error_message(),
              HasSubstr("WorkerService needs a worker's client certificate (mutual TLS; the node "
                        "name is its common name): none was presented"));
  // The certificate's owner gets through.
  grpc::Status own = Register(WorkerChannel(c.worker_port(), certs, certs + "/workers/node-a"),
                              "node-a");
  EXPECT_TRUE(own.ok()) << own.error_message() << c.Output();
}

TEST(CoordinatorAuthTest, SharedListenerRefusesWorkerCallsWithoutCertificate) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  SecureCoordinator c(certs, /*worker_listener=*/false);
  // One listener for users and workers: TLS succeeds without a client certificate (users have
  // none), and the worker API is refused by name.
  grpc::Status none = Register(UserChannel(c.user_port(), certs, Token(certs, "admin")), "node-a");
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << none.error_message();
  EXPECT_THAT(none.error_message(), HasSubstr("needs a worker's client certificate"));
  v1::GetResponse got;
  grpc::Status rendezvous = RendezvousGet(
      *v1::RendezvousService::NewStub(UserChannel(c.user_port(), certs, Token(certs, "admin"))),
      v1::Scope(), "k", &got);
  EXPECT_EQ(rendezvous.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(rendezvous.error_message(),
              HasSubstr("RendezvousService needs a worker's client certificate"));
}

TEST(CoordinatorAuthTest, ReflectionAndUnknownServicesNeedAKnownCaller) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  SecureCoordinator c(certs, /*worker_listener=*/false);
  constexpr char kReflection[] = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
  constexpr char kUnknown[] = "/dropless.v1.NoSuchService/Call";
  const auto anonymous = UserChannel(c.user_port(), certs, "");
  for (const char* path : {kReflection, kUnknown}) {
    grpc::Status refused = RawCall(anonymous, path);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED) << path;
    EXPECT_THAT(refused.error_message(), HasSubstr("needs a bearer token"));
    EXPECT_EQ(RawCall(UserChannel(c.user_port(), certs, "not-a-token"), path).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_TRUE(RawCall(anonymous, "/grpc.health.v1.Health/Check").ok());
  // A viewer's token or a worker's certificate gets through: reflection answers, an unknown
  // service is UNIMPLEMENTED.
  const auto viewer = UserChannel(c.user_port(), certs, Token(certs, "viewer"));
  grpc::Status reflection = RawCall(viewer, kReflection);
  EXPECT_TRUE(reflection.ok()) << reflection.error_message();
  EXPECT_EQ(RawCall(viewer, kUnknown).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  const auto worker = WorkerChannel(c.worker_port(), certs, certs + "/workers/node-a");
  EXPECT_EQ(RawCall(worker, kUnknown).error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

TEST(CoordinatorAuthTest, CertificatesOfAnotherCaAreRefusedBothWays) {
  const std::string certs = MakeCerts();
  const std::string other = MakeCerts();  // a second, unrelated dev CA
  ASSERT_FALSE(certs.empty() || other.empty());
  SecureCoordinator c(certs, /*worker_listener=*/true);
  // A worker certificate signed by another CA (trusting the right server CA).
  grpc::SslCredentialsOptions foreign = TlsOptions(certs, "");
  foreign.pem_cert_chain = ReadWholeFile(other + "/workers/node-a.pem");
  foreign.pem_private_key = ReadWholeFile(other + "/workers/node-a.key");
  // The handshake fails: the client learns only that the connection closed ("Socket closed"); the
  // coordinator's log says why.
  grpc::Status worker = Register(Connect(c.worker_port(), grpc::SslCredentials(foreign)), "node-a");
  EXPECT_EQ(worker.error_code(), grpc::StatusCode::UNAVAILABLE) << worker.error_message();
  EXPECT_THAT(c.Output(), HasSubstr("certificate verify failed")) << c.Output();
  // A client that trusts another CA does not accept the coordinator's certificate.
  v1::Job job;
  grpc::Status user = Submit(UserChannel(c.user_port(), other, Token(certs, "alice")), &job);
  EXPECT_EQ(user.error_code(), grpc::StatusCode::UNAVAILABLE) << user.error_message();
  EXPECT_THAT(user.error_message(),
              HasSubstr("Ssl handshake failed: SSL_ERROR_SSL: error:0A000086:SSL "
                        "routines::certificate verify failed"));
}

TEST(CoordinatorAuthTest, WorkerCannotRegisterOrReportAsAnotherNode) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  SecureCoordinator c(certs, /*worker_listener=*/true);
  auto node_a = WorkerChannel(c.worker_port(), certs, certs + "/workers/node-a");
  auto node_b = WorkerChannel(c.worker_port(), certs, certs + "/workers/node-b");
  std::string a_id;
  ASSERT_TRUE(Register(node_a, "node-a", &a_id).ok()) << c.Output();
  // node-b's certificate registering as node-a.
  grpc::Status impersonated = Register(node_b, "node-a");
  EXPECT_EQ(impersonated.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(impersonated.error_message(),
              HasSubstr("node \"node-a\" does not match the client certificate, which is node "
                        "\"node-b\""));
  // node-b's certificate opening a session as node-a's worker id.
  auto stub = v1::WorkerService::NewStub(node_b);
  grpc::ClientContext context;
  SetDeadline(&context);
  auto stream = stub->Session(&context);
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id(a_id);
  hello.mutable_hello()->set_boot_id("b00t");
  stream->Write(hello);
  v1::CoordinatorMessage reply;
  while (stream->Read(&reply)) {
  }
  grpc::Status session = stream->Finish();
  EXPECT_EQ(session.error_code(), grpc::StatusCode::PERMISSION_DENIED) << session.error_message();
  EXPECT_THAT(session.error_message(),
              HasSubstr("the client certificate is node \"node-b\": a worker may only report as "
                        "itself"));
}

TEST(CoordinatorAuthTest, JobServiceNeedsAKnownUnexpiredToken) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  SecureCoordinator c(certs, /*worker_listener=*/true);
  v1::Job job;
  grpc::Status missing = Submit(UserChannel(c.user_port(), certs, ""), &job);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(missing.error_message(), HasSubstr("missing bearer token"));
  grpc::Status unknown =
      Submit(UserChannel(c.user_port(), certs, "not-a-token-of-this-cluster"), &job);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(unknown.error_message(), HasSubstr("unknown bearer token"));
  grpc::Status expired =
      Submit(UserChannel(c.user_port(), certs, SecureCoordinator::kExpiredToken), &job);
  EXPECT_EQ(expired.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(expired.error_message(), HasSubstr("expired bearer token of user former"));
  // The token is never echoed back.
  EXPECT_THAT(expired.error_message(), Not(HasSubstr(SecureCoordinator::kExpiredToken)));
}

TEST(CoordinatorAuthTest, RolesLimitWhatAUserMayDo) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  SecureCoordinator c(certs, /*worker_listener=*/true);
  auto viewer = UserChannel(c.user_port(), certs, Token(certs, "viewer"));
  auto alice = UserChannel(c.user_port(), certs, Token(certs, "alice"));
  v1::Job job;
  grpc::Status viewer_submit = Submit(viewer, &job);
  EXPECT_EQ(viewer_submit.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(viewer_submit.error_message(),
              HasSubstr("user viewer has role viewer; SubmitJob needs role submitter"));
  ASSERT_TRUE(Submit(alice, &job).ok()) << c.Output();
  EXPECT_EQ(job.owner(), "alice");
  // A viewer reads every job but cancels none.
  EXPECT_TRUE(GetJob(viewer, job.id()).ok());
  grpc::Status viewer_cancel = CancelJob(viewer, job.id());
  EXPECT_EQ(viewer_cancel.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(viewer_cancel.error_message(), HasSubstr("CancelJob needs role submitter"));
}

TEST(CoordinatorAuthTest, SubmitterSeesAndCancelsOnlyTheirOwnJobs) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  SecureCoordinator c(certs, /*worker_listener=*/true);
  auto alice = UserChannel(c.user_port(), certs, Token(certs, "alice"));
  auto bob = UserChannel(c.user_port(), certs, Token(certs, "bob"));
  auto admin = UserChannel(c.user_port(), certs, Token(certs, "admin"));
  v1::Job alices, bobs;
  ASSERT_TRUE(Submit(alice, &alices).ok()) << c.Output();
  ASSERT_TRUE(Submit(bob, &bobs).ok());
  // Another user's job is one bob cannot tell from a job that does not exist
  // (coordinator_access_test.cc compares every per-job call).
  for (const grpc::Status& refused : {GetJob(bob, alices.id()), CancelJob(bob, alices.id())}) {
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(refused.error_message(), absl::StrCat("job \"", alices.id(), "\" not found"));
  }
  EXPECT_THAT(ListJobIds(bob), ::testing::ElementsAre(bobs.id()));
  EXPECT_THAT(ListJobIds(admin), ::testing::UnorderedElementsAre(alices.id(), bobs.id()));
  // Events: a submitter's own job's, never the cluster's (which tell of every user's jobs).
  {
    auto events = [](const std::shared_ptr<grpc::Channel>& channel, const std::string& job_id) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      v1::ListEventsRequest request;
      request.set_job_id(job_id);
      v1::ListEventsResponse response;
      return v1::JobService::NewStub(channel)->ListEvents(&context, request, &response);
    };
    EXPECT_TRUE(events(bob, bobs.id()).ok());
    EXPECT_EQ(events(bob, alices.id()).error_code(), grpc::StatusCode::NOT_FOUND);
    const grpc::Status cluster = events(bob, "");
    EXPECT_EQ(cluster.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(cluster.error_message(), HasSubstr("job_id: user bob (role submitter)"));
    EXPECT_TRUE(events(admin, "").ok());
  }
  EXPECT_TRUE(CancelJob(bob, bobs.id()).ok());
  EXPECT_TRUE(CancelJob(admin, alices.id()).ok());
}

// One connection carrying several users' calls (a gateway or web UI sending each user's token
// per call): each call is its own caller. gRPC shares one AuthContext among a connection's calls,
// so a caller recorded there (as it once was) answered for every later call on the connection.
TEST(CoordinatorAuthTest, CallsOfSeveralUsersOnOneConnectionAreEachTheirOwnCaller) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  SecureCoordinator c(certs, /*worker_listener=*/true);
  auto shared = UserChannel(c.user_port(), certs, "");  // TLS only: tokens go per call
  auto stub = v1::JobService::NewStub(shared);
  auto as = [&](const std::string& user, grpc::ClientContext* context) {
    SetDeadline(context);
    context->AddMetadata("authorization", "Bearer " + Token(certs, user));
  };
  auto submit = [&](const std::string& user, v1::Job* job) {
    grpc::ClientContext context;
    as(user, &context);
    v1::SubmitJobRequest request;
    request.set_spec_yaml(TinySpec(1));
    return stub->SubmitJob(&context, request, job);
  };
  auto get = [&](const std::string& user, const std::string& id) {
    grpc::ClientContext context;
    as(user, &context);
    v1::GetJobRequest request;
    request.set_id(id);
    v1::Job job;
    return stub->GetJob(&context, request, &job);
  };
  {
    grpc::ClientContext context;
    as("admin", &context);
    v1::GetVersionResponse version;
    ASSERT_TRUE(stub->GetVersion(&context, v1::GetVersionRequest(), &version).ok()) << c.Output();
  }
  v1::Job alices, bobs;
  ASSERT_TRUE(submit("alice", &alices).ok());
  ASSERT_TRUE(submit("bob", &bobs).ok());
  EXPECT_EQ(alices.owner(), "alice");
  EXPECT_EQ(bobs.owner(), "bob");
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(get("bob", bobs.id()).ok());
    const grpc::Status refused = get("bob", alices.id());
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::NOT_FOUND) << refused.error_message();
    EXPECT_EQ(refused.error_message(), absl::StrCat("job \"", alices.id(), "\" not found"));
    EXPECT_TRUE(get("admin", alices.id()).ok());
  }
}

// The worker is told whose job it runs (Assignment.owner): its ranks mark the checkpoints they
// claim with it and refuse a checkpoint.dir another user's job claimed (checkpoint_claim.h).
TEST(CoordinatorAuthTest, AnAssignmentNamesTheJobsOwner) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  SecureCoordinator c(certs, /*worker_listener=*/true);
  FakeWorker worker(WorkerChannel(c.worker_port(), certs, certs + "/workers/node-a"), "node-a", 1);
  ASSERT_TRUE(worker.Join().ok()) << c.Output();
  v1::Job alices;
  ASSERT_TRUE(Submit(UserChannel(c.user_port(), certs, Token(certs, "alice")), &alices).ok());
  std::optional<v1::Assignment> assignment = worker.NextAssignment();
  ASSERT_TRUE(assignment.has_value());
  EXPECT_EQ(assignment->job_id(), alices.id());
  EXPECT_EQ(assignment->owner(), "alice");
}

// Open streams (WatchJob, GetLogs) are bounded per user and in all: a client that opens
// streams and never reads them cannot run the coordinator out of threads and memory. A stream
// that ends gives its place back.
TEST(CoordinatorAuthTest, OpenStreamsAreBoundedPerUserAndInAll) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  SecureCoordinator c(certs, /*worker_listener=*/true,
                      {"--max-streams-per-user=2", "--max-streams=3"});
  auto alice = UserChannel(c.user_port(), certs, Token(certs, "alice"));
  auto bob = UserChannel(c.user_port(), certs, Token(certs, "bob"));
  v1::Job alices, bobs;
  ASSERT_TRUE(Submit(alice, &alices).ok()) << c.Output();
  ASSERT_TRUE(Submit(bob, &bobs).ok());
  struct Stream {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::JobUpdate>> reader;
  };
  // A watch of the (pending) job: OK when its snapshot arrives, else the refusal.
  auto watch = [](const std::shared_ptr<grpc::Channel>& channel, const std::string& id,
                  std::vector<std::unique_ptr<Stream>>* open) {
    auto s = std::make_unique<Stream>();
    v1::WatchJobRequest request;
    request.set_id(id);
    s->reader = v1::JobService::NewStub(channel)->WatchJob(&s->context, request);
    v1::JobUpdate first;
    if (s->reader->Read(&first)) {
      open->push_back(std::move(s));
      return grpc::Status::OK;
    }
    return s->reader->Finish();
  };
  std::vector<std::unique_ptr<Stream>> alices_streams, bobs_streams;
  ASSERT_TRUE(watch(alice, alices.id(), &alices_streams).ok());
  ASSERT_TRUE(watch(alice, alices.id(), &alices_streams).ok());
  const grpc::Status third = watch(alice, alices.id(), &alices_streams);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(third.error_message(), HasSubstr("user alice has 2 streams open"));
  {
    // GetLogs without follow takes a place too (it holds a thread while its backlog is sent).
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::GetLogsRequest request;
    request.set_job_id(alices.id());
    auto logs = v1::JobService::NewStub(alice)->GetLogs(&context, request);
    v1::LogLine line;
    while (logs->Read(&line)) {
    }
    const grpc::Status refused = logs->Finish();
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(refused.error_message(), HasSubstr("user alice has 2 streams open"));
  }
  ASSERT_TRUE(watch(bob, bobs.id(), &bobs_streams).ok());
  const grpc::Status over = watch(bob, bobs.id(), &bobs_streams);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(over.error_message(), HasSubstr("3 streams open"));
  EXPECT_THAT(over.error_message(), HasSubstr("--max-streams 3"));
  // Alice ends one of hers: bob gets its place.
  alices_streams.back()->context.TryCancel();
  (void)alices_streams.back()->reader->Finish();
  alices_streams.pop_back();
  grpc::Status again;
  for (int i = 0; i < 50; ++i) {
    again = watch(bob, bobs.id(), &bobs_streams);
    if (again.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));  // the server sees the cancel within its poll
  }
  EXPECT_TRUE(again.ok()) << again.error_message();
  for (auto* streams : {&alices_streams, &bobs_streams}) {
    for (auto& s : *streams) {
      s->context.TryCancel();
      (void)s->reader->Finish();
    }
  }
}

TEST(CoordinatorAuthTest, ListJobsOwnerFilterWithinTheCallersRights) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  SecureCoordinator c(certs, /*worker_listener=*/true);
  auto alice = UserChannel(c.user_port(), certs, Token(certs, "alice"));
  auto bob = UserChannel(c.user_port(), certs, Token(certs, "bob"));
  auto viewer = UserChannel(c.user_port(), certs, Token(certs, "viewer"));
  auto admin = UserChannel(c.user_port(), certs, Token(certs, "admin"));
  v1::Job alices, bobs, admins;
  ASSERT_TRUE(Submit(alice, &alices).ok()) << c.Output();
  ASSERT_TRUE(Submit(bob, &bobs).ok());
  ASSERT_TRUE(Submit(admin, &admins).ok());
  // Viewers and admins pick any owner, or none.
  EXPECT_THAT(ListJobIds(viewer, "alice"), ::testing::ElementsAre(alices.id()));
  EXPECT_THAT(ListJobIds(admin, "bob"), ::testing::ElementsAre(bobs.id()));
  EXPECT_THAT(ListJobIds(admin, "admin"), ::testing::ElementsAre(admins.id()));
  EXPECT_TRUE(ListJobIds(viewer, "nobody-of-this-cluster").empty());
  EXPECT_THAT(ListJobIds(viewer), ::testing::ElementsAre(alices.id(), bobs.id(), admins.id()));
  // A submitter names themself, or is refused for anyone else (not silently shown their own).
  EXPECT_THAT(ListJobIds(alice, "alice"), ::testing::ElementsAre(alices.id()));
  std::vector<std::string> ids;
  grpc::Status refused = ListJobs(bob, "alice", &ids);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("owner: user bob (role submitter) may only list their own jobs, not "
                        "user alice's"));
  EXPECT_TRUE(ids.empty());
}

// A user's unfinished jobs are bounded: jobs that can never be placed (no worker here) would
// otherwise pile up in the coordinator's memory at the submission rate. Another user is not held
// back, and a job that ends gives its place back.
TEST(CoordinatorAuthTest, AUsersUnfinishedJobsAreBounded) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  SecureCoordinator c(certs, /*worker_listener=*/true, {"--max-unfinished-jobs-per-user=2"});
  auto alice = UserChannel(c.user_port(), certs, Token(certs, "alice"));
  v1::Job first, second, third;
  ASSERT_TRUE(Submit(alice, &first).ok()) << c.Output();
  ASSERT_TRUE(Submit(alice, &second).ok());
  const grpc::Status refused = Submit(alice, &third);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("user alice has 2 unfinished jobs, the limit per user "
                        "(--max-unfinished-jobs-per-user 2)"));
  EXPECT_TRUE(Submit(UserChannel(c.user_port(), certs, Token(certs, "bob")), &third).ok());
  ASSERT_TRUE(CancelJob(alice, first.id()).ok());
  EXPECT_TRUE(Submit(alice, &third).ok());
}

TEST(CoordinatorAuthTest, SubmissionsOverTheRateLimitAreRefused) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  SecureCoordinator c(certs, /*worker_listener=*/true,
                      {"--submit-rate-per-second=0.1", "--submit-burst=2"});
  auto alice = UserChannel(c.user_port(), certs, Token(certs, "alice"));
  v1::Job job;
  EXPECT_TRUE(Submit(alice, &job, /*dry_run=*/true).ok()) << c.Output();
  EXPECT_TRUE(Submit(alice, &job, /*dry_run=*/true).ok());
  grpc::Status third = Submit(alice, &job, /*dry_run=*/true);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(third.error_message(),
              HasSubstr("submission rate limit of user alice exceeded: at most 0.1 submissions "
                        "per second per token (burst 2"));
  // The limit is per token: bob still submits, and reads are not limited.
  EXPECT_TRUE(Submit(UserChannel(c.user_port(), certs, Token(certs, "bob")), &job, true).ok());
  EXPECT_TRUE(ListJobIds(alice).empty());
}

}  // namespace
}  // namespace dropless::testing
