// End to end through the CLI: coordinator + one worker offering 2 CPU slots, tiny-cpu submitted
// with `dropless submit` and followed with `dropless watch -o json` to SUCCEEDED.
#include <signal.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cli/cli_fixture.h"

namespace dropless::testing {
namespace {

using ::testing::HasSubstr;

TEST_F(CliEndToEndTest, TinyCpuJobRunsToSucceededUnderWatch) {
  CommandResult workers = Cli({"get", "workers", "-o", "json"});
  google::protobuf::Struct list = ParseJson(workers.out);
  ASSERT_EQ(list.fields().at("workers").list_value().values_size(), 1);
  const google::protobuf::Struct& worker =
      list.fields().at("workers").list_value().values(0).struct_value();
  EXPECT_EQ(Str(worker, "node"), "cli-e2e-node");
  EXPECT_EQ(Str(worker, "slot_kind"), "cpu");
  EXPECT_EQ(Num(worker, "slots"), 2);

  const std::string id = Submit("configs/jobs/tiny-cpu.yaml");
  ASSERT_FALSE(id.empty());
  CommandResult watch = Cli({"watch", id, "-o", "json"}, absl::Seconds(240));
  ASSERT_EQ(watch.exit_code, 0) << watch.err << "\n" << watch.out;

  std::vector<double> rank0_losses;
  std::vector<std::string> states;
  int64_t last_step = 0;
  for (absl::string_view line : absl::StrSplit(Trimmed(watch.out), '\n')) {
    google::protobuf::Struct update = ParseJson(std::string(line));
    EXPECT_EQ(Str(update, "id"), id);
    EXPECT_EQ(Num(update, "steps"), 40);
    const std::string state = Str(update, "state");
    if (states.empty() || states.back() != state) states.push_back(state);
    auto step = update.fields().find("step");
    if (step == update.fields().end()) continue;
    for (const char* metric : {"loss", "step_seconds", "tflops", "mfu"}) {
      EXPECT_TRUE(update.fields().count(metric)) << metric << " missing in " << line;
    }
    EXPECT_GE(Num(update, "step_seconds"), 0);
    if (Num(update, "rank") == 0 && update.fields().count("event") == 0) {
      rank0_losses.push_back(Num(update, "loss"));
      last_step = std::max<int64_t>(last_step, static_cast<int64_t>(step->second.number_value()));
    }
  }
  EXPECT_EQ(states.back(), "SUCCEEDED");
  EXPECT_THAT(states, ::testing::Contains("RUNNING"));
  EXPECT_EQ(last_step, 40);
  ASSERT_GE(rank0_losses.size(), 2u);
  EXPECT_LT(rank0_losses.back(), rank0_losses.front()) << "tiny-cpu's loss should fall";

  google::protobuf::Struct job = ParseJson(Cli({"get", "job", id, "-o", "json"}).out);
  EXPECT_EQ(Str(job, "state"), "SUCCEEDED");
  EXPECT_EQ(Num(job, "step"), 40);
  EXPECT_EQ(job.fields().at("placement").list_value().values_size(), 2);
  // The latest step's metrics carry the expert GEMM time by phase, summing to gemm_seconds.
  const google::protobuf::Struct& latest = job.fields().at("latest").struct_value();
  double phases = 0;
  for (const char* phase : {"gemm_forward_seconds", "gemm_dgrad_seconds", "gemm_wgrad_seconds"}) {
    ASSERT_TRUE(latest.fields().count(phase)) << phase << " missing in latest";
    EXPECT_GT(Num(latest, phase), 0) << phase;
    phases += Num(latest, phase);
  }
  EXPECT_NEAR(Num(latest, "gemm_seconds"), phases, 1e-9 + 1e-9 * phases);

  CommandResult described = Cli({"describe", "job", id});
  EXPECT_THAT(described.out, HasSubstr("SUCCEEDED"));
  EXPECT_THAT(described.out, HasSubstr("cli-e2e-node"));
  EXPECT_THAT(described.out, HasSubstr("40/40 steps"));

  // Plain lines when stdout is not a terminal; exit 0 for a job that already SUCCEEDED.
  CommandResult plain = Cli({"watch", id});
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_THAT(plain.out, HasSubstr("SUCCEEDED"));
  EXPECT_EQ(plain.out.find('\r'), std::string::npos) << "no progress bar without a terminal";

  // On a terminal (a pseudo-terminal from script(1)): the progress bar, redrawn in place.
  CommandResult tty = RunCommand(
      {"script", "-qec", "stty cols 160; " + absl::StrJoin(CliArgv({"watch", id}), " "),
       "/dev/null"});
  EXPECT_EQ(tty.exit_code, 0) << tty.err << tty.out;
  EXPECT_THAT(tty.out, HasSubstr("\r\033[K"));
  EXPECT_THAT(tty.out, HasSubstr("SUCCEEDED ["));
  EXPECT_THAT(tty.out, HasSubstr("ms/step"));
  EXPECT_THAT(tty.out, HasSubstr("40/40 100%"));
  EXPECT_THAT(tty.out, HasSubstr("TFLOP/s"));

  CommandResult logs = Cli({"logs", id});
  EXPECT_EQ(logs.exit_code, 0) << logs.err;

  // The stored step metrics: every step of both ranks, oldest first; a rank's last few.
  CommandResult metrics = Cli({"metrics", id, "-o", "json"});
  ASSERT_EQ(metrics.exit_code, 0) << metrics.err;
  std::map<int, std::vector<double>> losses;
  for (absl::string_view line : absl::StrSplit(Trimmed(metrics.out), '\n')) {
    google::protobuf::Struct m = ParseJson(std::string(line));
    EXPECT_EQ(Str(m, "job_id"), id);
    losses[static_cast<int>(Num(m, "rank"))].push_back(Num(m, "loss"));
    EXPECT_GE(Num(m, "load_imbalance"), 1.0);  // max/mean tokens per expert, stored per step
  }
  ASSERT_EQ(losses.size(), 2u);
  for (const auto& [rank, curve] : losses) {
    ASSERT_EQ(curve.size(), 40u) << "rank " << rank;
    EXPECT_LT(curve.back(), curve.front()) << "rank " << rank;
  }
  CommandResult last = Cli({"metrics", id, "--rank", "1", "--limit", "3"});
  ASSERT_EQ(last.exit_code, 0) << last.err;
  EXPECT_THAT(last.out, HasSubstr("STEP"));
  EXPECT_THAT(last.out, HasSubstr("LOAD_IMBALANCE"));
  EXPECT_THAT(last.out, HasSubstr("38/40"));
  EXPECT_THAT(last.out, HasSubstr("40/40"));
  EXPECT_THAT(last.out, ::testing::Not(HasSubstr("37/40")));
  CommandResult bad = Cli({"metrics", id, "--limit", "zero"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--limit"));
}

TEST_F(CliEndToEndTest, WatchExitsSixWhenARunningJobIsCancelled) {
  const std::string id = SubmitLongJob("cancel-me");
  std::unique_ptr<Process> watch = StartWatch(id);
  ASSERT_NE(watch, nullptr);
  ASSERT_TRUE(WaitForState(id, "RUNNING"));
  CommandResult cancel = Cli({"cancel", id});
  ASSERT_EQ(cancel.exit_code, 0) << cancel.err;
  absl::StatusOr<int> code = watch->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 6) << watch->Output();
  EXPECT_THAT(watch->Output(), HasSubstr("\"state\":\"CANCELLED\""));

  // A second cancel (its caller may not have heard the first answer) answers the cancelled job.
  CommandResult again = Cli({"cancel", id});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, absl::StrCat("job ", id, " CANCELLED\n"));
}

TEST_F(CliEndToEndTest, WatchExitsFiveWhenTheJobFails) {
  const std::string id = SubmitLongJob("fail-me");
  std::unique_ptr<Process> watch = StartWatch(id);
  ASSERT_NE(watch, nullptr);
  ASSERT_TRUE(WaitForState(id, "RUNNING"));
  // The worker stops (its ranks with it) under a job with max_attempts 1: the job FAILS.
  ASSERT_TRUE(worker_->Signal(SIGTERM).ok());
  absl::StatusOr<int> code = watch->Wait(absl::Seconds(90));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 5) << watch->Output();
  google::protobuf::Struct job = ParseJson(Cli({"get", "job", id, "-o", "json"}).out);
  EXPECT_EQ(Str(job, "state"), "FAILED");
  EXPECT_FALSE(Str(job, "message").empty());

