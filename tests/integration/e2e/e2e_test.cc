// A newcomer's job end to end, through the same tools the README's demo uses: the coordinator and
// two workers (one CPU slot each, so the two expert-parallel ranks live on different workers), the
// job submitted with `dropless submit -f configs/jobs/tiny-cpu.yaml` and followed with
// `dropless watch ID -o json` from the moment it is accepted.
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/integration/worker/worker_cluster.h"

namespace dropless::testing {
namespace {

namespace v1 = dropless::v1;
using google::protobuf::Struct;

double Number(const Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? -1 : it->second.number_value();
}

std::string Text(const Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? "" : it->second.string_value();
}

TEST(EndToEndTest, TinyCpuThroughTheCliOnTwoWorkers) {
  WorkerCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.Diagnostics();
  for (const char* node : {"e2e-a", "e2e-b"}) {
    ASSERT_TRUE(cluster.StartWorker(node).ok()) << cluster.Diagnostics();
    ASSERT_TRUE(cluster
                    .WaitForWorker(node,
                                   [](const v1::Worker& w) {
                                     return w.state() == v1::WORKER_STATE_READY;
                                   },
                                   absl::Seconds(30))
                    .has_value())
        << cluster.Diagnostics();
  }
  const std::string cli = BinaryPath("dropless");
  const std::string coordinator = cluster.coordinator_address();

  CommandResult submit = RunCommand({cli, "--insecure", "--coordinator", coordinator, "submit", "-f",
                                     SourcePath("configs/jobs/tiny-cpu.yaml")});
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err;
  const std::string id(absl::StripAsciiWhitespace(submit.out));
  ASSERT_FALSE(id.empty());

  CommandResult watch =
      RunCommand({cli, "--insecure", "--coordinator", coordinator, "watch", id, "-o", "json"},
                 absl::Seconds(240));
  ASSERT_EQ(watch.exit_code, 0) << "watch exits 0 only when the job SUCCEEDED\n"
                                << watch.out << watch.err << cluster.Diagnostics();

  // One JSON object per update; keep each rank's step metrics in step order.
  std::map<int, std::map<int, Struct>> steps_by_rank;
  Struct last;
  for (absl::string_view line : absl::StrSplit(watch.out, '\n', absl::SkipWhitespace())) {
    Struct update;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(std::string(line), &update).ok())
        << "not JSON: " << line;
    EXPECT_EQ(Text(update, "id"), id);
    if (update.fields().count("step") && update.fields().count("rank") &&
        update.fields().count("loss")) {
      steps_by_rank[static_cast<int>(Number(update, "rank"))].emplace(
          static_cast<int>(Number(update, "step")), update);
    }
    last = update;
  }
  EXPECT_EQ(Text(last, "state"), "SUCCEEDED") << watch.out;
  ASSERT_EQ(steps_by_rank.size(), 2u) << "step metrics of both ranks in watch -o json\n" << watch.out;
  for (const auto& [rank, steps] : steps_by_rank) {
    ASSERT_FALSE(steps.empty());
    const Struct& first = steps.begin()->second;
    const Struct& final_step = steps.rbegin()->second;
    EXPECT_EQ(Number(final_step, "step"), 40) << "rank " << rank;
    EXPECT_LT(Number(final_step, "loss"), 0.5 * Number(first, "loss"))
        << "rank " << rank << ": the loss must fall";
    EXPECT_GT(Number(final_step, "tflops"), 0);
    EXPECT_GT(Number(final_step, "mfu"), 0);
    EXPECT_GT(Number(final_step, "step_seconds"), 0);
  }

  // Both workers expose their rank's step metrics, labelled with the job.
  absl::StatusOr<v1::Job> job = cluster.Get(id);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->placement_size(), 2);
  EXPECT_NE(job->placement(0).node(), job->placement(1).node());
  for (const v1::RankPlacement& p : job->placement()) {
    std::string text = HttpGet(cluster.metrics_port(p.node()), "/metrics");
    std::string labels = absl::StrCat("{Hostname=\"", p.node(), "\",UUID=\"\",gpu=\"\",job_id=\"", id,
                                      "\",node=\"", p.node(), "\",rank=\"", p.rank(), "\"}");
    EXPECT_NE(text.find("dropless_rank_step_duration_seconds_count" + labels + " 40"),
              std::string::npos)
        << p.node() << "\n" << text;
    EXPECT_NE(text.find("dropless_rank_steps_total" + labels + " 40"), std::string::npos) << text;
    // Its gauges (the last step's values) went with the rank's process.
    EXPECT_EQ(text.find("dropless_rank_loss" + labels), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace dropless::testing
