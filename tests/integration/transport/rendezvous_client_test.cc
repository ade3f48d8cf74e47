// The RendezvousService client against the real coordinator binary on loopback: key-value
// semantics, timeouts, a coordinator that is down or starts late, and Gloo groups rendezvoused
// through it.
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "dropless/v1/job_service.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/harness/process.h"
#include "tests/integration/transport/fake_cpu_worker.h"
#include "tests/unit/transport/collective_checks.h"
#include "tests/unit/transport/rank_threads.h"
#include "worker/transport/transport_factory.h"

namespace dropless {
namespace {

using testing::AttemptScope;
using testing::FakeCpuWorker;
using testing::Process;

std::unique_ptr<Process> StartCoordinator(int port, const std::string& dir) {
  absl::StatusOr<std::unique_ptr<Process>> coordinator = Process::Start(
      {testing::BinaryPath("dropless-coordinator"), "--insecure", "--listen",
       absl::StrCat("127.0.0.1:", port),
       "--db", dir + "/coordinator.db", "--metrics-port", "0"});
  EXPECT_TRUE(coordinator.ok()) << coordinator.status();
  if (!coordinator.ok()) return nullptr;
  EXPECT_TRUE(testing::WaitForTcpPort(port, absl::Seconds(30))) << (*coordinator)->Output();
  return std::move(*coordinator);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A coordinator with one fake 2-slot CPU worker and the tiny 2-rank job placed on it: its attempt's
// rendezvous keyspace is open for the test.
class RendezvousClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = testing::PickFreePort();
    address_ = absl::StrCat("127.0.0.1:", port_);
    coordinator_ = StartCoordinator(port_, testing::MakeTempDir());
    ASSERT_NE(coordinator_, nullptr);

    absl::StatusOr<std::unique_ptr<FakeCpuWorker>> worker =
        FakeCpuWorker::Start(address_, "transport-test-node", 2);
    ASSERT_TRUE(worker.ok()) << worker.status() << "\n" << coordinator_->Output();
    worker_ = std::move(*worker);

    auto jobs = v1::JobService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    v1::SubmitJobRequest request;
    request.set_spec_yaml(ReadFile(testing::SourcePath("configs/jobs/tiny-cpu.yaml")));
    request.set_name("transport-rendezvous-test");
    v1::Job job;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status submitted = jobs->SubmitJob(&context, request, &job);
    ASSERT_TRUE(submitted.ok()) << submitted.error_message();

    absl::StatusOr<AttemptScope> scope = worker_->WaitForAssignment(absl::Seconds(30));
    ASSERT_TRUE(scope.ok()) << scope.status() << "\n" << coordinator_->Output();
    ASSERT_EQ(scope->job_id, job.id());
    scope_ = *scope;
  }

  std::unique_ptr<KeyValueStore> Client() {
    RendezvousClientOptions options;
    options.secret = scope_.secret;  // as the daemon hands it to its ranks
    return NewRendezvousKvStore(address_, scope_.job_id, scope_.attempt, options);
  }

  int port_ = 0;
  std::string address_;
  std::unique_ptr<Process> coordinator_;
  std::unique_ptr<FakeCpuWorker> worker_;
  AttemptScope scope_;
};

TEST_F(RendezvousClientTest, PutGetAndNotFound) {
  std::unique_ptr<KeyValueStore> store = Client();
  EXPECT_EQ(store->Get("absent").status().code(), absl::StatusCode::kNotFound);
  const std::string binary("a\0b\xff", 4);
  ASSERT_TRUE(store->Put("world/0", binary).ok());
  absl::StatusOr<std::string> value = Client()->Get("world/0");  // a second client, same scope
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, binary);
  ASSERT_TRUE(store->Put("world/0", "overwritten").ok());
  EXPECT_EQ(*store->Get("world/0"), "overwritten");
}

TEST_F(RendezvousClientTest, WaitReturnsWhenAnotherClientPutsTheKeys) {
  std::unique_ptr<KeyValueStore> waiter = Client();
  ASSERT_TRUE(waiter->Put("k1", "1").ok());
  std::thread writer([&] {
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_TRUE(Client()->Put("k2", "2").ok());
  });
  const absl::Time start = absl::Now();
  absl::Status s = waiter->Wait({"k1", "k2"}, absl::Seconds(20));
  writer.join();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
}

