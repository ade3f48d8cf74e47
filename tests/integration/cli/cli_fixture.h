// CliTest: a real dropless-coordinator on loopback with a fresh database per test, and helpers to
// run the real dropless binary against it and read its JSON.
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
    auto started = Process::Start({BinaryPath("dropless-coordinator"), "--listen",
                                   absl::StrCat("127.0.0.1:", port_), "--db", dir_ + "/state.db",
                                   "--metrics-port", absl::StrCat(metrics_port)});
    ASSERT_TRUE(started.ok()) << started.status();
    coordinator_ = *std::move(started);
    ASSERT_TRUE(WaitForTcpPort(port_, absl::Seconds(30)))
        << "coordinator did not listen:\n" << coordinator_->Output();
  }

  // kill -9, then a new coordinator on the same port and database.
  void RestartCoordinator() {
    ASSERT_TRUE(coordinator_->Signal(SIGKILL).ok());
    ASSERT_TRUE(coordinator_->Wait(absl::Seconds(10)).ok());
    StartCoordinator();
  }

  void TearDown() override {
    if (HasFailure() && coordinator_) std::cerr << "coordinator output:\n" << coordinator_->Output();
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  std::vector<std::string> CliArgv(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {BinaryPath("dropless"), "--coordinator", address(),
                                     "--timeout", "10s"};
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

}  // namespace dropless::testing

#endif  // DROPLESS_TESTS_INTEGRATION_CLI_CLI_FIXTURE_H_
