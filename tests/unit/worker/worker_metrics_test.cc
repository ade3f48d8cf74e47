#include "worker/daemon/worker_metrics.h"

#include <atomic>
#include <regex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/harness/process.h"

namespace dropless {
namespace {

bool Has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

StepStats Report(double loss) {
  StepStats r;
  r.step = 1;
  r.steps = 10;
  r.loss = loss;
  r.step_seconds = 0.5;
  r.flops = 2e12;
  r.tokens = 1000;
  r.dispatch_seconds = 0.003;
  r.combine_seconds = 0.004;
  r.gemm_forward_seconds = 0.0625;
  r.gemm_dgrad_seconds = 0.125;
  r.gemm_wgrad_seconds = 0.25;
  r.gemm_seconds = 0.4375;
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
  m->RecordRankExit({"job-a", 0, "", ""}, RankExitResult::kFailed);
  m->RecordRankExit({"job-a", 1, "", ""}, RankExitResult::kKilled);
  m->RecordRankExit({"job-b", 0, "", ""}, RankExitResult::kKilled);
  m->RecordSessionReconnect();
  m->RecordOutboundRefused();
  const std::string text = m->Serialize();
  EXPECT_TRUE(Has(text, "dropless_worker_up{node=\"n1\"} 1")) << text;
  EXPECT_TRUE(Has(text, "dropless_worker_slots{node=\"n1\",state=\"busy\"} 1")) << text;
  EXPECT_TRUE(Has(text, "dropless_worker_slots{node=\"n1\",state=\"free\"} 3")) << text;
  EXPECT_TRUE(Has(text, "dropless_worker_ranks_running{node=\"n1\"} 1")) << text;
  EXPECT_TRUE(Has(text, "dropless_worker_rank_exits_total{node=\"n1\",result=\"killed\"} 2")) << text;
  EXPECT_TRUE(Has(text, "dropless_worker_rank_exits_total{node=\"n1\",result=\"failed\"} 1")) << text;
  EXPECT_TRUE(Has(text, "dropless_worker_rank_exits_total{node=\"n1\",result=\"succeeded\"} 0")) << text;
  EXPECT_TRUE(Has(text, "dropless_worker_session_reconnects_total{node=\"n1\"} 1")) << text;
  EXPECT_TRUE(Has(text, "dropless_worker_outbound_refused_total{node=\"n1\"} 1")) << text;
  EXPECT_TRUE(Has(text, "# TYPE dropless_worker_outbound_refused_total counter")) << text;
}

// Labels of rank 1 of job-a on a CPU slot (prometheus-cpp sorts them by name; `le` goes last).
std::string CpuLabels(const std::string& extra = "") {
  return absl::StrCat("{Hostname=\"n1\",UUID=\"\",gpu=\"\",job_id=\"job-a\",node=\"n1\"",
                      extra, ",rank=\"1\"");
}

TEST(WorkerMetricsTest, RankSeriesHaveJobIdRankNodeLabelsCountersAndLastStepGauges) {
  auto m = Make();
  m->RecordStep({"job-a", 1, "", ""}, Report(2.0));
  StepStats second = Report(1.0);
  second.step = 2;
  second.step_seconds = 2.0;
  m->RecordStep({"job-a", 1, "", ""}, second);
  const std::string text = m->Serialize();
  // Never a label named `job`: Prometheus sets it on every target.
  EXPECT_FALSE(Has(text, "{job=")) << text;
  EXPECT_FALSE(Has(text, ",job=")) << text;
  const std::string l = CpuLabels() + "}";
  EXPECT_TRUE(Has(text, "dropless_rank_steps_total" + l + " 2")) << text;
  // What users take rate() of are counters: 1000 tokens and 2e12 FLOPs per step.
  EXPECT_TRUE(Has(text, "dropless_rank_tokens_total" + l + " 2000")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_model_flops_total" + l + " 4000000000000")) << text;
  EXPECT_FALSE(Has(text, "dropless_rank_tokens_per_second")) << text;
  // Gauges hold the last step: 2e12 FLOPs in 2 s.
  EXPECT_TRUE(Has(text, "dropless_rank_loss" + l + " 1")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_model_flops_per_second" + l + " 1000000000000")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_mfu_ratio" + l + " 0.125")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_expert_load_imbalance_ratio" + l + " 1.5")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_device_memory_bytes" + l + " 4096")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_step_duration_seconds_count" + l + " 2")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_step_duration_seconds_sum" + l + " 2.5")) << text;
  // Step buckets reach from 1 ms to 60 s.
  const std::string step = "dropless_rank_step_duration_seconds_bucket" + CpuLabels();
  EXPECT_TRUE(Has(text, step + ",le=\"0.001\"} 0")) << text;
  EXPECT_TRUE(Has(text, step + ",le=\"0.5\"} 1")) << text;
  EXPECT_TRUE(Has(text, step + ",le=\"60\"} 2")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_dispatch_duration_seconds_count" + l + " 2")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_combine_duration_seconds_count" + l + " 2")) << text;
}

