// CliTest: a real dropless-coordinator on loopback with a fresh database per test, and helpers to
// run the real dropless binary against it and read its JSON. CliEndToEndTest adds a real
// dropless-worker offering 2 CPU slots.
#ifndef DROPLESS_TESTS_INTEGRATION_CLI_CLI_FIXTURE_H_
#define DROPLESS_TESTS_INTEGRATION_CLI_CLI_FIXTURE_H_

#include <signal.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/integration/harness/process.h"

namespace dropless::testing {

inline std::string Trimmed(const std::string& s) {
  return std::string(absl::StripAsciiWhitespace(s));
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Parses one JSON object with protobuf's strict JSON parser; fails the test on bad JSON.
inline google::protobuf::Struct ParseJson(const std::string& text) {
  google::protobuf::Struct out;
  auto status = google::protobuf::util::JsonStringToMessage(text, &out);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\nin: " << text;
  return out;
}

inline std::string Str(const google::protobuf::Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  EXPECT_TRUE(it != s.fields().end()) << "no field " << key;
  return it == s.fields().end() ? "" : it->second.string_value();
}

inline double Num(const google::protobuf::Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  EXPECT_TRUE(it != s.fields().end()) << "no field " << key;
  return it == s.fields().end() ? -1 : it->second.number_value();
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    port_ = PickFreePort();
    StartCoordinator();
  }

  // A coordinator on port_ with the database in dir_ (a restart finds the state it left).
  void StartCoordinator() {
    const int metrics_port = PickFreePort();
    auto started = Process::Start({BinaryPath("dropless-coordinator"), "--insecure", "--listen",
                                   absl::StrCat("127.0.0.1:", port_), "--db", dir_ + "/state.db",
                                   "--metrics-port", absl::StrCat(metrics_port)});
    ASSERT_TRUE(started.ok()) << started.status();
    coordinator_ = *std::move(started);
    ASSERT_TRUE(WaitForTcpPort(port_, absl::Seconds(30)))
        << "coordinator did not listen:\n" << coordinator_->Output();
  }

  // kill -9, then (after `down`) a new coordinator on the same port and database.
  void RestartCoordinator(absl::Duration down = absl::ZeroDuration()) {
    ASSERT_TRUE(coordinator_->Signal(SIGKILL).ok());
    ASSERT_TRUE(coordinator_->Wait(absl::Seconds(10)).ok());
    absl::SleepFor(down);
    StartCoordinator();
  }

  void TearDown() override {
    if (HasFailure() && coordinator_) std::cerr << "coordinator output:\n" << coordinator_->Output();
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  std::vector<std::string> CliArgv(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {BinaryPath("dropless"), "--insecure", "--coordinator",
                                     address(), "--timeout", "10s"};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  CommandResult Cli(const std::vector<std::string>& args,
                    absl::Duration timeout = absl::Seconds(60)) const {
    return RunCommand(CliArgv(args), timeout);
  }

  // Submits a spec from the source tree; returns the job id ("" and a test failure otherwise).
  std::string Submit(const std::string& relative_path) {
    CommandResult r = Cli({"submit", "-f", SourcePath(relative_path)});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return Trimmed(r.out);
  }

  std::string WriteFile(const std::string& name, const std::string& text) const {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  std::string dir_;
  int port_ = 0;
  std::unique_ptr<Process> coordinator_;
};

// Plus one dropless-worker with 2 CPU slots, READY before the test starts.
class CliEndToEndTest : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    if (HasFatalFailure()) return;
    auto started = Process::Start({BinaryPath("dropless-worker"), "--insecure", "--coordinator",
                                   address(),
                                   "--node", "cli-e2e-node", "--cpu-slots", "2", "--gpus", "none",
                                   "--metrics-port", "0", "--work-dir", dir_ + "/worker"});
    ASSERT_TRUE(started.ok()) << started.status();
    worker_ = *std::move(started);
    // The worker is READY once `get workers` lists it.
    for (int i = 0; i < 300; ++i) {
      CommandResult r = Cli({"get", "workers", "-o", "json"});
      if (r.exit_code == 0 && r.out.find("\"READY\"") != std::string::npos) return;
      ASSERT_TRUE(worker_->Running()) << "worker exited:\n" << worker_->Output();
      absl::SleepFor(absl::Milliseconds(100));
    }
    FAIL() << "worker never became READY:\n" << worker_->Output();
  }

  void TearDown() override {
    if (HasFailure() && worker_) std::cerr << "worker output:\n" << worker_->Output();
    // SIGTERM first: the daemon stops its rank processes; a SIGKILL would orphan them.
    if (worker_ && worker_->Running() && worker_->Signal(SIGTERM).ok()) {
      worker_->Wait(absl::Seconds(15)).IgnoreError();
    }
    worker_.reset();  // before the coordinator, so that it does not spin on reconnects
    CliTest::TearDown();
  }

  // Polls `get job -o json` until the job is in `state` (or 60 s pass).
  bool WaitForState(const std::string& id, const std::string& state) {
    for (int i = 0; i < 600; ++i) {
      CommandResult r = Cli({"get", "job", id, "-o", "json"});
      if (r.exit_code == 0 && r.out.find("\"state\":\"" + state + "\"") != std::string::npos) {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  }

  // tiny-cpu with enough steps to still be running when the test acts on it.
  std::string SubmitLongJob(const std::string& name) {
    std::string spec = ReadFile(SourcePath("configs/jobs/tiny-cpu.yaml"));
    spec.replace(spec.find("steps: 40"), 9, "steps: 1000000");
    CommandResult r = Cli({"submit", "-f", WriteFile(name + ".yaml", spec), "--name", name});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return Trimmed(r.out);
  }

  std::unique_ptr<Process> StartWatch(const std::string& id) {
    auto watch = Process::Start(CliArgv({"watch", id, "-o", "json"}));
    EXPECT_TRUE(watch.ok()) << watch.status();
    return watch.ok() ? *std::move(watch) : nullptr;
  }

  std::unique_ptr<Process> worker_;
};

}  // namespace dropless::testing

#endif  // DROPLESS_TESTS_INTEGRATION_CLI_CLI_FIXTURE_H_
