#include "coordinator/metrics/coordinator_metrics.h"

#include <atomic>
#include <map>
#include <regex>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

// Sum of one gauge family's series in a text exposition; -1 when it has none.
double SumOf(const std::string& text, const std::string& family) {
  const std::regex re("(^|\\n)" + family + "\\{[^}]*\\} ([0-9.e+-]+)");
  double sum = 0;
  int series = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it, ++series) {
    sum += std::stod((*it)[2].str());
  }
  return series == 0 ? -1 : sum;
}

TEST(CoordinatorMetricsTest, EveryStateIsExposedFromTheStart) {
  CoordinatorMetrics metrics;
  metrics.SetJobCounts({});
  const std::string text = metrics.collectable()->Serialize();
  for (const char* state : {"PENDING", "SCHEDULED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"}) {
    EXPECT_NE(text.find(std::string("dropless_coordinator_jobs{state=\"") + state + "\"} 0"),
              std::string::npos)
        << state;
  }
}

// Ten jobs moving between PENDING and RUNNING, five workers between READY and LOST, eight slots
// between busy and free, while scrapes collect: every scrape counts ten jobs, five workers, eight
// slots (a job is never in two states or in none).
TEST(CoordinatorMetricsTest, ScrapesSeeEachUpdateWhole) {
  CoordinatorMetrics metrics;
  metrics.SetJobCounts({{v1::JOB_STATE_PENDING, 10}});
  metrics.SetWorkerCounts(5, 0);
  metrics.SetSlots(0, 8);
  std::atomic<bool> stop{false};
  std::thread updater([&] {
    for (int i = 0; !stop.load(); ++i) {
      const int moved = i % 11;
      metrics.SetJobCounts({{v1::JOB_STATE_PENDING, 10 - moved}, {v1::JOB_STATE_RUNNING, moved}});
      metrics.SetWorkerCounts(5 - i % 6, i % 6);
      metrics.SetSlots(i % 9, 8 - i % 9);
    }
  });
  for (int i = 0; i < 2000; ++i) {
    const std::string text = metrics.collectable()->Serialize();
    ASSERT_EQ(SumOf(text, "dropless_coordinator_jobs"), 10) << "scrape " << i;
    ASSERT_EQ(SumOf(text, "dropless_coordinator_workers"), 5) << "scrape " << i;
    ASSERT_EQ(SumOf(text, "dropless_coordinator_slots"), 8) << "scrape " << i;
  }
  stop = true;
  updater.join();
}

}  // namespace
}  // namespace dropless::coordinator
