#include "worker/daemon/worker_metrics.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dropless {
namespace {

bool Has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

StepReport Report(double loss) {
  StepReport r;
  r.step = 1;
  r.steps = 10;
  r.loss = loss;
  r.step_seconds = 0.5;
  r.flops = 2e12;
  r.tokens = 1000;
  r.dispatch_seconds = 0.003;
  r.combine_seconds = 0.004;
  r.gemm_seconds = 0.2;
  r.load_imbalance = 1.5;
  r.device_memory_bytes = 4096;
  r.peak_flops = 8e12;
  return r;
}

std::unique_ptr<WorkerMetrics> Make() {
  absl::StatusOr<std::unique_ptr<WorkerMetrics>> m = WorkerMetrics::Create("n1", "127.0.0.1", 0);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

TEST(WorkerMetricsTest, DaemonSeries) {
  auto m = Make();
  m->SetSlots(1, 3);
  m->SetRanksRunning(1);
  m->RecordRankExit(RankExitResult::kFailed);
  m->RecordRankExit(RankExitResult::kKilled);
  m->RecordRankExit(RankExitResult::kKilled);
  m->RecordSessionReconnect();
  const std::string text = m->Serialize();
  EXPECT_TRUE(Has(text, "dropless_worker_up{node=\"n1\"} 1")) << text;
  EXPECT_TRUE(Has(text, "dropless_worker_slots{node=\"n1\",state=\"busy\"} 1")) << text;
  EXPECT_TRUE(Has(text, "dropless_worker_slots{node=\"n1\",state=\"free\"} 3")) << text;
  EXPECT_TRUE(Has(text, "dropless_worker_ranks_running{node=\"n1\"} 1")) << text;
  EXPECT_TRUE(Has(text, "dropless_worker_rank_exits_total{node=\"n1\",result=\"killed\"} 2")) << text;
  EXPECT_TRUE(Has(text, "dropless_worker_rank_exits_total{node=\"n1\",result=\"failed\"} 1")) << text;
  EXPECT_TRUE(Has(text, "dropless_worker_rank_exits_total{node=\"n1\",result=\"succeeded\"} 0")) << text;
  EXPECT_TRUE(Has(text, "dropless_worker_session_reconnects_total{node=\"n1\"} 1")) << text;
}

TEST(WorkerMetricsTest, RankSeriesHaveJobRankNodeLabelsAndDerivedRates) {
  auto m = Make();
  m->RecordStep("job-a", 1, Report(2.0));
  StepReport second = Report(1.0);
  second.step = 2;
  second.step_seconds = 2.0;
  m->RecordStep("job-a", 1, second);
  const std::string text = m->Serialize();
  const std::string l = "{job=\"job-a\",node=\"n1\",rank=\"1\"}";
  EXPECT_TRUE(Has(text, "dropless_rank_steps_total" + l + " 2")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_loss" + l + " 1")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_model_flops_per_second" + l + " 1000000000000")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_mfu_ratio" + l + " 0.125")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_tokens_per_second" + l + " 500")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_expert_load_imbalance_ratio" + l + " 1.5")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_device_memory_bytes" + l + " 4096")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_step_duration_seconds_count" + l + " 2")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_step_duration_seconds_sum" + l + " 2.5")) << text;
  // Buckets reach from 1 ms to 60 s.
  EXPECT_TRUE(Has(text, "dropless_rank_step_duration_seconds_bucket{job=\"job-a\",node=\"n1\",rank=\"1\",le=\"0.001\"} 0"))
      << text;
  EXPECT_TRUE(Has(text, "dropless_rank_step_duration_seconds_bucket{job=\"job-a\",node=\"n1\",rank=\"1\",le=\"0.5\"} 1"))
      << text;
  EXPECT_TRUE(Has(text, "dropless_rank_step_duration_seconds_bucket{job=\"job-a\",node=\"n1\",rank=\"1\",le=\"60\"} 2"))
      << text;
  EXPECT_TRUE(Has(text, "dropless_rank_dispatch_duration_seconds_count" + l + " 2")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_combine_duration_seconds_count" + l + " 2")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_expert_gemm_duration_seconds_count" + l + " 2")) << text;
}

TEST(WorkerMetricsTest, KeepsTheLastSixteenJobs) {
  auto m = Make();
  for (int j = 0; j < 20; ++j) m->RecordStep(absl::StrCat("job-", j), 0, Report(j));
  // Reporting again for a retained job does not evict anything.
  m->RecordStep("job-10", 0, Report(10));
  const std::string text = m->Serialize();
  for (int j = 0; j < 20; ++j) {
    const bool kept = Has(text, absl::StrCat("dropless_rank_loss{job=\"job-", j, "\""));
    EXPECT_EQ(kept, j >= 4) << "job-" << j;
  }
}

TEST(WorkerMetricsTest, UnbindablePortIsAnError) {
  absl::StatusOr<std::unique_ptr<WorkerMetrics>> m = WorkerMetrics::Create("n1", "203.0.113.1", 9);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace dropless
