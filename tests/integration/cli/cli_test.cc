// The real `dropless` binary against the real `dropless-coordinator` on loopback with a fresh
// SQLite database: output formats, exit codes, validation messages, cancellation, addressing.
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/integration/cli/cli_fixture.h"
#include "yaml-cpp/yaml.h"

namespace dropless::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST_F(CliTest, SubmitPrintsIdAndGetJobShowsIt) {
  CommandResult submit = Cli({"submit", "-f", SourcePath("configs/jobs/tiny-cpu.yaml")});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id = Trimmed(submit.out);
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(id.find('\n'), std::string::npos) << "submit prints the id alone: " << submit.out;

  CommandResult json = Cli({"get", "job", id, "-o", "json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  google::protobuf::Struct job = ParseJson(json.out);
  EXPECT_EQ(Str(job, "id"), id);
  EXPECT_EQ(Str(job, "name"), "tiny-cpu");
  EXPECT_THAT(Str(job, "state"), ::testing::AnyOf("PENDING", "SCHEDULED"));
  EXPECT_EQ(Num(job, "steps"), 40);
  EXPECT_EQ(Num(job, "world_size"), 2);
  EXPECT_EQ(Str(job, "backend"), "cpu");
  EXPECT_THAT(Str(job, "spec_yaml"), HasSubstr("tiny-cpu"));

  CommandResult yaml = Cli({"get", "job", id, "-o", "yaml"});
  ASSERT_EQ(yaml.exit_code, 0) << yaml.err;
  YAML::Node doc = YAML::Load(yaml.out);
  EXPECT_EQ(doc["id"].as<std::string>(), id);
  EXPECT_EQ(doc["state"].as<std::string>(), Str(job, "state"));
  EXPECT_EQ(doc["steps"].as<int>(), 40);
  // The multi-line spec survives the YAML emitter byte for byte.
  EXPECT_EQ(doc["spec_yaml"].as<std::string>(), Str(job, "spec_yaml"));

  CommandResult table = Cli({"get", "jobs"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  std::vector<std::string> lines = absl::StrSplit(Trimmed(table.out), '\n');
  ASSERT_EQ(lines.size(), 2u) << table.out;
  EXPECT_THAT(lines[0], ::testing::MatchesRegex(
                            "ID +NAME +STATE +ATTEMPT +STEP/STEPS +AGE"));
  EXPECT_THAT(lines[1], StartsWith(id));
  EXPECT_THAT(lines[1], HasSubstr("tiny-cpu"));
  EXPECT_THAT(lines[1], HasSubstr("/40"));
}

TEST_F(CliTest, GetJobsJsonListsEverySubmittedJob) {
  std::vector<std::string> ids;
  for (const char* name : {"first", "second", "third"}) {
    CommandResult r =
        Cli({"submit", "-f", SourcePath("configs/jobs/tiny-cpu.yaml"), "--name", name});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ids.push_back(Trimmed(r.out));
  }
  CommandResult list = Cli({"get", "jobs", "-o", "json"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  google::protobuf::Struct root = ParseJson(list.out);
  const auto& jobs = root.fields().at("jobs").list_value().values();
  ASSERT_EQ(jobs.size(), 3);
  std::vector<std::string> listed, names;
  for (const auto& j : jobs) {
    listed.push_back(Str(j.struct_value(), "id"));
    names.push_back(Str(j.struct_value(), "name"));
    EXPECT_THAT(Str(j.struct_value(), "state"), ::testing::AnyOf("PENDING", "SCHEDULED"));
  }
  EXPECT_THAT(listed, ::testing::UnorderedElementsAreArray(ids));
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("first", "second", "third"));
}

TEST_F(CliTest, OverridesReachTheServer) {
  CommandResult r = Cli({"submit", "-f", SourcePath("configs/jobs/tiny-cpu.yaml"), "--name",
                         "renamed", "--priority", "7"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  google::protobuf::Struct job = ParseJson(Cli({"get", "job", Trimmed(r.out), "-o", "json"}).out);
  EXPECT_EQ(Str(job, "name"), "renamed");
  EXPECT_EQ(Num(job, "priority"), 7);

  CommandResult bad = Cli({"submit", "-f", SourcePath("configs/jobs/tiny-cpu.yaml"), "--name",
                           "Not_A_Name"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("name: must match"));
}

TEST_F(CliTest, BadSpecFailsWithTheFieldAndStoresNothing) {
  struct Case {
    std::string from, to, message;
  };
  const std::vector<Case> cases = {
      {"experts: 8,", "experts: 9,", "model.experts: must be divisible by parallel.ep"},
      {"topk: 2,", "topk: 9,", "model.topk: must be <= model.experts"},
      {"steps: 40", "steps: 40\nstepz: 3", "stepz: unknown field"},
      {"tokens_per_rank: 256", "tokens_per_rank: lots", "tokens_per_rank: must be a decimal"},
      {"backend: cpu", "backend: cpu, gpus: 2", "resources.gpus: unknown field"},
  };
  const std::string good = ReadFile(SourcePath("configs/jobs/tiny-cpu.yaml"));
  for (const Case& c : cases) {
    std::string text = good;
    ASSERT_NE(text.find(c.from), std::string::npos) << c.from;
    text.replace(text.find(c.from), c.from.size(), c.to);
    const std::string path = WriteFile("bad.yaml", text);
    CommandResult r = Cli({"submit", "-f", path});
    EXPECT_EQ(r.exit_code, 1) << c.message;
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_TRUE(Trimmed(r.out).empty()) << r.out;
    // Also through stdin.
    CommandResult piped = RunCommand(CliArgv({"submit", "-f", "-"}), absl::Seconds(30), text);
    EXPECT_EQ(piped.exit_code, 1);
    EXPECT_THAT(piped.err, HasSubstr(c.message));
  }
  CommandResult list = Cli({"get", "jobs", "-o", "json"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(ParseJson(list.out).fields().at("jobs").list_value().values_size(), 0);
}

TEST_F(CliTest, DescribeShowsSpecSummaryAndEvents) {
  const std::string id = Submit("configs/jobs/tiny-cpu.yaml");
  CommandResult text = Cli({"describe", "job", id});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("Name:"));
  EXPECT_THAT(text.out, HasSubstr("tiny-cpu"));
  EXPECT_THAT(text.out, HasSubstr(id));
  EXPECT_THAT(text.out, HasSubstr("hidden 64, ffn 128, 8 experts, top-2 softmax"));
  EXPECT_THAT(text.out, HasSubstr("ep 2 x dp 1 = 2 ranks"));
  EXPECT_THAT(text.out, HasSubstr("Events:"));
  EXPECT_THAT(text.out, HasSubstr("Submitted"));

  CommandResult json = Cli({"describe", "job", id, "-o", "json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  google::protobuf::Struct job = ParseJson(json.out);
  EXPECT_EQ(Str(job, "id"), id);
  const auto& events = job.fields().at("events").list_value().values();
  ASSERT_GE(events.size(), 1);
  EXPECT_EQ(Str(events[0].struct_value(), "type"), "Submitted");
  EXPECT_FALSE(Str(events[0].struct_value(), "time").empty());
}

TEST_F(CliTest, CancelPendingJobAndWatchReportsCancelled) {
  const std::string id = Submit("configs/jobs/tiny-cpu.yaml");  // no workers: stays PENDING
  EXPECT_EQ(Str(ParseJson(Cli({"get", "job", id, "-o", "json"}).out), "state"), "PENDING");

  CommandResult cancel = Cli({"cancel", id});
  ASSERT_EQ(cancel.exit_code, 0) << cancel.err;
  EXPECT_THAT(cancel.out, HasSubstr("CANCELLED"));
  EXPECT_EQ(Str(ParseJson(Cli({"get", "job", id, "-o", "json"}).out), "state"), "CANCELLED");

  CommandResult watch = Cli({"watch", id, "-o", "json"});
  EXPECT_EQ(watch.exit_code, 6) << watch.err;
  std::vector<std::string> lines = absl::StrSplit(Trimmed(watch.out), '\n');
  ASSERT_GE(lines.size(), 1u);
  google::protobuf::Struct last = ParseJson(lines.back());
  EXPECT_EQ(Str(last, "id"), id);
  EXPECT_EQ(Str(last, "state"), "CANCELLED");

  CommandResult plain = Cli({"watch", id});
  EXPECT_EQ(plain.exit_code, 6);
  EXPECT_THAT(plain.out, HasSubstr("CANCELLED"));

  CommandResult described = Cli({"describe", "job", id});
  EXPECT_THAT(described.out, HasSubstr("Cancelled"));
}

TEST_F(CliTest, UnknownIdsExitWithNotFound) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"get", "job", "no-such-job"},
           {"describe", "job", "no-such-job"},
           {"cancel", "no-such-job"},
           {"watch", "no-such-job"},
           {"get", "worker", "no-such-worker"}}) {
    CommandResult r = Cli(args);
    EXPECT_EQ(r.exit_code, 3) << absl::StrJoin(args, " ") << ": " << r.err;
    EXPECT_THAT(r.err, StartsWith("error: "));
  }
}

TEST_F(CliTest, GetWorkersWithNoneRegistered) {
  CommandResult json = Cli({"get", "workers", "-o", "json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_EQ(ParseJson(json.out).fields().at("workers").list_value().values_size(), 0);
  CommandResult table = Cli({"get", "workers"});
  EXPECT_EQ(table.exit_code, 0) << table.err;
}

TEST_F(CliTest, CoordinatorFromEnvironmentAndFlagWins) {
  const std::string id = Submit("configs/jobs/tiny-cpu.yaml");
  const std::string bin = BinaryPath("dropless");
  CommandResult from_env = RunCommand(
      {"/usr/bin/env", "DROPLESS_COORDINATOR=" + address(), "DROPLESS_INSECURE=1", bin, "get",
       "job", id, "-o", "json"});
  ASSERT_EQ(from_env.exit_code, 0) << from_env.err;
  EXPECT_EQ(Str(ParseJson(from_env.out), "id"), id);

  const std::string dead = absl::StrCat("127.0.0.1:", PickFreePort());
  CommandResult env_dead = RunCommand({"/usr/bin/env", "DROPLESS_COORDINATOR=" + dead, bin,
                                       "--insecure", "get", "jobs", "--timeout", "5s"});
  EXPECT_EQ(env_dead.exit_code, 4) << env_dead.err;
  EXPECT_THAT(env_dead.err, HasSubstr(dead));

  CommandResult flag_wins = RunCommand({"/usr/bin/env", "DROPLESS_COORDINATOR=" + dead, bin,
                                        "--insecure", "--coordinator", address(), "get", "job",
                                        id});
  EXPECT_EQ(flag_wins.exit_code, 0) << flag_wins.err;
}

TEST(CliNoServerTest, UnreachableCoordinatorExitsFour) {
  const std::string dead = absl::StrCat("127.0.0.1:", PickFreePort());
  const std::string bin = BinaryPath("dropless");
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"get", "jobs"},
           {"get", "job", "x", "-o", "json"},
           {"describe", "job", "x"},
           {"watch", "x"},
           {"cancel", "x"},
           {"submit", "-f", SourcePath("configs/jobs/tiny-cpu.yaml")}}) {
    std::vector<std::string> argv = {bin, "--coordinator", dead, "--timeout", "5s"};
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult r = RunCommand(argv, absl::Seconds(30));
    EXPECT_EQ(r.exit_code, 4) << absl::StrJoin(args, " ") << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("cannot reach the coordinator at " + dead));
  }
}

TEST(CliNoServerTest, UsageErrorsExitTwo) {
  const std::string bin = BinaryPath("dropless");
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {},
           {"frobnicate"},
           {"get"},
           {"get", "pods"},
           {"get", "jobs", "-o", "xml"},
           {"submit"},
           {"submit", "-f"},
           {"watch"},
           {"logs", "x", "--rank", "minus-one"},
           {"get", "jobs", "--timeout", "soon"},
           {"get", "jobs", "-l", "a=b=c"},  // no job's label value can hold '='
           {"get", "jobs", "-l", "-bad=x"},
           {"cancel", ""},
           {"cancel", "--bogus", "x"}}) {
    std::vector<std::string> argv = {bin};
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult r = RunCommand(argv, absl::Seconds(30));
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(args, " ") << ": " << r.err;
  }
  CommandResult help = RunCommand({bin, "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("Exit codes:"));
  EXPECT_THAT(help.out, HasSubstr("4  the coordinator cannot be reached"));
  CommandResult submit_help = RunCommand({bin, "submit", "--help"});
  EXPECT_EQ(submit_help.exit_code, 0);
  EXPECT_THAT(submit_help.out, HasSubstr("-f, --filename FILE"));
  // A coordinator port past 65535 would wrap and dial another port: refused, naming where it came
  // from, before any network call.
  CommandResult wrapped = RunCommand({bin, "--coordinator", "127.0.0.1:70000", "get", "jobs"});
  EXPECT_EQ(wrapped.exit_code, 2) << wrapped.err;
  EXPECT_THAT(wrapped.err, HasSubstr("--coordinator: "));
  CommandResult from_env =
      RunCommand({"/usr/bin/env", "DROPLESS_COORDINATOR=localhost:99999", bin, "get", "jobs"});
  EXPECT_EQ(from_env.exit_code, 2) << from_env.err;
  EXPECT_THAT(from_env.err, HasSubstr("$DROPLESS_COORDINATOR: "));
}

// Commands that make no call run whatever the connection settings say: `source <(dropless
// completion bash)` in a shell whose $DROPLESS_TOKEN_FILE is stale (they exited 2 before). A
// command that calls fails naming the variable, or the flag, the bad value came from.
TEST(CliNoServerTest, LocalCommandsNeedNoCredentialsAndErrorsNameTheirSource) {
  const std::string bin = BinaryPath("dropless");
  const std::vector<std::string> stale = {"/usr/bin/env",
                                          "-u",
                                          "DROPLESS_INSECURE",
                                          "DROPLESS_TOKEN_FILE=/nonexistent",
                                          "DROPLESS_TLS_CA=/nonexistent/ca.pem",
                                          "DROPLESS_COORDINATOR=not an address",
                                          bin};
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--help"},
                                             {"logs", "--help"},
                                             {"version", "--client"},
                                             {"completion", "bash"},
                                             {"completion", "zsh"}}) {
    std::vector<std::string> argv = stale;
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult r = RunCommand(argv, absl::Seconds(30));
    EXPECT_EQ(r.exit_code, 0) << absl::StrJoin(args, " ") << ": " << r.err;
    EXPECT_FALSE(r.out.empty()) << absl::StrJoin(args, " ");
  }
  const std::string dead = absl::StrCat("127.0.0.1:", PickFreePort());
  CommandResult from_env =
      RunCommand({"/usr/bin/env", "-u", "DROPLESS_INSECURE", "DROPLESS_TOKEN_FILE=/nonexistent",
                  bin, "--coordinator", dead, "get", "jobs"},
                 absl::Seconds(30));
  EXPECT_EQ(from_env.exit_code, 2) << from_env.err;
  EXPECT_THAT(from_env.err, HasSubstr("error: $DROPLESS_TOKEN_FILE /nonexistent: cannot open"));
  CommandResult from_flag =
      RunCommand({"/usr/bin/env", "-u", "DROPLESS_INSECURE", "DROPLESS_TOKEN_FILE=/nonexistent",
                  bin, "--coordinator", dead, "--token-file", "/nonexistent/flag", "get", "jobs"},
                 absl::Seconds(30));
  EXPECT_EQ(from_flag.exit_code, 2) << from_flag.err;
  EXPECT_THAT(from_flag.err, HasSubstr("error: --token-file /nonexistent/flag: cannot open"));
  CommandResult ca = RunCommand({"/usr/bin/env", "-u", "DROPLESS_INSECURE", "-u",
                                 "DROPLESS_TOKEN_FILE", "DROPLESS_TLS_CA=/nonexistent/ca.pem", bin,
                                 "--coordinator", dead, "--token", "t", "get", "jobs"},
                                absl::Seconds(30));
  EXPECT_EQ(ca.exit_code, 2) << ca.err;
  EXPECT_THAT(ca.err, HasSubstr("error: $DROPLESS_TLS_CA: "));
  // Non-finite and absurd durations are refused, naming the flag (`--timeout nan` removed the
  // deadline).
  for (const char* timeout : {"nan", "inf", "1e400"}) {
    CommandResult r =
        RunCommand({bin, "--insecure", "--coordinator", dead, "--timeout", timeout, "get", "jobs"},
                   absl::Seconds(30));
    EXPECT_EQ(r.exit_code, 2) << timeout << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("--timeout")) << timeout;
  }
}

TEST(CliNoServerTest, BadSpecFailsBeforeAnyNetworkCall) {
  // No coordinator at all: a bad spec is still reported with its field, exit 1 (not 4).
  const std::string dead = absl::StrCat("127.0.0.1:", PickFreePort());
  CommandResult r = RunCommand({BinaryPath("dropless"), "--coordinator", dead, "submit", "-f", "-"},
                               absl::Seconds(30),
                               "name: x\nmodel: {hidden: 64, ffn: 128, experts: 8, topk: 2}\n"
                               "parallel: {ep: 3}\ntokens_per_rank: 8\nsteps: 1\n");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("<stdin>: model.experts: must be divisible by parallel.ep"));
  // An oversized spec is refused with the limit (not the bytes read before stopping); a file that
  // cannot be read says why.
  CommandResult big =
      RunCommand({BinaryPath("dropless"), "--coordinator", dead, "submit", "-f", "-"},
                 absl::Seconds(30), "# " + std::string(200 * 1024, 'x') + "\n");
  EXPECT_EQ(big.exit_code, 1);
  EXPECT_THAT(big.err,
              HasSubstr("<stdin>: a job spec may be at most 65536 bytes; this one is larger"));
  CommandResult missing = RunCommand(
      {BinaryPath("dropless"), "--coordinator", dead, "submit", "-f", "/nonexistent/spec.yaml"},
      absl::Seconds(30));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err,
              HasSubstr("cannot read /nonexistent/spec.yaml: No such file or directory"));
}

}  // namespace
}  // namespace dropless::testing