TEST(WorkerMetricsTest, PhaseHistogramsResolveMicroseconds) {
  auto m = Make();
  StepStats r = Report(1.0);
  r.dispatch_seconds = 0.000015;  // 15 us: a small GPU dispatch
  r.combine_seconds = 0.000004;   // 4 us
  m->RecordStep({"job-a", 1, "", ""}, r);
  const std::string text = m->Serialize();
  const std::string dispatch = "dropless_rank_dispatch_duration_seconds_bucket" + CpuLabels();
  EXPECT_TRUE(Has(text, dispatch + ",le=\"1e-05\"} 0")) << text;
  EXPECT_TRUE(Has(text, dispatch + ",le=\"2e-05\"} 1")) << text;
  const std::string combine = "dropless_rank_combine_duration_seconds_bucket" + CpuLabels();
  EXPECT_TRUE(Has(text, combine + ",le=\"1e-05\"} 1")) << text;
  EXPECT_TRUE(Has(text, combine + ",le=\"60\"} 1")) << text;
}

// Bytes dispatched and combined are counters; per-expert load is a histogram of each expert's
// tokens over the mean per expert (one observation per expert per step, no expert label).
TEST(WorkerMetricsTest, BytesAreCountersAndExpertLoadIsAHistogramOfRatios) {
  auto m = Make();
  StepStats r = Report(1.0);
  r.dispatch_bytes = 1000;
  r.combine_bytes = 3000;
  r.expert_tokens = {0, 50, 100, 250};  // mean 100: ratios 0, 0.5, 1, 2.5
  m->RecordStep({"job-a", 1, "", ""}, r);
  m->RecordStep({"job-a", 1, "", ""}, r);
  r.expert_tokens.clear();  // an engine that reports no counts observes nothing
  m->RecordStep({"job-a", 1, "", ""}, r);
  const std::string text = m->Serialize();
  const std::string l = CpuLabels() + "}";
  EXPECT_TRUE(Has(text, "dropless_rank_dispatch_bytes_total" + l + " 3000")) << text;
  EXPECT_TRUE(Has(text, "dropless_rank_combine_bytes_total" + l + " 9000")) << text;
  const std::string load = "dropless_rank_expert_load_ratio";
  EXPECT_TRUE(Has(text, load + "_count" + l + " 8")) << text;
  EXPECT_TRUE(Has(text, load + "_sum" + l + " 8")) << text;
  EXPECT_TRUE(Has(text, load + "_bucket" + CpuLabels() + ",le=\"0\"} 2")) << text;
  EXPECT_TRUE(Has(text, load + "_bucket" + CpuLabels() + ",le=\"0.5\"} 4")) << text;
  EXPECT_TRUE(Has(text, load + "_bucket" + CpuLabels() + ",le=\"1\"} 6")) << text;
  EXPECT_TRUE(Has(text, load + "_bucket" + CpuLabels() + ",le=\"2\"} 6")) << text;
  EXPECT_TRUE(Has(text, load + "_bucket" + CpuLabels() + ",le=\"3\"} 8")) << text;
  EXPECT_FALSE(Has(text, "expert=")) << text;
}

TEST(WorkerMetricsTest, GpuRanksCarryDcgmLabels) {
  auto m = Make();
  m->RecordStep({"job-g", 0, "3", "GPU-0a1b"}, Report(1.0));
  const std::string text = m->Serialize();
  EXPECT_TRUE(Has(text, "dropless_rank_mfu_ratio{Hostname=\"n1\",UUID=\"GPU-0a1b\",gpu=\"3\","
                        "job_id=\"job-g\",node=\"n1\",rank=\"0\"} 0.5"))
      << text;
}

