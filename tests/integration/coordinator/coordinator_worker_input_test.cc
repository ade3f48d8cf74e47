// What a worker sends is bounded (a compromised node's messages): step metrics with more
// expert_tokens than a spec can have experts end its session naming the field, and a heartbeat
// listing thousands of made-up ranks costs a bounded number of store lookups per message.
#include <optional>
#include <string>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"

namespace dropless::testing {
namespace {

using ::testing::HasSubstr;

TEST(CoordinatorWorkerInputTest, StepMetricsWithTooManyExpertTokensEndTheSession) {
  auto c = CoordinatorUnderTest::Start();
  FakeWorker w(c->channel(), "node-experts", 1);
  ASSERT_TRUE(w.Register().ok() && w.Connect().ok());
  v1::WorkerMessage message;
  v1::StepMetrics* m = message.mutable_metrics();
  m->set_job_id("job-000001");
  m->set_attempt(1);
  m->set_step(1);
  for (int i = 0; i < 1025; ++i) m->add_expert_tokens(i);
  ASSERT_TRUE(w.Send(message).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (w.SessionOpen() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  std::optional<grpc::Status> ended = w.SessionStatus();
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(ended->error_message(), HasSubstr("metrics.expert_tokens: at most 1024"));
}

TEST(CoordinatorWorkerInputTest, AHeartbeatOfManyMadeUpRanksIsCheap) {
  auto c = CoordinatorUnderTest::Start();
  absl::StatusOr<v1::Job> job = c->Submit(TinySpec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  FakeWorker w(c->channel(), "node-many", 1);
  ASSERT_TRUE(w.Register().ok() && w.Connect().ok());
  ASSERT_TRUE(w.NextAssignment().has_value());
  v1::WorkerMessage message;
  for (int rank = 0; rank < 20000; ++rank) {
    v1::RankStatus* s = message.mutable_heartbeat()->add_ranks();
    s->set_job_id(job->id());
    s->set_attempt(2);  // not an attempt of the job
    s->set_rank(rank);
    s->set_state(v1::RANK_STATE_RUNNING);
  }
  const absl::Time start = absl::Now();
  ASSERT_TRUE(w.Send(message).ok());
  ASSERT_TRUE(w.Send(message).ok());
  EXPECT_TRUE(c->Get(job->id()).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(w.SessionOpen());
}

}  // namespace
}  // namespace dropless::testing