  // A job that ended otherwise has nothing to cancel: the coordinator's message is shown as is.
  CommandResult cancel = Cli({"cancel", id});
  EXPECT_EQ(cancel.exit_code, 1);
  EXPECT_THAT(cancel.err, ::testing::StartsWith("error: "));
  EXPECT_THAT(cancel.err, HasSubstr(id));
  EXPECT_THAT(cancel.err, HasSubstr("already finished (FAILED)"));
}


// `logs -f` across a coordinator kill -9 and restart: it reconnects, resumes after the last line it
// printed (LogLine.seq), and ends when the job does, with every rank's progress lines once each and
// in order, through the last one.
TEST_F(CliEndToEndTest, LogsFollowResumesAcrossACoordinatorRestart) {
  std::string spec = ReadFile(SourcePath("configs/jobs/tiny-cpu.yaml"));
  spec.replace(spec.find("steps: 40"), 9, "steps: 1000");  // a progress line every 100 steps
  CommandResult submitted = Cli({"submit", "-f", WriteFile("follow.yaml", spec), "--name", "follow"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  const std::string id = Trimmed(submitted.out);
  auto logs = Process::Start(CliArgv({"logs", id, "-f", "-o", "json"}));
  ASSERT_TRUE(logs.ok()) << logs.status();
  // The ranks are past their rendezvous once they print a step.
  bool stepping = false;
  for (int i = 0; i < 600 && !stepping; ++i) {
    stepping = (*logs)->Output().find("\"text\":\"step ") != std::string::npos;
    if (!stepping) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(stepping) << (*logs)->Output();
  RestartCoordinator();
  absl::StatusOr<int> code = (*logs)->Wait(absl::Seconds(300));
  ASSERT_TRUE(code.ok()) << code.status() << "\n" << (*logs)->Output();
  EXPECT_EQ(*code, 0) << (*logs)->Output();
  const std::string out = (*logs)->Output();
  EXPECT_THAT(out, HasSubstr("logs: lost the coordinator"));
  std::map<int, std::vector<int>> steps;  // rank -> steps of its progress lines, as printed
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (!absl::StartsWith(line, "{")) continue;  // the reconnect notice (stderr)
    google::protobuf::Struct entry = ParseJson(std::string(line));
    EXPECT_EQ(Str(entry, "job_id"), id);
    const std::string text = Str(entry, "text");
    int step = 0;
    if (absl::StartsWith(text, "step ") &&
        absl::SimpleAtoi(text.substr(5, text.find('/') - 5), &step)) {
      steps[static_cast<int>(Num(entry, "rank"))].push_back(step);
    }
  }
  ASSERT_EQ(steps.size(), 2u) << out;
  for (const auto& [rank, seen] : steps) {
    SCOPED_TRACE(::testing::Message() << "rank " << rank);
    EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()) &&
                std::adjacent_find(seen.begin(), seen.end()) == seen.end())
        << "progress lines repeated or out of order: " << ::testing::PrintToString(seen);
    EXPECT_EQ(seen.front(), 1);
    EXPECT_EQ(seen.back(), 1000);
    // 1, 100, 200, ..., 1000: none lost across the restart.
    EXPECT_EQ(seen.size(), 11u) << ::testing::PrintToString(seen);
  }
}

// `logs -f` of a job that has printed nothing yet (pending: more ranks than the worker's slots)
// rides out a coordinator restart too: its stream was open, so the loss is a reconnect, not
// "cannot reach the coordinator" (before, it gave up unless a line had arrived).
TEST_F(CliEndToEndTest, LogsFollowOfAQuietJobRidesOutACoordinatorRestart) {
  std::string spec = ReadFile(SourcePath("configs/jobs/tiny-cpu.yaml"));
  spec.replace(spec.find("ep: 2"), 5, "ep: 4");
  CommandResult submitted = Cli({"submit", "-f", WriteFile("quiet.yaml", spec), "--name", "quiet"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  const std::string id = Trimmed(submitted.out);
  auto logs = Process::Start(CliArgv({"logs", id, "-f"}));
  ASSERT_TRUE(logs.ok()) << logs.status();
  // Its stream open: nothing is printed to tell, so a margin a loaded machine's CLI start and
  // connect fit in many times over.
  absl::SleepFor(absl::Seconds(4));
  ASSERT_TRUE((*logs)->Running()) << (*logs)->Output();
  RestartCoordinator(absl::Seconds(2));
  for (int i = 0; i < 100 && !absl::StrContains((*logs)->Output(), "logs: lost the coordinator");
       ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_THAT((*logs)->Output(), HasSubstr("logs: lost the coordinator"));
  absl::SleepFor(absl::Seconds(3));  // back, and following again
  EXPECT_TRUE((*logs)->Running()) << (*logs)->Output();
  CommandResult cancelled = Cli({"cancel", id});
  EXPECT_EQ(cancelled.exit_code, 0) << cancelled.err;
  absl::StatusOr<int> code = (*logs)->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok()) << code.status() << "\n" << (*logs)->Output();
  EXPECT_EQ(*code, 0) << (*logs)->Output();
}

// A coordinator that stops answering without closing its connections (a hung host: SIGSTOP here)
// is noticed by the CLI's keepalive pings: `watch` reports the loss within ~15 s and follows the
// job again once the coordinator answers (before, it waited on the silent connection forever).
TEST_F(CliEndToEndTest, WatchNoticesASilentCoordinatorAndReconnects) {
  std::string spec = ReadFile(SourcePath("configs/jobs/tiny-cpu.yaml"));
  spec.replace(spec.find("ep: 2"), 5, "ep: 4");  // pending: more ranks than the worker's slots
  CommandResult submitted = Cli({"submit", "-f", WriteFile("hung.yaml", spec), "--name", "hung"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  const std::string id = Trimmed(submitted.out);
  std::unique_ptr<Process> watch = StartWatch(id);
  ASSERT_NE(watch, nullptr);
  for (int i = 0; i < 100 && !absl::StrContains(watch->Output(), "PENDING"); ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_THAT(watch->Output(), HasSubstr("PENDING"));
  ASSERT_TRUE(coordinator_->Signal(SIGSTOP).ok());
  const absl::Time stopped = absl::Now();
  for (int i = 0; i < 300 && !absl::StrContains(watch->Output(), "watch: lost the coordinator");
       ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  const absl::Duration noticed = absl::Now() - stopped;
  ASSERT_TRUE(coordinator_->Signal(SIGCONT).ok());
  EXPECT_THAT(watch->Output(), HasSubstr("watch: lost the coordinator"));
  EXPECT_LT(noticed, absl::Seconds(25));
  absl::SleepFor(absl::Seconds(3));  // back, and watching again
  EXPECT_TRUE(watch->Running()) << watch->Output();
  CommandResult cancel = Cli({"cancel", id});
  ASSERT_EQ(cancel.exit_code, 0) << cancel.err;
  absl::StatusOr<int> code = watch->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok()) << code.status() << "\n" << watch->Output();
  EXPECT_EQ(*code, 6) << watch->Output();
}

// The polling watches (`top -w`, `get jobs -w`) ride out a coordinator restart as `watch` and
// `logs -f` do: one notice, then the same view again once it is back (they exited 4 before).
TEST_F(CliEndToEndTest, TopAndGetJobsWatchRideOutACoordinatorRestart) {
  std::string spec = ReadFile(SourcePath("configs/jobs/tiny-cpu.yaml"));
  spec.replace(spec.find("steps: 40"), 9, "steps: 1000");
  CommandResult submitted =
      Cli({"submit", "-f", WriteFile("polled.yaml", spec), "--name", "polled"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  const std::string id = Trimmed(submitted.out);
  auto top = Process::Start(CliArgv({"top", id, "-w"}));
  ASSERT_TRUE(top.ok()) << top.status();
  auto listing = Process::Start(CliArgv({"get", "jobs", "-w"}));
  ASSERT_TRUE(listing.ok()) << listing.status();
  for (int i = 0; i < 600 && !absl::StrContains((*top)->Output(), "STEP_TIME"); ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_THAT((*top)->Output(), HasSubstr("STEP_TIME"));
  // Down for longer than either's poll interval (2 s, 1 s), so that both see it gone.
  RestartCoordinator(absl::Seconds(4));
  absl::StatusOr<int> code = (*top)->Wait(absl::Seconds(300));
  ASSERT_TRUE(code.ok()) << code.status() << "\n" << (*top)->Output();
  EXPECT_EQ(*code, 0) << (*top)->Output();
  EXPECT_THAT((*top)->Output(), HasSubstr("top: lost the coordinator"));
  EXPECT_THAT((*top)->Output(), HasSubstr("SUCCEEDED"));
  for (int i = 0; i < 100 && !absl::StrContains((*listing)->Output(), "SUCCEEDED"); ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE((*listing)->Running()) << (*listing)->Output();
  EXPECT_THAT((*listing)->Output(), HasSubstr("get -w: lost the coordinator"));
  EXPECT_THAT((*listing)->Output(), HasSubstr("SUCCEEDED"));
  ASSERT_TRUE((*listing)->Signal(SIGTERM).ok());
}

}  // namespace
}  // namespace dropless::testing