// One GPU over time: a rank's gauges go when its process ends, so a later job's rank on the same
// GPU is the only gauge series with that UUID (DCGM's join on UUID needs one); its counters stay.
// A retry of the rank on another GPU reports under that GPU's labels, not the first one's.
TEST(WorkerMetricsTest, GaugesOfAnEndedRankGoAndARankOnAnotherGpuGetsItsLabels) {
  auto m = Make();
  m->RecordStep({"job-a", 0, "0", "GPU-0"}, Report(1.0));
  m->RecordRankExit({"job-a", 0, "0", "GPU-0"}, RankExitResult::kSucceeded);
  m->RecordStep({"job-b", 0, "0", "GPU-0"}, Report(2.0));
  std::string text = m->Serialize();
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
      ++n;
    return n;
  };
  EXPECT_EQ(count("dropless_rank_mfu_ratio{Hostname=\"n1\",UUID=\"GPU-0\""), 1u) << text;
  EXPECT_TRUE(Has(text,
                  "dropless_rank_loss{Hostname=\"n1\",UUID=\"GPU-0\",gpu=\"0\","
                  "job_id=\"job-b\",node=\"n1\",rank=\"0\"} 2"))
      << text;
  EXPECT_TRUE(Has(text,
                  "dropless_rank_steps_total{Hostname=\"n1\",UUID=\"GPU-0\",gpu=\"0\","
                  "job_id=\"job-a\",node=\"n1\",rank=\"0\"} 1"))
      << text;
  // job-b's rank 0 fails and its next attempt runs on GPU 5: new series with GPU 5's labels.
  m->RecordRankExit({"job-b", 0, "0", "GPU-0"}, RankExitResult::kFailed);
  m->RecordStep({"job-b", 0, "5", "GPU-5"}, Report(3.0));
  text = m->Serialize();
  EXPECT_EQ(count("job_id=\"job-b\""), count("UUID=\"GPU-5\"")) << text;
  EXPECT_TRUE(Has(text,
                  "dropless_rank_loss{Hostname=\"n1\",UUID=\"GPU-5\",gpu=\"5\","
                  "job_id=\"job-b\",node=\"n1\",rank=\"0\"} 3"))
      << text;
  EXPECT_EQ(count("dropless_rank_mfu_ratio{"), 1u) << text;
  // An earlier attempt's process of the rank that ends late (on GPU 0) leaves the live one's
  // gauges (on GPU 5) alone.
  m->RecordRankExit({"job-b", 0, "0", "GPU-0"}, RankExitResult::kKilled);
  text = m->Serialize();
  EXPECT_EQ(count("dropless_rank_mfu_ratio{"), 1u) << text;
  // A rank that reports again on the same GPU (the next attempt) gets its gauges back.
  m->RecordRankExit({"job-b", 0, "5", "GPU-5"}, RankExitResult::kFailed);
  EXPECT_EQ(m->Serialize().find("dropless_rank_mfu_ratio{"), std::string::npos);
  m->RecordStep({"job-b", 0, "5", "GPU-5"}, Report(4.0));
  text = m->Serialize();
  EXPECT_TRUE(Has(text,
                  "dropless_rank_steps_total{Hostname=\"n1\",UUID=\"GPU-5\",gpu=\"5\","
                  "job_id=\"job-b\",node=\"n1\",rank=\"0\"} 2"))
      << text;
  EXPECT_EQ(count("dropless_rank_mfu_ratio{"), 1u) << text;
}

TEST(WorkerMetricsTest, ExpertGemmDurationIsObservedPerPhase) {
  auto m = Make();
  m->RecordStep({"job-a", 1, "", ""}, Report(2.0));
  m->RecordStep({"job-a", 1, "", ""}, Report(1.0));
  const std::string text = m->Serialize();
  const std::string name = "dropless_rank_expert_gemm_duration_seconds";
  auto labels = [](const std::string& phase, const std::string& le) {
    return absl::StrCat(CpuLabels(absl::StrCat(",phase=\"", phase, "\"")),
                        le.empty() ? "" : absl::StrCat(",le=\"", le, "\""), "}");
  };
  // Each phase gets its own value: forward 62.5 ms, dgrad 125 ms, wgrad 250 ms per step.
  const struct {
    const char* phase;
    const char* sum;
    const char* le_below;  // the bucket just under the value: empty
    const char* le_at;     // the first bucket holding it: both steps
  } phases[] = {{"forward", "0.125", "0.05", "0.1"},
                {"dgrad", "0.25", "0.1", "0.2"},
                {"wgrad", "0.5", "0.2", "0.5"}};
  for (const auto& p : phases) {
    SCOPED_TRACE(p.phase);
    EXPECT_TRUE(Has(text, name + "_count" + labels(p.phase, "") + " 2")) << text;
    EXPECT_TRUE(Has(text, name + "_sum" + labels(p.phase, "") + " " + p.sum)) << text;
    EXPECT_TRUE(Has(text, name + "_bucket" + labels(p.phase, p.le_below) + " 0")) << text;
    EXPECT_TRUE(Has(text, name + "_bucket" + labels(p.phase, p.le_at) + " 2")) << text;
  }
  // No series without a phase (the sum over phases is the combined GEMM time).
  EXPECT_FALSE(Has(text, name + "_count" + CpuLabels() + "}")) << text;
}

