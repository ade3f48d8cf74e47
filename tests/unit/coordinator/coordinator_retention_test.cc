// Retention through the Coordinator (coordinator_retention.cc): a job deleted for its age is gone
// from every call as an unknown id is, the counter moves, unfinished jobs and the per-user limit
// are untouched, cluster-wide events as old go too, and a zero retention keeps everything. "Now"
// is the test's: ExpireFinishedJobs takes it, so no test waits for a job to age.
#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/controller/coordinator.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "coordinator/util/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kDayMs = 24 * 3600 * 1000;

std::string TempDbPath() {
  std::string dir = ::testing::TempDir();
  std::string pattern = absl::StrCat(dir, dir.empty() || dir.back() != '/' ? "/" : "",
                                     "coordinator_retention_test_XXXXXX");
  EXPECT_NE(mkdtemp(pattern.data()), nullptr);
  return pattern + "/dropless.db";
}

constexpr char kSpec[] = R"yaml(name: tiny
model: {hidden: 64, ffn: 128, experts: 4, topk: 2, shared_experts: 0, layers: 1, router: softmax, renormalize: true, activation: swiglu}
parallel: {ep: 1, dp: 1}
precision: bf16
tokens_per_rank: 64
steps: 5
resources: {backend: cpu}
)yaml";

class CoordinatorRetentionTest : public ::testing::Test {
 protected:
  void Open(absl::Duration retention, const std::string& path = TempDbPath()) {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    CoordinatorOptions options;
    options.job_retention = retention;
    options.max_unfinished_jobs_per_user = 2;
    absl::StatusOr<std::unique_ptr<Coordinator>> created =
        Coordinator::Create(*std::move(store), options, &metrics_);
    ASSERT_TRUE(created.ok()) << created.status();
    coordinator_ = *std::move(created);
  }

  std::string Submit(const std::string& owner) {
    v1::SubmitJobRequest request;
    request.set_spec_yaml(kSpec);
    absl::StatusOr<v1::Job> job = coordinator_->SubmitJob(request, owner);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }

  std::vector<std::string> Listed() {
    absl::StatusOr<v1::ListJobsResponse> listed = coordinator_->ListJobs(v1::ListJobsRequest());
    EXPECT_TRUE(listed.ok()) << listed.status();
    std::vector<std::string> ids;
    for (const v1::Job& job : listed->jobs()) ids.push_back(job.id());
    return ids;
  }

  // Every stored event's type (ListEvents without a job: the jobs' and the cluster-wide ones).
  std::vector<std::string> EventTypes() {
    absl::StatusOr<std::vector<v1::Event>> events = coordinator_->ListEvents("", 0);
    EXPECT_TRUE(events.ok()) << events.status();
    std::vector<std::string> types;
    for (const v1::Event& event : *events) types.push_back(event.type());
    return types;
  }

  // dropless_coordinator_jobs_expired_total as /metrics reads now; -1 when absent.
  int64_t Expired() {
    const std::string series = "dropless_coordinator_jobs_expired_total ";
    const std::string text = metrics_.collectable()->Serialize();
    const size_t at = text.find("\n" + series);
    return at == std::string::npos ? -1 : std::stoll(text.substr(at + 1 + series.size()));
  }

  CoordinatorMetrics metrics_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(CoordinatorRetentionTest, ExpiredJobIsUnknownEverywhereOthersStay) {
  ASSERT_NO_FATAL_FAILURE(Open(absl::Hours(720)));
  const std::string done = Submit("alice");
  const std::string pending = Submit("alice");
  ASSERT_TRUE(coordinator_->CancelJob(done, "").ok());
  EXPECT_EQ(Expired(), 0);

  // Ended just now: kept.
  absl::StatusOr<int64_t> expired = coordinator_->ExpireFinishedJobs(NowMs());
  ASSERT_TRUE(expired.ok()) << expired.status();
  EXPECT_EQ(*expired, 0);
  EXPECT_TRUE(coordinator_->GetJob(done).ok());

  EXPECT_THAT(EventTypes(), Contains("CoordinatorStarted"));

  // 31 days later: the cancelled job goes; the pending one, as old, stays. So does the
  // cluster-wide CoordinatorStarted, uncounted by the jobs' counter.
  expired = coordinator_->ExpireFinishedJobs(NowMs() + 31 * kDayMs);
  ASSERT_TRUE(expired.ok()) << expired.status();
  EXPECT_EQ(*expired, 1);
  EXPECT_EQ(Expired(), 1);
  EXPECT_THAT(EventTypes(), AllOf(Contains("Submitted"), Not(Contains("CoordinatorStarted"))));
  EXPECT_TRUE(absl::IsNotFound(coordinator_->GetJob(done).status()));
  EXPECT_THAT(coordinator_->GetJob(done).status().message(), HasSubstr(done));
  EXPECT_TRUE(absl::IsNotFound(coordinator_->ListEvents(done, 0).status()));
  EXPECT_TRUE(absl::IsNotFound(coordinator_->OpenLogs(done, std::nullopt, false).status()));
  EXPECT_TRUE(absl::IsNotFound(coordinator_->ListStepMetrics(done, std::nullopt, 0).status()));
  EXPECT_TRUE(absl::IsNotFound(coordinator_->WatchJob(done).status()));
  EXPECT_TRUE(absl::IsNotFound(coordinator_->CancelJob(done, "").status()));
  EXPECT_THAT(Listed(), ElementsAre(pending));
  absl::StatusOr<v1::Job> kept = coordinator_->GetJob(pending);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->state(), v1::JOB_STATE_PENDING);

