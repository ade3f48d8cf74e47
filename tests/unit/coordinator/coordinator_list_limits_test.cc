// What one ListJobs call may cost (Coordinator::ListJobs): page_size 0 is a page of 100, limit at
// most 1000, at most 16 label filters, and a label filter that matches little reads a bounded
// number of stored jobs before it answers with a token to go on from.
#include <stdlib.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/controller/coordinator.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int kJobs = 300;

constexpr char kSpec[] = R"yaml(name: tiny
model: {hidden: 64, ffn: 128, experts: 4, topk: 2, shared_experts: 0, layers: 1, router: softmax, renormalize: true, activation: swiglu}
parallel: {ep: 1, dp: 1}
precision: bf16
tokens_per_rank: 64
steps: 5
resources: {backend: cpu}
)yaml";

std::vector<std::string> Ids(const v1::ListJobsResponse& response) {
  std::vector<std::string> ids;
  for (const v1::Job& job : response.jobs()) ids.push_back(job.id());
  return ids;
}

class CoordinatorListLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = ::testing::TempDir();
    std::string pattern = absl::StrCat(dir, dir.empty() || dir.back() != '/' ? "/" : "",
                                       "coordinator_list_limits_test_XXXXXX");
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(pattern + "/dropless.db");
    ASSERT_TRUE(store.ok()) << store.status();
    CoordinatorOptions options;
    options.max_unfinished_jobs_per_user = 0;
    options.max_jobs_scanned_per_list = 256;
    absl::StatusOr<std::unique_ptr<Coordinator>> created =
        Coordinator::Create(*std::move(store), options, &metrics_);
    ASSERT_TRUE(created.ok()) << created.status();
    coordinator_ = *std::move(created);
    // No worker: every job stays pending. Only the last has a label.
    for (int i = 1; i <= kJobs; ++i) {
      v1::SubmitJobRequest request;
      request.set_spec_yaml(i == kJobs ? absl::StrCat(kSpec, "labels: {team: last}\n") : kSpec);
      ASSERT_TRUE(coordinator_->SubmitJob(request, "alice").ok());
    }
  }

  CoordinatorMetrics metrics_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(CoordinatorListLimitsTest, PageSizeZeroIsADefaultPageAndLimitIsClamped) {
  v1::ListJobsRequest request;
  absl::StatusOr<v1::ListJobsResponse> page = coordinator_->ListJobs(request);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->jobs_size(), 100);
  EXPECT_EQ(page->jobs(0).id(), "job-000001");
  ASSERT_FALSE(page->next_page_token().empty());
  request.set_page_token(page->next_page_token());
  page = coordinator_->ListJobs(request);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->jobs(0).id(), "job-000101");

  v1::ListJobsRequest most;
  most.set_limit(std::numeric_limits<int32_t>::max());
  page = coordinator_->ListJobs(most);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->jobs_size(), kJobs);  // at most 1000
  EXPECT_TRUE(page->next_page_token().empty());
}

TEST_F(CoordinatorListLimitsTest, LabelFiltersAreBoundedAndScanAtMostABatchLimit) {
  v1::ListJobsRequest many;
  for (int i = 0; i < 17; ++i) (*many.mutable_labels())[absl::StrCat("k", i)] = "v";
  absl::StatusOr<v1::ListJobsResponse> refused = coordinator_->ListJobs(many);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("labels: at most 16"));

  // 256 stored jobs read, none matching: an empty page and a token; the next call finds the job.
  v1::ListJobsRequest last;
  (*last.mutable_labels())["team"] = "last";
  absl::StatusOr<v1::ListJobsResponse> page = coordinator_->ListJobs(last);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(Ids(*page), IsEmpty());
  ASSERT_FALSE(page->next_page_token().empty());
  last.set_page_token(page->next_page_token());
  page = coordinator_->ListJobs(last);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(Ids(*page), ElementsAre(absl::StrCat("job-000", kJobs)));
  EXPECT_TRUE(page->next_page_token().empty());
}

}  // namespace
}  // namespace dropless::coordinator
