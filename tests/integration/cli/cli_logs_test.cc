// `dropless logs` against the real coordinator, with a rank's output sent by the coordinator
// tests' minimal worker (tests/integration/coordinator/coordinator_test_support.h), so that the
// test decides what the rank wrote: a backlog of megabytes read through a pager that pauses, and
// escape sequences read on a terminal. (A coordinator that never answers: cli_first_answer_test.)
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"
#include "tests/integration/harness/process.h"

namespace dropless::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Runs argv with its stdin, stdout and stderr on a new pseudo-terminal (as an admin's shell runs
// it): everything it wrote there, and its exit code (-1 when it could not start).
CommandResult RunOnTerminal(const std::vector<std::string>& argv, absl::Duration timeout) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  CommandResult result;
  int master = -1;
  const pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  if (pid < 0) return result;
  if (pid == 0) {
    execv(args[0], args.data());
    _exit(127);
  }
  const absl::Time deadline = absl::Now() + timeout;
  char buffer[4096];
  while (true) {
    pollfd ready{master, POLLIN, 0};
    const int64_t wait_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    const int polled = wait_ms > 0 ? poll(&ready, 1, static_cast<int>(wait_ms)) : 0;
    if (polled < 0 && errno == EINTR) continue;
    if (polled <= 0) {
      kill(pid, SIGKILL);
      break;
    }
    const ssize_t n = read(master, buffer, sizeof(buffer));
    if (n <= 0) break;  // EIO: every process closed the terminal
    result.out.append(buffer, static_cast<size_t>(n));
  }
  int status = 0;
  waitpid(pid, &status, 0);
  close(master);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::string ReadFileText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string ShellQuoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A coordinator with one job RUNNING on a minimal worker: what rank 0 "writes" is the test's.
class CliLogsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    coordinator_ = CoordinatorUnderTest::Start();
    ASSERT_FALSE(HasFatalFailure());
    worker_ = std::make_unique<FakeWorker>(coordinator_->channel(), "logs-node", 1);
    ASSERT_TRUE(worker_->Join().ok());
    absl::StatusOr<v1::Job> job = SubmitRunning(*coordinator_, *worker_, TinySpec(1));
    ASSERT_TRUE(job.ok()) << job.status();
    job_id_ = job->id();
  }

  void TearDown() override {
    if (HasFailure()) std::cerr << "coordinator output:\n" << coordinator_->process().Output();
  }

  // Sends `lines` as rank 0's output, `per_batch` a message, and waits until the coordinator has
  // stored the last one.
  void SendLines(const std::vector<std::string>& lines, size_t per_batch = 200) {
    for (size_t first = 0; first < lines.size(); first += per_batch) {
      v1::WorkerMessage message;
      for (size_t i = first; i < std::min(lines.size(), first + per_batch); ++i) {
        v1::LogLine* line = message.mutable_logs()->add_lines();
        line->set_job_id(job_id_);
        line->set_attempt(1);
        line->set_rank(0);
        line->set_text(lines[i]);
      }
      ASSERT_TRUE(worker_->Send(message).ok());
    }
    for (int i = 0; i < 300; ++i) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::GetLogsRequest request;
      request.set_job_id(job_id_);
      request.set_tail_lines(1);
      auto reader = coordinator_->jobs().GetLogs(&context, request);
      v1::LogLine line, last;
      while (reader->Read(&line)) last = line;
      if (reader->Finish().ok() && last.text() == lines.back()) return;
      absl::SleepFor(absl::Milliseconds(100));
    }
    FAIL() << "the coordinator did not store the lines";
  }

  std::vector<std::string> CliArgv(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {BinaryPath("dropless"), "--insecure", "--coordinator",
                                     coordinator_->address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  std::unique_ptr<CoordinatorUnderTest> coordinator_;
  std::unique_ptr<FakeWorker> worker_;
  std::string job_id_;
};

// `dropless logs ID | less` with the pager paused: --timeout bounds the wait for the first answer,
// not the backlog, which arrives whole and in order once the reader drains it (it used to end
// "the coordinator did not answer within 1s (--timeout)", exit 1, part of it printed).
TEST_F(CliLogsTest, ABacklogOfMegabytesOutlastsTheTimeoutBehindAPausedReader) {
  std::vector<std::string> lines;
  for (int i = 0; i < 6000; ++i) {
    lines.push_back(absl::StrFormat("line %05d %s", i, std::string(1000, 'a' + i % 26)));
  }
  SendLines(lines);
  ASSERT_FALSE(HasFatalFailure());
  const std::string out = MakeTempDir() + "/logs.txt";
  std::string command = "set -o pipefail; ";
  for (const std::string& a : CliArgv({"--timeout", "1s", "logs", job_id_, "--rank", "0"})) {
    absl::StrAppend(&command, ShellQuoted(a), " ");
  }
  absl::StrAppend(&command, "| { sleep 3; cat; } > ", ShellQuoted(out));
  const absl::Time start = absl::Now();
  CommandResult r = RunCommand({"bash", "-c", command}, absl::Seconds(120));
  EXPECT_GE(absl::Now() - start, absl::Seconds(3));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  std::vector<std::string> got = absl::StrSplit(ReadFileText(out), '\n');
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.back(), "");  // the last line ends with a newline
  got.pop_back();
  ASSERT_EQ(got.size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i) ASSERT_EQ(got[i], lines[i]) << "line " << i;
}

// Rank output is user code's: on a terminal its escape sequences print as '?' (no screen clear,
// no clipboard write); piped, with --raw, or as -o json (escaped), the text is kept.
TEST_F(CliLogsTest, EscapeSequencesReachATerminalDefused) {
  const std::string hostile = "ok\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07 then\x1b[31m red\r!";
  SendLines({"plain line", hostile});
  ASSERT_FALSE(HasFatalFailure());

  CommandResult terminal = RunOnTerminal(CliArgv({"logs", job_id_}), absl::Seconds(60));
  ASSERT_EQ(terminal.exit_code, 0) << terminal.out;
  EXPECT_THAT(terminal.out, HasSubstr("[rank 0] plain line"));
  EXPECT_THAT(terminal.out, HasSubstr("[rank 0] ok?[2J?]52;c;cm0gLXJmIH4=? then?[31m red?!"));
  EXPECT_THAT(terminal.out, Not(HasSubstr("\x1b")));

  CommandResult raw = RunOnTerminal(CliArgv({"logs", job_id_, "--raw"}), absl::Seconds(60));
  ASSERT_EQ(raw.exit_code, 0) << raw.out;
  EXPECT_THAT(raw.out, HasSubstr("ok\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07 then"));

  CommandResult json = RunOnTerminal(CliArgv({"logs", job_id_, "-o", "json"}), absl::Seconds(60));
  ASSERT_EQ(json.exit_code, 0) << json.out;
  EXPECT_THAT(json.out, HasSubstr("ok\\u001b[2J\\u001b]52;c;cm0gLXJmIH4=\\u0007 then"));
  EXPECT_THAT(json.out, Not(HasSubstr("\x1b")));

  CommandResult piped = RunCommand(CliArgv({"logs", job_id_, "--rank", "0"}));
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  EXPECT_EQ(piped.out, "plain line\n" + hostile + "\n");
}

}  // namespace
}  // namespace dropless::testing