  // The per-user limit counts the unfinished jobs, as before: alice has one of two.
  const std::string third = Submit("alice");
  EXPECT_NE(third, done);
  v1::SubmitJobRequest request;
  request.set_spec_yaml(kSpec);
  EXPECT_TRUE(absl::IsResourceExhausted(coordinator_->SubmitJob(request, "alice").status()));

  // Nothing more to do: the counter stays.
  expired = coordinator_->ExpireFinishedJobs(NowMs() + 31 * kDayMs);
  ASSERT_TRUE(expired.ok());
  EXPECT_EQ(*expired, 0);
  EXPECT_EQ(Expired(), 1);
}

TEST_F(CoordinatorRetentionTest, ZeroRetentionKeepsFinishedJobsForGood) {
  ASSERT_NO_FATAL_FAILURE(Open(absl::ZeroDuration()));
  const std::string done = Submit("");
  ASSERT_TRUE(coordinator_->CancelJob(done, "").ok());
  absl::StatusOr<int64_t> expired = coordinator_->ExpireFinishedJobs(NowMs() + 36500 * kDayMs);
  ASSERT_TRUE(expired.ok());
  EXPECT_EQ(*expired, 0);
  EXPECT_TRUE(coordinator_->GetJob(done).ok());
  EXPECT_EQ(Expired(), 0);
}

// Start sweeps at once, on a thread of its own, and Shutdown stops it.
TEST_F(CoordinatorRetentionTest, StartSweepsFinishedJobsThatAgedWhileDown) {
  const std::string path = TempDbPath();
  std::string old_job;
  {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
    ASSERT_TRUE(store.ok());
    JobRecord record;
    record.job.set_id((*store)->NextJobId(&record.seq));
    record.job.set_state(v1::JOB_STATE_SUCCEEDED);
    record.job.set_spec_yaml(kSpec);
    record.job.set_world_size(1);
    record.job.set_backend("cpu");
    record.job.set_create_time_ms(NowMs() - 41 * kDayMs);
    record.job.set_end_time_ms(NowMs() - 40 * kDayMs);
    old_job = record.job.id();
    StoreWrite write;
    write.jobs = {record};
    ASSERT_TRUE((*store)->Commit(write).ok());
  }
  ASSERT_NO_FATAL_FAILURE(Open(absl::Hours(720), path));
  EXPECT_TRUE(coordinator_->GetJob(old_job).ok());
  coordinator_->Start();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (coordinator_->GetJob(old_job).ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(absl::IsNotFound(coordinator_->GetJob(old_job).status()));
  EXPECT_EQ(Expired(), 1);
  coordinator_->Shutdown();
}

TEST(JobRetentionSweepPeriodTest, TenMinutesOrATenthOfTheRetentionAtLeastAMinute) {
  EXPECT_EQ(JobRetentionSweepPeriod(absl::Hours(720)), absl::Minutes(10));
  EXPECT_EQ(JobRetentionSweepPeriod(absl::Minutes(100)), absl::Minutes(10));
  EXPECT_EQ(JobRetentionSweepPeriod(absl::Minutes(30)), absl::Minutes(3));
  EXPECT_EQ(JobRetentionSweepPeriod(absl::Minutes(5)), absl::Minutes(1));
  EXPECT_EQ(JobRetentionSweepPeriod(absl::Seconds(1)), absl::Minutes(1));
}

}  // namespace
}  // namespace dropless::coordinator
