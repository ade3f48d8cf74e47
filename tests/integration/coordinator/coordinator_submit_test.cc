// Idempotent submits: SubmitJobRequest.request_id names a submit, so a client that lost the
// answer (coordinator restart, network) can send it again without making a second job.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"

namespace dropless::testing {
namespace {

using ::testing::HasSubstr;

grpc::Status SubmitWithId(CoordinatorUnderTest& c, const std::string& spec,
                          const std::string& request_id, v1::Job* job) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::SubmitJobRequest request;
  request.set_spec_yaml(spec);
  request.set_request_id(request_id);
  return c.jobs().SubmitJob(&context, request, job);
}

int CountJobs(CoordinatorUnderTest& c) {
  grpc::ClientContext context;
  v1::ListJobsRequest request;
  v1::ListJobsResponse response;
  EXPECT_TRUE(c.jobs().ListJobs(&context, request, &response).ok());
  return response.jobs_size();
}

TEST(CoordinatorSubmitTest, ARepeatedRequestIdReturnsTheFirstJobEvenAfterARestart) {
  auto c = CoordinatorUnderTest::Start();
  v1::Job first, again, other;
  ASSERT_TRUE(SubmitWithId(*c, TinySpec(2), "retry-1", &first).ok());
  ASSERT_TRUE(SubmitWithId(*c, TinySpec(2), "retry-1", &again).ok());
  EXPECT_EQ(again.id(), first.id());
  ASSERT_TRUE(SubmitWithId(*c, TinySpec(2), "retry-2", &other).ok());
  EXPECT_NE(other.id(), first.id());
  EXPECT_EQ(CountJobs(*c), 2);

  // The id is stored with the job in the same transaction: a successor coordinator knows it.
  c->KillAndRestart();
  v1::Job after_restart;
  grpc::Status status;
  for (int i = 0; i < 100; ++i) {
    after_restart.Clear();
    status = SubmitWithId(*c, TinySpec(2), "retry-1", &after_restart);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(after_restart.id(), first.id());
  EXPECT_EQ(CountJobs(*c), 2);
  // Without a request id every submit is a new job.
  ASSERT_TRUE(c->Submit(TinySpec(2)).ok());
  ASSERT_TRUE(c->Submit(TinySpec(2)).ok());
  EXPECT_EQ(CountJobs(*c), 4);
}

TEST(CoordinatorSubmitTest, ARequestIdReusedForAnotherSpecOrMalformedIsRefused) {
  auto c = CoordinatorUnderTest::Start();
  v1::Job job;
  ASSERT_TRUE(SubmitWithId(*c, TinySpec(2), "same", &job).ok());
  grpc::Status other = SubmitWithId(*c, TinySpec(1), "same", &job);
  EXPECT_EQ(other.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(other.error_message(), HasSubstr("request_id"));

  grpc::Status bad = SubmitWithId(*c, TinySpec(2), "has space", &job);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("request_id"));
  grpc::Status long_id = SubmitWithId(*c, TinySpec(2), std::string(129, 'a'), &job);
  EXPECT_EQ(long_id.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(CountJobs(*c), 1);
}

TEST(CoordinatorSubmitTest, TheCliSendsARequestIdAndHonoursAGivenOne) {
  auto c = CoordinatorUnderTest::Start();
  const std::string bin = BinaryPath("dropless");
  const std::string spec = SourcePath("configs/jobs/tiny-cpu.yaml");
  auto submit = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {bin, "--insecure", "--coordinator", c->address(), "submit", "-f",
                                     spec};
    argv.insert(argv.end(), extra.begin(), extra.end());
    CommandResult r = RunCommand(argv, absl::Seconds(30));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return std::string(absl::StripAsciiWhitespace(r.out));
  };
  const std::string a = submit({"--request-id", "ci-build-17"});
  EXPECT_EQ(submit({"--request-id", "ci-build-17"}), a);
  const std::string b = submit({});
  const std::string d = submit({});
  EXPECT_NE(b, a);
  EXPECT_NE(d, b);  // a fresh random id per invocation
  EXPECT_EQ(CountJobs(*c), 3);
}

}  // namespace
}  // namespace dropless::testing
