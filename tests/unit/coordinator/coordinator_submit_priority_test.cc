// The priority limit of a submit (Coordinator::SubmitJob's max_priority, --max-user-priority for
// callers below admin): the job's final priority (the request's override, else the spec's) is
// checked, a dry run too, and after the request_id lookup, so that a retry of a submit that was
// accepted gets its job even when the limit was lowered in between.
#include <stdlib.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/controller/coordinator.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

constexpr char kSpec[] = R"yaml(name: tiny
model: {hidden: 64, ffn: 128, experts: 4, topk: 2, shared_experts: 0, layers: 1, router: softmax, renormalize: true, activation: swiglu}
parallel: {ep: 1, dp: 1}
precision: bf16
tokens_per_rank: 64
steps: 5
resources: {backend: cpu}
)yaml";

v1::SubmitJobRequest Request(int spec_priority, int override_priority,
                             const std::string& request_id = "", bool dry_run = false) {
  v1::SubmitJobRequest request;
  request.set_spec_yaml(absl::StrCat(kSpec, "priority: ", spec_priority, "\n"));
  request.set_priority(override_priority);
  request.set_request_id(request_id);
  request.set_dry_run(dry_run);
  return request;
}

class CoordinatorSubmitPriorityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = ::testing::TempDir();
    std::string pattern = absl::StrCat(dir, dir.empty() || dir.back() != '/' ? "/" : "",
                                       "coordinator_submit_priority_test_XXXXXX");
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(pattern + "/dropless.db");
    ASSERT_TRUE(store.ok()) << store.status();
    absl::StatusOr<std::unique_ptr<Coordinator>> created =
        Coordinator::Create(*std::move(store), CoordinatorOptions(), &metrics_);
    ASSERT_TRUE(created.ok()) << created.status();
    coordinator_ = *std::move(created);
  }

  int StoredJobs() {
    absl::StatusOr<v1::ListJobsResponse> jobs = coordinator_->ListJobs(v1::ListJobsRequest());
    EXPECT_TRUE(jobs.ok()) << jobs.status();
    return jobs.ok() ? jobs->jobs_size() : -1;
  }

  CoordinatorMetrics metrics_;
  std::unique_ptr<Coordinator> coordinator_;
};

std::string Refusal(int limit, int priority) {
  return absl::StrCat("priority: user alice may give a job a priority of at most ", limit,
                      " (--max-user-priority), not ", priority,
                      "; higher priorities need role admin");
}

TEST_F(CoordinatorSubmitPriorityTest, TheJobsFinalPriorityIsCheckedDryRunsToo) {
  // Above the limit: the override, the spec's own, a dry run of either; nothing stored.
  struct Case {
    v1::SubmitJobRequest request;
    int priority;  // the job's final one
  };
  for (const Case& c : {Case{Request(0, 51), 51}, Case{Request(1000, 0), 1000},
                        Case{Request(60, 0, "", /*dry_run=*/true), 60},
                        Case{Request(10, 700, "", /*dry_run=*/true), 700}}) {
    absl::StatusOr<v1::Job> job = coordinator_->SubmitJob(c.request, "alice", 50);
    EXPECT_EQ(job.status().code(), absl::StatusCode::kPermissionDenied) << job.status();
    EXPECT_EQ(std::string(job.status().message()), Refusal(50, c.priority));
  }
  EXPECT_EQ(StoredJobs(), 0);
  // An override down to the limit, a dry run at it, and no limit at all (an admin's).
  absl::StatusOr<v1::Job> lowered = coordinator_->SubmitJob(Request(60, 40), "alice", 50);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(lowered->priority(), 40);
  absl::StatusOr<v1::Job> dry = coordinator_->SubmitJob(Request(50, 0, "", true), "alice", 50);
  ASSERT_TRUE(dry.ok()) << dry.status();
  EXPECT_TRUE(dry->id().empty());
  EXPECT_EQ(dry->priority(), 50);
  absl::StatusOr<v1::Job> urgent = coordinator_->SubmitJob(Request(0, 1000), "ops", std::nullopt);
  ASSERT_TRUE(urgent.ok()) << urgent.status();
  EXPECT_EQ(urgent->priority(), 1000);
  EXPECT_EQ(StoredJobs(), 2);
}

// SubmitJobRequest.request_id promises that a retry gets the job the first request made: the
// limit (lowered in between, e.g. a coordinator restarted with a lower --max-user-priority) does
// not turn an accepted submit into a refusal. A new request above the new limit is refused.
TEST_F(CoordinatorSubmitPriorityTest, ARetryOfAnAcceptedSubmitStaysIdempotent) {
  absl::StatusOr<v1::Job> first = coordinator_->SubmitJob(Request(0, 80, "submit-1"), "alice", 100);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->priority(), 80);
  absl::StatusOr<v1::Job> retry = coordinator_->SubmitJob(Request(0, 80, "submit-1"), "alice", 50);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->id(), first->id());
  absl::StatusOr<v1::Job> other = coordinator_->SubmitJob(Request(0, 80, "submit-2"), "alice", 50);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied) << other.status();
  EXPECT_EQ(std::string(other.status().message()), Refusal(50, 80));
  EXPECT_EQ(StoredJobs(), 1);
}

}  // namespace
}  // namespace dropless::coordinator