TEST_F(RendezvousClientTest, WaitTimesOutWithDeadlineExceededNamingTheMissingKey) {
  std::unique_ptr<KeyValueStore> store = Client();
  ASSERT_TRUE(store->Put("present", "1").ok());
  const absl::Time start = absl::Now();
  absl::Status s = store->Wait({"present", "never-put"}, absl::Milliseconds(700));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("never-put"), std::string_view::npos) << s;
  EXPECT_GE(took, absl::Milliseconds(600));
  EXPECT_LT(took, absl::Seconds(4));
}

TEST_F(RendezvousClientTest, OtherAttemptsAreRejectedWithoutRetrying) {
  std::unique_ptr<KeyValueStore> stale =
      NewRendezvousKvStore(address_, scope_.job_id, scope_.attempt + 1);
  const absl::Time start = absl::Now();
  absl::Status s = stale->Put("k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_TRUE(Client()->Put("mine", "1").ok());
  EXPECT_NE(NewRendezvousKvStore(address_, "another-job", scope_.attempt)->Get("mine").status().code(),
            absl::StatusCode::kOk);
}

TEST_F(RendezvousClientTest, TwoRankGlooAllToAllVRendezvousedThroughTheCoordinator) {
  testing::RunRankThreads(2, [&](int r) {
    std::unique_ptr<KeyValueStore> store = Client();  // one client per rank, as in rank processes
    GlooOptions options;
    options.layout = {r, 2, 2, 1};
    options.host = "127.0.0.1";
    options.connect_timeout = absl::Seconds(60);
    absl::StatusOr<RankGroups> groups = CreateGlooGroups(options, store.get());
    ASSERT_TRUE(groups.ok()) << "rank " << r << ": " << groups.status();
    testing::CheckAllToAllV(*groups->ep, 42, 10, 4096, testing::SliceLayout::kPacked);
    testing::CheckAllToAllV(*groups->ep, 43, 10, 4096, testing::SliceLayout::kScattered);
    testing::CheckAllReduceSum(*groups->world, 44, 1000, /*bit_exact=*/false);
    ASSERT_TRUE(groups->world->Barrier().ok());
  });
}

TEST(RendezvousClientDowntimeTest, CallsWaitForACoordinatorThatStartsLate) {
  const int port = testing::PickFreePort();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  std::unique_ptr<KeyValueStore> store = NewRendezvousKvStore(address, "job-x", 1);
  absl::StatusOr<std::string> result;
  absl::Time answered;
  std::thread caller([&] {
    result = store->Get("k");
    answered = absl::Now();
  });
  absl::SleepFor(absl::Seconds(2));
  std::unique_ptr<Process> coordinator = StartCoordinator(port, testing::MakeTempDir());
  const absl::Time started = absl::Now();
  caller.join();
  // The coordinator answered (no attempt job-x/1 is active there), instead of the client giving
  // up with Unavailable while it was down.
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
  EXPECT_LT(answered - started, absl::Seconds(10));
}

TEST(RendezvousClientDowntimeTest, NoCoordinatorGivesUnavailableAndDeadlineExceededInTime) {
  const std::string address = absl::StrCat("127.0.0.1:", testing::PickFreePort());
  RendezvousClientOptions options;
  options.retry_budget = absl::Seconds(1);
  options.rpc_timeout = absl::Milliseconds(500);
  std::unique_ptr<KeyValueStore> store = NewRendezvousKvStore(address, "job-x", 1, options);
  absl::Time start = absl::Now();
  absl::Status put = store->Put("k", "v");
  EXPECT_EQ(put.code(), absl::StatusCode::kUnavailable) << put;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  start = absl::Now();
  absl::Status wait = store->Wait({"k"}, absl::Seconds(1));
  EXPECT_EQ(wait.code(), absl::StatusCode::kDeadlineExceeded) << wait;
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

}  // namespace
}  // namespace dropless