// Whether the exposition has job `j`'s rank series, its expert GEMM histogram included.
void ExpectKept(const std::string& text, int j, bool expect_kept) {
  EXPECT_EQ(Has(text, absl::StrCat("job_id=\"job-", j, "\"")), expect_kept) << "job-" << j;
  for (const char* phase : {"forward", "dgrad", "wgrad"}) {
    const bool gemm_kept =
        Has(text, absl::StrCat("dropless_rank_expert_gemm_duration_seconds_count{Hostname=\"n1\","
                               "UUID=\"\",gpu=\"\",job_id=\"job-", j, "\",node=\"n1\",phase=\"",
                               phase, "\""));
    EXPECT_EQ(gemm_kept, expect_kept) << "job-" << j << " " << phase;
  }
}

// Finished jobs' series stay among the 16 most recently reporting finished jobs; a running job's
// are never dropped, however many jobs come and go.
TEST(WorkerMetricsTest, KeepsTheSixteenMostRecentlyReportingFinishedJobs) {
  auto m = Make();
  for (int j = 0; j < 20; ++j) {
    m->RecordStep({absl::StrCat("job-", j), 0, "", ""}, Report(j));
    // job-0 runs on and reports least recently of all; the others end after their step.
    if (j > 0) m->RecordRankExit({absl::StrCat("job-", j), 0, "", ""}, RankExitResult::kSucceeded);
  }
  // When job-17, -18 and -19 came, 16 jobs had finished each time: job-1, -2 and -3 went.
  // Reporting again for a retained job evicts nothing.
  m->RecordStep({"job-10", 0, "", ""}, Report(10));
  const std::string text = m->Serialize();
  for (int j = 0; j < 20; ++j) ExpectKept(text, j, j == 0 || j >= 4);
}

TEST(WorkerMetricsTest, ARunningJobsSeriesAreNeverDropped) {
  auto m = Make();
  for (int round = 0; round < 2; ++round) {
    for (int j = 0; j < 24; ++j) m->RecordStep({absl::StrCat("job-", j), 0, "", ""}, Report(j));
  }
  std::string text = m->Serialize();
  for (int j = 0; j < 24; ++j) ExpectKept(text, j, true);
  // Once they end, the next new job leaves the 16 most recently reporting of them.
  for (int j = 0; j < 24; ++j) {
    m->RecordRankExit({absl::StrCat("job-", j), 0, "", ""}, RankExitResult::kFailed);
  }
  m->RecordStep({"job-24", 0, "", ""}, Report(24));
  text = m->Serialize();
  for (int j = 0; j < 25; ++j) ExpectKept(text, j, j >= 9);
}

// Counts of one series of the exposition ("" when absent).
std::string CountOf(const std::string& text, const std::string& phase) {
  std::smatch m;
  const std::regex re("dropless_rank_expert_gemm_duration_seconds_count\\{[^}]*phase=\"" +
                      phase + "\"[^}]*\\} ([0-9.e+]+)");
  return std::regex_search(text, m, re) ? m[1].str() : "";
}

// A scrape over HTTP while a rank reports steps never sees a step half recorded: the three GEMM
// phases always count the same steps (a dashboard dividing one phase by another relies on it).
TEST(WorkerMetricsTest, ScrapesOverHttpSeeWholeSteps) {
  const int port = testing::PickFreePort();
  absl::StatusOr<std::unique_ptr<WorkerMetrics>> m = WorkerMetrics::Create("n1", "127.0.0.1", port);
  ASSERT_TRUE(m.ok()) << m.status();
  std::atomic<bool> stop{false};
  std::thread reporter([&] {
    while (!stop.load()) (*m)->RecordStep({"job-a", 0, "", ""}, Report(1.0));
  });
  int checked = 0;
  for (int i = 0; i < 200; ++i) {
    const std::string text = testing::HttpGet(port, "/metrics");
    const std::string fwd = CountOf(text, "forward");
    if (fwd.empty()) continue;  // before the first step
    ++checked;
    EXPECT_EQ(CountOf(text, "dgrad"), fwd) << "scrape " << i;
    EXPECT_EQ(CountOf(text, "wgrad"), fwd) << "scrape " << i;
  }
  stop = true;
  reporter.join();
  EXPECT_GT(checked, 100);
}

TEST(WorkerMetricsTest, UnbindablePortIsAnError) {
  absl::StatusOr<std::unique_ptr<WorkerMetrics>> m = WorkerMetrics::Create("n1", "203.0.113.1", 9);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace dropless
