// What the worker daemon sends the coordinator, against the real coordinator: a message the
// coordinator refuses as malformed is dropped, once, and what is queued behind it still arrives.
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/worker/worker_cluster.h"
#include "worker/daemon/outbound_journal.h"

namespace dropless::testing {
namespace {

namespace v1 = dropless::v1;

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The coordinator refuses step metrics with more expert_tokens than a spec can have experts by
// ending the session with InvalidArgument. A daemon that sent such a message again on every
// session would deliver nothing behind it: here its journal holds one from "its previous run"
// (a daemon of another version), and a job run after it must still end with its statuses and
// metrics stored.
TEST(WorkerOutboundTest, AMessageTheCoordinatorRefusesIsDroppedAndTheRestDelivered) {
  WorkerCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  {
    OutboundJournal::Recovered recovered;
    absl::StatusOr<std::unique_ptr<OutboundJournal>> journal =
        OutboundJournal::Open(cluster.worker_dir("node-j") + "/outbound.journal",
                              "boot-of-a-previous-run", OutboundJournal::HostBootId(), &recovered);
    ASSERT_TRUE(journal.ok()) << journal.status();
    v1::WorkerMessage refused;
    v1::StepMetrics* m = refused.mutable_metrics();
    m->set_job_id("job-of-a-previous-run");
    m->set_attempt(1);
    m->set_step(1);
    for (int i = 0; i < 1025; ++i) m->add_expert_tokens(i);
    (*journal)->Appended(1, refused);
  }
  ASSERT_TRUE(cluster.StartWorker("node-j").ok()) << cluster.Diagnostics();
  ASSERT_TRUE(cluster
                  .WaitForWorker(
                      "node-j",
                      [](const v1::Worker& w) { return w.state() == v1::WORKER_STATE_READY; },
                      absl::Seconds(30))
                  .has_value())
      << cluster.Diagnostics();

  const std::string spec = absl::StrReplaceAll(TinyCpuSpec(5), {{"ep: 2", "ep: 1"}});
  absl::StatusOr<v1::Job> job = cluster.Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::Job> done = cluster.WaitForState(
      job->id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status() << cluster.Diagnostics();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED)
      << done->ShortDebugString() << cluster.Diagnostics();
  absl::StatusOr<std::vector<v1::StepMetrics>> metrics = cluster.StepMetrics(job->id());
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->size(), 5u);

  const std::string scraped = HttpGet(cluster.metrics_port("node-j"), "/metrics");
  EXPECT_NE(scraped.find("dropless_worker_outbound_refused_total{node=\"node-j\"} 1"),
            std::string::npos)
      << scraped;
  const std::string log = cluster.worker("node-j")->Output();
  EXPECT_EQ(Count(log, "the coordinator refused message 1 ("), 1) << log;
  EXPECT_NE(log.find("metrics.expert_tokens: at most 1024"), std::string::npos) << log;
}

}  // namespace
}  // namespace dropless::testing
