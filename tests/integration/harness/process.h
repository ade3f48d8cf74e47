// Test harness for integration tests: real binaries started as child processes on loopback.
#ifndef DROPLESS_TESTS_INTEGRATION_HARNESS_PROCESS_H_
#define DROPLESS_TESTS_INTEGRATION_HARNESS_PROCESS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dropless::testing {

// A TCP port on 127.0.0.1 that was free a moment ago (bound, then released).
int PickFreePort();

// A child process whose stdout and stderr go to one temporary file. It is SIGKILLed when the thread
// that started it exits (PR_SET_PDEATHSIG), so start processes from the test's main thread.
class Process {
 public:
  static absl::StatusOr<std::unique_ptr<Process>> Start(
      std::vector<std::string> argv, std::map<std::string, std::string> extra_env = {});
  ~Process();  // SIGKILLs the process if it is still running

  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool Running();
  absl::Status Signal(int sig);
  // Exit code, or 128 + signal number; DeadlineExceeded if still running after timeout.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // Everything the process wrote to stdout and stderr so far.
  std::string Output() const;

 private:
  Process(pid_t pid, std::string output_path) : pid_(pid), output_path_(std::move(output_path)) {}
  pid_t pid_;
  std::string output_path_;
  bool reaped_ = false;
  int exit_code_ = -1;
};

struct CommandResult {
  int exit_code = -1;  // 128 + signal when killed, -1 when it could not start
  std::string out;
  std::string err;
};

// Runs a command to completion (SIGKILLed after timeout) with stdin_data on its stdin.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         absl::Duration timeout = absl::Seconds(60),
                         const std::string& stdin_data = "");

// Path of a binary built by this project (dropless-coordinator, dropless-worker, dropless).
std::string BinaryPath(const std::string& name);

// Path of a file in the source tree, e.g. SourcePath("configs/jobs/tiny-cpu.yaml").
std::string SourcePath(const std::string& relative);

bool WaitForTcpPort(int port, absl::Duration timeout);

// A fresh directory under $TMPDIR (or /tmp); not removed.
std::string MakeTempDir();

// Body of GET http://127.0.0.1:port/path; "" on any failure.
std::string HttpGet(int port, const std::string& path);

}  // namespace dropless::testing

#endif  // DROPLESS_TESTS_INTEGRATION_HARNESS_PROCESS_H_
