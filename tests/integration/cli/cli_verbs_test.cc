// The CLI's kubectl habits against a real coordinator on loopback (and, for the verbs that need a
// job to run, a real worker): version, completion, submit --dry-run / --wait, get jobs --state /
// -l / --chunk-size / -w, logs --tail / --since, top, and a job's time_limit.
#include <signal.h>

#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cli/cli_fixture.h"

namespace dropless::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(Trimmed(text), '\n', absl::SkipEmpty());
}

int JobCount(const CommandResult& r) {
  return ParseJson(r.out).fields().at("jobs").list_value().values_size();
}

// Waits until `process` printed `needle` (or 30 s pass).
bool WaitForOutput(Process& process, const std::string& needle) {
  for (int i = 0; i < 300; ++i) {
    if (process.Output().find(needle) != std::string::npos) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

TEST_F(CliTest, VersionShowsClientAndServer) {
  CommandResult text = Cli({"version"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("Client Version: 0."));
  EXPECT_THAT(text.out, HasSubstr("Server Version: 0."));
  EXPECT_THAT(text.out, HasSubstr("API dropless.v1"));

  google::protobuf::Struct json = ParseJson(Cli({"version", "-o", "json"}).out);
  const auto& client = json.fields().at("client").struct_value();
  const auto& server = json.fields().at("server").struct_value();
  EXPECT_FALSE(Str(client, "version").empty());
  EXPECT_EQ(Str(server, "version"), Str(client, "version"));  // built from one tree
  EXPECT_EQ(Str(server, "api_version"), "dropless.v1");
  EXPECT_EQ(Str(server, "address"), address());
}

TEST(CliNoServerTest, VersionWithoutACoordinator) {
  const std::string nobody = absl::StrCat("127.0.0.1:", PickFreePort());
  CommandResult client_only =
      RunCommand({BinaryPath("dropless"), "--coordinator", nobody, "version", "--client"});
  EXPECT_EQ(client_only.exit_code, 0) << client_only.err;
  EXPECT_THAT(client_only.out, HasSubstr("Client Version: "));
  EXPECT_THAT(client_only.out, Not(HasSubstr("Server")));
  // kubectl's habit: the client's version, then the error reaching the server.
  CommandResult both = RunCommand(
      {BinaryPath("dropless"), "--coordinator", nobody, "--timeout", "2s", "version"});
  EXPECT_EQ(both.exit_code, 4);
  EXPECT_THAT(both.out, HasSubstr("Client Version: "));
  EXPECT_THAT(both.err, HasSubstr("error: "));
}

// Runs the bash completion function on a command line (the words so far, the last being completed)
// and returns what it offers.
std::string Complete(const std::string& script, const std::vector<std::string>& words) {
  std::string array;
  for (const std::string& w : words) absl::StrAppend(&array, " '", w, "'");
  return Trimmed(RunCommand({"bash", "-c",
                             absl::StrCat("source '", script, "'; COMP_WORDS=(", array,
                                          "); COMP_CWORD=", words.size() - 1,
                                          "; _dropless; echo \"${COMPREPLY[*]}\"")})
                     .out);
}

TEST(CliNoServerTest, CompletionScriptsCompleteCommandsFlagsAndValues) {
  CommandResult bash = RunCommand({BinaryPath("dropless"), "completion", "bash"});
  ASSERT_EQ(bash.exit_code, 0) << bash.err;
  const std::string script = MakeTempDir() + "/dropless.bash";
  std::ofstream(script) << bash.out;
  EXPECT_EQ(Complete(script, {"dropless", "ge"}), "get");
  EXPECT_EQ(Complete(script, {"dropless", "--coordinator", "x:1", "ver"}), "version");
  EXPECT_EQ(Complete(script, {"dropless", "get", "--st"}), "--state");
  EXPECT_EQ(Complete(script, {"dropless", "get", "wor"}), "workers worker");
  EXPECT_EQ(Complete(script, {"dropless", "logs", "job-000001", "--ta"}), "--tail");
  EXPECT_EQ(Complete(script, {"dropless", "submit", "--dry"}), "--dry-run");
  EXPECT_EQ(Complete(script, {"dropless", "get", "jobs", "-o", "y"}), "yaml");
  EXPECT_EQ(Complete(script, {"dropless", "completion", "z"}), "zsh");

  CommandResult zsh = RunCommand({BinaryPath("dropless"), "completion", "zsh"});
  ASSERT_EQ(zsh.exit_code, 0) << zsh.err;
  EXPECT_THAT(zsh.out, ::testing::StartsWith("#compdef dropless\n"));
  EXPECT_THAT(zsh.out, HasSubstr("bashcompinit"));
  EXPECT_THAT(zsh.out, HasSubstr("complete -F _dropless dropless"));

  EXPECT_EQ(RunCommand({BinaryPath("dropless"), "completion", "fish"}).exit_code, 2);
}

TEST_F(CliTest, SubmitDryRunIsValidatedByTheCoordinatorAndCreatesNothing) {
  const std::string spec = SourcePath("configs/jobs/tiny-cpu.yaml");
  CommandResult dry = Cli({"submit", "-f", spec, "--dry-run", "--name", "dry"});
  ASSERT_EQ(dry.exit_code, 0) << dry.err;
  EXPECT_THAT(dry.out, HasSubstr("dry validated (dry run): 2 cpu ranks, 40 steps"));
  google::protobuf::Struct job =
      ParseJson(Cli({"submit", "-f", spec, "--dry-run", "-o", "json"}).out);
  EXPECT_EQ(Str(job, "id"), "");
  EXPECT_EQ(Str(job, "state"), "PENDING");
  EXPECT_EQ(Num(job, "world_size"), 2);
  EXPECT_EQ(JobCount(Cli({"get", "jobs", "-o", "json"})), 0);
  CommandResult real = Cli({"submit", "-f", spec});
  ASSERT_EQ(real.exit_code, 0) << real.err;
  EXPECT_EQ(Trimmed(real.out), "job-000001");  // the dry runs took no id

  CommandResult both = Cli({"submit", "-f", spec, "--dry-run", "--wait"});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_THAT(both.err, HasSubstr("--dry-run"));
}

TEST_F(CliTest, SubmitWaitExitsWithTheJobsEndState) {
  auto waiting = Process::Start(CliArgv({"submit", "-f", SourcePath("configs/jobs/tiny-cpu.yaml"),
                                         "--wait"}));
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  ASSERT_TRUE(WaitForOutput(**waiting, "job-000001\n")) << (*waiting)->Output();
  // No worker: it waits PENDING until cancelled.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE((*waiting)->Running());
  ASSERT_EQ(Cli({"cancel", "job-000001"}).exit_code, 0);
  absl::StatusOr<int> code = (*waiting)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 6) << (*waiting)->Output();
  EXPECT_THAT((*waiting)->Output(), HasSubstr("CANCELLED"));
}

TEST_F(CliTest, GetJobsFiltersByState) {
  for (int i = 0; i < 3; ++i) Submit("configs/jobs/tiny-cpu.yaml");  // no worker: PENDING
  ASSERT_EQ(Cli({"cancel", "job-000002"}).exit_code, 0);
  EXPECT_EQ(JobCount(Cli({"get", "jobs", "--state", "pending", "-o", "json"})), 2);
  CommandResult cancelled = Cli({"get", "jobs", "--state", "CANCELLED"});
  ASSERT_EQ(cancelled.exit_code, 0) << cancelled.err;
  EXPECT_THAT(cancelled.out, HasSubstr("job-000002"));
  EXPECT_THAT(cancelled.out, Not(HasSubstr("job-000001")));
  EXPECT_EQ(JobCount(Cli({"get", "jobs", "--state", "Pending,cancelled", "-o", "json"})), 3);
  EXPECT_EQ(JobCount(Cli({"get", "jobs", "--state", "running", "-o", "json"})), 0);

  CommandResult bad = Cli({"get", "jobs", "--state", "sleeping"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--state: unknown job state 'sleeping'"));
  EXPECT_EQ(Cli({"get", "workers", "--state", "pending"}).exit_code, 2);
}

TEST_F(CliTest, GetJobsWatchPrintsEachChange) {
  Submit("configs/jobs/tiny-cpu.yaml");
  auto watch = Process::Start(CliArgv({"get", "jobs", "-w"}));
  ASSERT_TRUE(watch.ok()) << watch.status();
  ASSERT_TRUE(WaitForOutput(**watch, "job-000001")) << (*watch)->Output();
  EXPECT_THAT((*watch)->Output(), HasSubstr("ID"));  // the header, once
  Submit("configs/jobs/tiny-cpu.yaml");
  ASSERT_TRUE(WaitForOutput(**watch, "job-000002")) << (*watch)->Output();
  ASSERT_EQ(Cli({"cancel", "job-000001"}).exit_code, 0);
  ASSERT_TRUE(WaitForOutput(**watch, "CANCELLED")) << (*watch)->Output();
  absl::SleepFor(absl::Milliseconds(1500));  // a poll with no change prints nothing
  ASSERT_TRUE((*watch)->Signal(SIGINT).ok());
  (*watch)->Wait(absl::Seconds(10)).IgnoreError();

  const std::vector<std::string> lines = Lines((*watch)->Output());
  ASSERT_EQ(lines.size(), 4u) << (*watch)->Output();
  EXPECT_THAT(lines[0], ::testing::StartsWith("ID"));
  EXPECT_THAT(lines[1], ::testing::MatchesRegex("job-000001 +tiny-cpu +PENDING .*"));
  EXPECT_THAT(lines[2], ::testing::MatchesRegex("job-000002 +tiny-cpu +PENDING .*"));
  EXPECT_THAT(lines[3], ::testing::MatchesRegex("job-000001 +tiny-cpu +CANCELLED .*"));
  // Rows line up under the first listing's header.
  EXPECT_EQ(lines[3].find("CANCELLED"), lines[0].find("STATE"));
}

TEST_F(CliTest, GetJobsByLabelInChunks) {
  const std::string base = ReadFile(SourcePath("configs/jobs/tiny-cpu.yaml"));
  auto labelled = [&](const std::string& name, const std::string& labels) {
    std::string spec = base;
    spec.replace(spec.find("priority:"), 0, "labels: " + labels + "\n");
    return WriteFile(name, spec);
  };
  const std::vector<std::pair<std::string, std::string>> specs = {
      {"a1.yaml", "{team: a}"}, {"b.yaml", "{team: b, tier: gold}"}, {"a2.yaml", "{team: a}"}};
  for (const auto& [file, labels] : specs) {
    CommandResult r = Cli({"submit", "-f", labelled(file, labels)});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  EXPECT_EQ(JobCount(Cli({"get", "jobs", "-l", "team=a", "-o", "json"})), 2);
  EXPECT_EQ(JobCount(Cli({"get", "jobs", "-l", "team=b,tier=gold", "-o", "json"})), 1);
  EXPECT_EQ(JobCount(Cli({"get", "jobs", "--selector", "team=c", "-o", "json"})), 0);
  // One job per request: the CLI follows the page tokens to the end.
  EXPECT_EQ(JobCount(Cli({"get", "jobs", "--chunk-size", "1", "-o", "json"})), 3);
  CommandResult team_a = Cli({"get", "jobs", "-l", "team=a", "--chunk-size", "1"});
  ASSERT_EQ(team_a.exit_code, 0) << team_a.err;
  EXPECT_THAT(team_a.out, HasSubstr("job-000001"));
  EXPECT_THAT(team_a.out, HasSubstr("job-000003"));
  EXPECT_THAT(team_a.out, Not(HasSubstr("job-000002")));

  google::protobuf::Struct job = ParseJson(Cli({"get", "job", "job-000002", "-o", "json"}).out);
  EXPECT_EQ(Str(job.fields().at("labels").struct_value(), "tier"), "gold");
  EXPECT_THAT(Cli({"describe", "job", "job-000002"}).out, HasSubstr("team=b,tier=gold"));

  CommandResult bad = Cli({"get", "jobs", "-l", "team"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("-l: want key=value"));
  EXPECT_EQ(Cli({"get", "jobs", "--chunk-size", "0"}).exit_code, 2);
}

// A job past its time_limit FAILS: `submit --wait` says so and exits 5.
TEST_F(CliEndToEndTest, TimeLimitFailsTheJob) {
  std::string spec = ReadFile(SourcePath("configs/jobs/tiny-cpu.yaml"));
  spec.replace(spec.find("steps: 40"), 9, "steps: 1000000");
  spec.replace(spec.find("priority:"), 0, "time_limit: 3s\n");
  CommandResult run = Cli({"submit", "-f", WriteFile("limited.yaml", spec), "--wait"});
  EXPECT_EQ(run.exit_code, 5) << run.out << run.err;
  EXPECT_THAT(run.out, HasSubstr("time limit of 3s exceeded"));
  google::protobuf::Struct job = ParseJson(Cli({"get", "job", "job-000001", "-o", "json"}).out);
  EXPECT_EQ(Str(job, "state"), "FAILED");
  EXPECT_EQ(Num(job, "time_limit_seconds"), 3);
}

// One job runs to its end under `submit --wait`; then its logs and its ranks' latest steps.
TEST_F(CliEndToEndTest, SubmitWaitLogsTailSinceAndTop) {
  CommandResult run = Cli({"submit", "-f", SourcePath("configs/jobs/tiny-cpu.yaml"), "--wait"});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const std::string id = Lines(run.out)[0];
  EXPECT_EQ(id, "job-000001");
  EXPECT_THAT(run.out, HasSubstr("SUCCEEDED"));

  const std::vector<std::string> all = Lines(Cli({"logs", id}).out);
  ASSERT_GE(all.size(), 2u);
  const size_t n = all.size() - 1;
  CommandResult tail = Cli({"logs", id, "--tail", absl::StrCat(n)});
  ASSERT_EQ(tail.exit_code, 0) << tail.err;
  EXPECT_EQ(Lines(tail.out), std::vector<std::string>(all.end() - n, all.end()));
  EXPECT_EQ(Lines(Cli({"logs", id, "--since", "10m"}).out), all);
  absl::SleepFor(absl::Milliseconds(200));
  CommandResult none = Cli({"logs", id, "--since", "100ms"});
  EXPECT_EQ(none.exit_code, 0) << none.err;
  EXPECT_TRUE(Lines(none.out).empty()) << none.out;
  EXPECT_EQ(Cli({"logs", id, "--tail", "-1"}).exit_code, 2);
  EXPECT_EQ(Cli({"logs", id, "--since", "soon"}).exit_code, 2);

  CommandResult top = Cli({"top", id});
  ASSERT_EQ(top.exit_code, 0) << top.err;
  EXPECT_THAT(top.out, HasSubstr("SUCCEEDED"));
  EXPECT_THAT(top.out, HasSubstr("LOAD_IMBALANCE"));
  EXPECT_THAT(top.out, HasSubstr("EXPERT_TOKENS(MIN/MED/MAX)"));
  EXPECT_THAT(top.out, HasSubstr("MEMORY"));
  EXPECT_THAT(top.out,
              ::testing::ContainsRegex("\n0 +cli-e2e-node +40/40 .* [0-9]+/[0-9]+/[0-9]+ "));
  EXPECT_THAT(top.out,
              ::testing::ContainsRegex("\n1 +cli-e2e-node +40/40 .* [0-9]+/[0-9]+/[0-9]+ "));
  google::protobuf::Struct json = ParseJson(Cli({"top", id, "-o", "json"}).out);
  const auto& ranks = json.fields().at("ranks").list_value();
  ASSERT_EQ(ranks.values_size(), 2);
  for (const auto& r : ranks.values()) {
    EXPECT_EQ(Num(r.struct_value(), "step"), 40);
    EXPECT_GE(Num(r.struct_value(), "load_imbalance"), 1.0);
    EXPECT_GT(Num(r.struct_value(), "device_memory_bytes"), 0);
    // tiny-cpu: 8 experts; 256 tokens x 2 ranks x top-2 routed over the EP group each step.
    const auto& experts = r.struct_value().fields().at("expert_tokens").list_value();
    ASSERT_EQ(experts.values_size(), 8);
    double routed = 0;
    for (const auto& e : experts.values()) routed += e.number_value();
    EXPECT_EQ(routed, 1024);
    // At least the 512 rows (64 floats each) it sends; dispatch and combine move the same rows.
    EXPECT_GE(Num(r.struct_value(), "dispatch_bytes"), 512 * 64 * 4);
    EXPECT_EQ(Num(r.struct_value(), "combine_bytes"), Num(r.struct_value(), "dispatch_bytes"));
  }
  // describe shows the latest step's expert load: a summary and a histogram over the mean.
  CommandResult described = Cli({"describe", "job", id});
  ASSERT_EQ(described.exit_code, 0) << described.err;
  EXPECT_THAT(described.out, ::testing::ContainsRegex(
                                 "Expert load: +step 40: 8 experts, tokens per expert min [0-9]+, "
                                 "median [0-9]+, max [0-9]+ \\(max/mean [0-9.]+, [0-9]+ idle\\)"));
  EXPECT_THAT(described.out, HasSubstr("LOAD/MEAN"));
  EXPECT_THAT(described.out, HasSubstr("[0.9, 1.1)"));
  EXPECT_EQ(Cli({"top", "job-999999"}).exit_code, 3);
}

}  // namespace
}  // namespace dropless::testing
