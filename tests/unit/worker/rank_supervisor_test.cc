#include "worker/daemon/rank_supervisor.h"

#include <errno.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/utf8.h"
#include "gtest/gtest.h"

namespace dropless {
namespace {

// Records what the supervisor reports, per child id.
class Recorder {
 public:
  RankSupervisor::Callbacks Callbacks() {
    RankSupervisor::Callbacks cb;
    cb.on_output = [this](RankSupervisor::ChildId id, absl::string_view line) {
      absl::MutexLock lock(&mu_);
      EXPECT_EQ(exits_.count(id), 0u) << "output after exit";
      output_[id].emplace_back(line);
    };
    cb.on_report = [this](RankSupervisor::ChildId id, absl::string_view line) {
      absl::MutexLock lock(&mu_);
      EXPECT_EQ(exits_.count(id), 0u) << "report after exit";
      reports_[id].emplace_back(line);
    };
    cb.on_exit = [this](RankSupervisor::ChildId id, const ChildExit& exit) {
      absl::MutexLock lock(&mu_);
      EXPECT_EQ(exits_.count(id), 0u) << "two exits";
      exits_[id] = exit;
      exit_times_[id] = absl::Now();
    };
    return cb;
  }

  bool WaitExit(RankSupervisor::ChildId id, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return exits_.count(id) > 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
  bool WaitOutput(RankSupervisor::ChildId id, const std::string& line, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto seen = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const std::string& l : output_[id]) {
        if (l == line) return true;
      }
      return false;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&seen), timeout);
  }
  ChildExit Exit(RankSupervisor::ChildId id) {
    absl::MutexLock lock(&mu_);
    return exits_.at(id);
  }
  absl::Time ExitTime(RankSupervisor::ChildId id) {
    absl::MutexLock lock(&mu_);
    return exit_times_.at(id);
  }
  std::vector<std::string> Output(RankSupervisor::ChildId id) {
    absl::MutexLock lock(&mu_);
    return output_[id];
  }
  std::vector<std::string> Reports(RankSupervisor::ChildId id) {
    absl::MutexLock lock(&mu_);
    return reports_[id];
  }

 private:
  absl::Mutex mu_;
  std::map<RankSupervisor::ChildId, std::vector<std::string>> output_ ABSL_GUARDED_BY(mu_);
  std::map<RankSupervisor::ChildId, std::vector<std::string>> reports_ ABSL_GUARDED_BY(mu_);
  std::map<RankSupervisor::ChildId, ChildExit> exits_ ABSL_GUARDED_BY(mu_);
  std::map<RankSupervisor::ChildId, absl::Time> exit_times_ ABSL_GUARDED_BY(mu_);
};

ChildSpec Shell(const std::string& script, bool report_pipe = false) {
  ChildSpec spec;
  spec.path = "/bin/sh";
  spec.argv = {"sh", "-c", script};
  spec.report_pipe = report_pipe;
  return spec;
}

// True when pid is neither running nor a zombie of this process.
bool FullyGone(pid_t pid) {
  int status;
  return waitpid(pid, &status, WNOHANG) < 0 && errno == ECHILD && kill(pid, 0) != 0;
}

// State letter from /proc/<pid>/stat ('R', 'S', 'Z', ...), or 0 when it cannot be read.
char ProcessState(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : 0;
}

std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/dropless-supervisor-test-", getpid(), "-",
                      name);
}

TEST(RankSupervisorTest, CapturesOutputReportsAndExitCode) {
  Recorder rec;
  RankSupervisor supervisor(rec.Callbacks());
  const std::string log = TempPath("log");
  unlink(log.c_str());
  ChildSpec spec = Shell(
      "echo hello; echo to-stderr >&2; printf 'no newline'; echo ready >&3; "
      "echo step=1 >&3; exit 3",
      /*report_pipe=*/true);
  spec.log_path = log;
  absl::StatusOr<pid_t> pid = supervisor.Start(1, spec);
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(rec.WaitExit(1, absl::Seconds(10)));
  ChildExit exit = rec.Exit(1);
  EXPECT_EQ(exit.exit_code, 3);
  EXPECT_EQ(exit.signal, 0);
  EXPECT_FALSE(exit.success());
  EXPECT_FALSE(exit.stop_requested);
  EXPECT_EQ(exit.shell_status(), 3);
  EXPECT_EQ(exit.Describe(), "exit code 3");
  EXPECT_EQ(rec.Output(1), (std::vector<std::string>{"hello", "to-stderr", "no newline"}));
  EXPECT_EQ(rec.Reports(1), (std::vector<std::string>{"ready", "step=1"}));
  // A child counts as live until its on_exit has returned, which may be just after WaitExit saw it,
  // and it is reaped only then.
  EXPECT_TRUE(supervisor.WaitUntilIdle(absl::Seconds(10)));
  EXPECT_EQ(supervisor.live_children(), 0);
  EXPECT_TRUE(FullyGone(*pid));
  std::ifstream in(log);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "hello\nto-stderr\nno newline");
  unlink(log.c_str());
}

TEST(RankSupervisorTest, EnvironmentOverridesAndNoStdin) {
  Recorder rec;
  RankSupervisor supervisor(rec.Callbacks());
  setenv("DROPLESS_SUPERVISOR_TEST_KEEP", "kept", 1);
  ChildSpec spec = Shell(
      "echo \"$OPENBLAS_NUM_THREADS $CUDA_VISIBLE_DEVICES $DROPLESS_SUPERVISOR_TEST_KEEP\"; "
      "cat; echo stdin-done; "
      "if [ -e /proc/self/fd/3 ]; then echo fd3-open; else echo fd3-closed; fi");
  spec.env = {"OPENBLAS_NUM_THREADS=1", "CUDA_VISIBLE_DEVICES=5"};
  ASSERT_TRUE(supervisor.Start(7, spec).ok());
  ASSERT_TRUE(rec.WaitExit(7, absl::Seconds(10)));
  EXPECT_TRUE(rec.Exit(7).success());
  EXPECT_EQ(rec.Output(7), (std::vector<std::string>{"1 5 kept", "stdin-done", "fd3-closed"}));
}

TEST(RankSupervisorTest, ReportsTheKillingSignal) {
  Recorder rec;
  RankSupervisor supervisor(rec.Callbacks());
  ASSERT_TRUE(supervisor.Start(2, Shell("kill -SEGV $$")).ok());
  ASSERT_TRUE(rec.WaitExit(2, absl::Seconds(10)));
  ChildExit exit = rec.Exit(2);
  EXPECT_EQ(exit.signal, SIGSEGV);
  EXPECT_EQ(exit.shell_status(), 128 + SIGSEGV);
  EXPECT_NE(exit.Describe().find("signal 11"), std::string::npos);
}

TEST(RankSupervisorTest, StopTerminatesAPoliteChild) {
  Recorder rec;
  RankSupervisor supervisor(rec.Callbacks());
  absl::StatusOr<pid_t> pid = supervisor.Start(3, Shell("echo up; exec sleep 60"));
  ASSERT_TRUE(pid.ok());
  ASSERT_TRUE(rec.WaitOutput(3, "up", absl::Seconds(10)));
  const absl::Time stop = absl::Now();
  supervisor.Stop(3, absl::Seconds(30));
  ASSERT_TRUE(rec.WaitExit(3, absl::Seconds(10)));
  ChildExit exit = rec.Exit(3);
  EXPECT_EQ(exit.signal, SIGTERM);
  EXPECT_TRUE(exit.stop_requested);
  EXPECT_LT(rec.ExitTime(3) - stop, absl::Seconds(5));
  ASSERT_TRUE(supervisor.WaitUntilIdle(absl::Seconds(10)));
  EXPECT_TRUE(FullyGone(*pid));
}

TEST(RankSupervisorTest, StopKillsAChildIgnoringSigtermAfterTheGrace) {
  Recorder rec;
  RankSupervisor supervisor(rec.Callbacks());
  absl::StatusOr<pid_t> pid =
      supervisor.Start(4, Shell("trap '' TERM; echo trapped; while :; do sleep 0.05; done"));
  ASSERT_TRUE(pid.ok());
  ASSERT_TRUE(rec.WaitOutput(4, "trapped", absl::Seconds(10)));
  const absl::Time stop = absl::Now();
  supervisor.Stop(4, absl::Milliseconds(500));
  ASSERT_TRUE(rec.WaitExit(4, absl::Seconds(10)));
  const absl::Duration took = rec.ExitTime(4) - stop;
  EXPECT_GE(took, absl::Milliseconds(450));
  EXPECT_LT(took, absl::Seconds(6));
  EXPECT_EQ(rec.Exit(4).signal, SIGKILL);
  EXPECT_TRUE(rec.Exit(4).stop_requested);
  ASSERT_TRUE(supervisor.WaitUntilIdle(absl::Seconds(10)));
  EXPECT_TRUE(FullyGone(*pid));
}

TEST(RankSupervisorTest, StopReachesGrandchildren) {
  Recorder rec;
  RankSupervisor supervisor(rec.Callbacks());
  // The shell starts a background sleeper and reports its pid.
  ASSERT_TRUE(supervisor.Start(5, Shell("sleep 60 & echo child=$!; wait")).ok());
  std::string grandchild;
  for (int i = 0; i < 200 && grandchild.empty(); ++i) {
    for (const std::string& line : rec.Output(5)) {
      if (line.rfind("child=", 0) == 0) grandchild = line.substr(6);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_FALSE(grandchild.empty());
  const pid_t gpid = std::atoi(grandchild.c_str());
  supervisor.Stop(5, absl::Seconds(2));
  ASSERT_TRUE(rec.WaitExit(5, absl::Seconds(10)));
  // The grandchild is reparented (not ours to reap): dead means gone or a zombie of its new parent.
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = kill(gpid, 0) != 0 || ProcessState(gpid) == 'Z';
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(gone) << "grandchild " << gpid << " survived the stop";
}

TEST(RankSupervisorTest, ExecFailureIsAnErrorAndNoChildIsLeft) {
  Recorder rec;
  RankSupervisor supervisor(rec.Callbacks());
  ChildSpec spec;
  spec.path = "/nonexistent/dropless-worker";
  spec.argv = {"dropless-worker", "rank"};
  absl::StatusOr<pid_t> pid = supervisor.Start(6, spec);
  ASSERT_FALSE(pid.ok());
  EXPECT_NE(pid.status().message().find("/nonexistent/dropless-worker"), std::string::npos);
  EXPECT_NE(pid.status().message().find("No such file"), std::string::npos) << pid.status();
  EXPECT_EQ(supervisor.live_children(), 0);
  int status;
  EXPECT_EQ(waitpid(-1, &status, WNOHANG), -1);  // no child (and no zombie) of this process
  EXPECT_EQ(errno, ECHILD);
}

TEST(RankSupervisorTest, ManyChildrenAreAllReapedAndIdsCanBeReused) {
  Recorder rec;
  RankSupervisor supervisor(rec.Callbacks());
  std::vector<pid_t> pids;
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<pid_t> pid = supervisor.Start(100 + i, Shell(absl::StrCat("exit ", i % 4)));
    ASSERT_TRUE(pid.ok()) << pid.status();
    pids.push_back(*pid);
  }
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(rec.WaitExit(100 + i, absl::Seconds(10)));
    EXPECT_EQ(rec.Exit(100 + i).exit_code, i % 4);
  }
  EXPECT_TRUE(supervisor.WaitUntilIdle(absl::Seconds(5)));
  for (pid_t pid : pids) EXPECT_TRUE(FullyGone(pid)) << pid;
}

TEST(RankSupervisorTest, LongLinesAreSplit) {
  Recorder rec;
  RankSupervisor supervisor(rec.Callbacks());
  ASSERT_TRUE(supervisor.Start(9, Shell("head -c 40000 /dev/zero | tr '\\0' x; echo")).ok());
  ASSERT_TRUE(rec.WaitExit(9, absl::Seconds(10)));
  std::vector<std::string> lines = rec.Output(9);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].size(), RankSupervisor::kMaxLineBytes);
  EXPECT_EQ(lines[1].size(), RankSupervisor::kMaxLineBytes);
  EXPECT_EQ(lines[2].size(), 40000 - 2 * RankSupervisor::kMaxLineBytes);
}

TEST(RankSupervisorTest, LongLineArrivingInOneReadIsSplit) {
  Recorder rec;
  RankSupervisor supervisor(rec.Callbacks());
  // One write of 2 * kMaxLineBytes + 5 bytes and a newline, then "end".
  const size_t n = 2 * RankSupervisor::kMaxLineBytes + 5;
  ASSERT_TRUE(supervisor
                  .Start(10, Shell(absl::StrCat("x=$(head -c ", n,
                                                " /dev/zero | tr '\\0' y); printf '%s\\nend\\n' \"$x\"")))
                  .ok());
  ASSERT_TRUE(rec.WaitExit(10, absl::Seconds(10)));
  std::vector<std::string> lines = rec.Output(10);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], std::string(RankSupervisor::kMaxLineBytes, 'y'));
  EXPECT_EQ(lines[1], std::string(RankSupervisor::kMaxLineBytes, 'y'));
  EXPECT_EQ(lines[2], "yyyyy");
  EXPECT_EQ(lines[3], "end");
}

// A split at the limit never cuts a UTF-8 character: each part is valid UTF-8 on its own (a cut
// one would make the LogBatch carrying it unparseable for the coordinator).
TEST(RankSupervisorTest, LongLinesAreSplitBetweenUtf8Characters) {
  Recorder rec;
  RankSupervisor supervisor(rec.Callbacks());
  // "x" and 20000 two-byte characters: the limit falls inside one.
  ASSERT_TRUE(
      supervisor.Start(12, Shell("printf x; yes \xc3\xa9 | head -n 20000 | tr -d '\\n'; echo"))
          .ok());
  ASSERT_TRUE(rec.WaitExit(12, absl::Seconds(10)));
  std::vector<std::string> lines = rec.Output(12);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].size(), RankSupervisor::kMaxLineBytes - 1);
  std::string joined;
  for (const std::string& line : lines) {
    EXPECT_TRUE(IsValidUtf8(line));
    joined += line;
  }
  EXPECT_EQ(joined.size(), 40001u);
}

TEST(RankSupervisorTest, LineOfExactlyTheLimitHasNoEmptyTail) {
  Recorder rec;
  RankSupervisor supervisor(rec.Callbacks());
  const size_t n = 2 * RankSupervisor::kMaxLineBytes;
  ASSERT_TRUE(supervisor
                  .Start(11, Shell(absl::StrCat("x=$(head -c ", n,
                                                " /dev/zero | tr '\\0' z); printf '%s\\nend\\n' \"$x\"")))
                  .ok());
  ASSERT_TRUE(rec.WaitExit(11, absl::Seconds(10)));
  std::vector<std::string> lines = rec.Output(11);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[2], "end");
}

// The daemon stops its ranks with StopAll + WaitUntilIdle and then flushes their final statuses:
// idle must mean every on_exit has returned, or a status pushed late would be missed.
TEST(RankSupervisorTest, IdleOnlyAfterEveryExitCallbackReturned) {
  absl::Mutex mu;
  int exits_done = 0;
  RankSupervisor::Callbacks cb;
  cb.on_exit = [&](RankSupervisor::ChildId, const ChildExit&) {
    absl::SleepFor(absl::Milliseconds(300));  // a slow consumer of the exit
    absl::MutexLock lock(&mu);
    ++exits_done;
  };
  RankSupervisor supervisor(std::move(cb));
  ASSERT_TRUE(supervisor.Start(12, Shell("exec sleep 60")).ok());
  ASSERT_TRUE(supervisor.Start(13, Shell("exec sleep 60")).ok());
  supervisor.StopAll(absl::Seconds(5));
  ASSERT_TRUE(supervisor.WaitUntilIdle(absl::Seconds(30)));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(exits_done, 2);
}

// The daemon journals a rank's end in on_exit. The child stays a zombie until that returned, so
// whoever sees the process gone (a test, an operator, a restarted daemon) knows its end is stored:
// a daemon killed after the reap can never have lost it.
TEST(RankSupervisorTest, ChildIsReapedOnlyAfterItsExitCallbackReturned) {
  absl::Mutex mu;
  pid_t pid = 0;
  char state_in_callback = 0;
  RankSupervisor::Callbacks cb;
  cb.on_exit = [&](RankSupervisor::ChildId, const ChildExit& exit) {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(exit.exit_code, 5);
    state_in_callback = ProcessState(pid);
  };
  RankSupervisor supervisor(std::move(cb));
  {
    absl::MutexLock lock(&mu);  // the child cannot be reaped before pid is known
    absl::StatusOr<pid_t> started = supervisor.Start(14, Shell("exit 5"));
    ASSERT_TRUE(started.ok()) << started.status();
    pid = *started;
  }
  ASSERT_TRUE(supervisor.WaitUntilIdle(absl::Seconds(10)));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(state_in_callback, 'Z') << "the child was reaped before its exit was handed over";
  EXPECT_TRUE(FullyGone(pid));
}

TEST(RankSupervisorTest, DestructorKillsAndReapsLiveChildren) {
  Recorder rec;
  pid_t pid;
  {
    RankSupervisor supervisor(rec.Callbacks());
    absl::StatusOr<pid_t> started = supervisor.Start(8, Shell("trap '' TERM; exec sleep 60"));
    ASSERT_TRUE(started.ok());
    pid = *started;
  }
  EXPECT_TRUE(rec.WaitExit(8, absl::ZeroDuration()));
  EXPECT_TRUE(FullyGone(pid));
}

// A child that cannot be reaped after its SIGKILL (in uninterruptible sleep in a GPU driver or on a
// hard-mounted volume) must not hang the daemon's shutdown: the destructor gives up on it after
// its reap timeout, without an on_exit. Stood in for by a child whose end the supervisor cannot
// see: another process traces it, and a traced child's zombie is its tracer's alone until the
// tracer waits for it or goes.
// A process that traces `pid` (PTRACE_SEIZE) until SIGKILLed, making `pid` unreapable for this
// one; -1 when ptrace is not permitted here.
pid_t TraceFromAnotherProcess(pid_t pid) {
  int attached[2];
  if (pipe(attached) != 0) return -1;
  const pid_t tracer = fork();
  if (tracer < 0) return -1;
  if (tracer == 0) {
    const char ok = ptrace(PTRACE_SEIZE, pid, nullptr, nullptr) == 0 ? 1 : 0;
    if (write(attached[1], &ok, 1) != 1) _exit(1);
    while (true) pause();
  }
  close(attached[1]);
  char ok = 0;
  const bool heard = read(attached[0], &ok, 1) == 1;
  close(attached[0]);
  if (!heard || ok == 0) {
    kill(tracer, SIGKILL);
    waitpid(tracer, nullptr, 0);
    return -1;
  }
  return tracer;
}

TEST(RankSupervisorTest, DestructorGivesUpOnAChildThatCannotBeReaped) {
  Recorder rec;
  auto supervisor = std::make_unique<RankSupervisor>(rec.Callbacks(), absl::Milliseconds(300));
  absl::StatusOr<pid_t> started = supervisor->Start(9, Shell("exec sleep 60"));
  ASSERT_TRUE(started.ok()) << started.status();
  const pid_t pid = *started;
  const pid_t tracer = TraceFromAnotherProcess(pid);
  if (tracer < 0) GTEST_SKIP() << "ptrace is not permitted here";

  // Destroyed on another thread, so that a regression fails here instead of hanging.
  absl::Notification destroyed;
  const absl::Time start = absl::Now();
  std::thread destroyer([&] {
    supervisor.reset();
    destroyed.Notify();
  });
  const bool in_time = destroyed.WaitForNotificationWithTimeout(absl::Seconds(10));
  const absl::Duration took = absl::Now() - start;
  const char state = ProcessState(pid);
  kill(tracer, SIGKILL);  // releases the zombie to its real parent, this process
  waitpid(tracer, nullptr, 0);
  destroyer.join();
  EXPECT_TRUE(in_time) << "the destructor waited for a child that cannot be reaped";
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_EQ(state, 'Z') << "the child did not get its SIGKILL";
  EXPECT_FALSE(rec.WaitExit(9, absl::ZeroDuration())) << "an end was reported for it";
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);  // left to this process: nobody else reaped it
}

// A stop escalated (a second stop signal to the daemon): KillAll SIGKILLs a child that ignores
// SIGTERM at once, however long the grace its Stop gave it.
TEST(RankSupervisorTest, KillAllKillsAStoppingChildWithoutWaitingForItsGrace) {
  Recorder rec;
  RankSupervisor supervisor(rec.Callbacks());
  absl::StatusOr<pid_t> pid =
      supervisor.Start(5, Shell("trap '' TERM; echo trapped; while :; do sleep 0.05; done"));
  ASSERT_TRUE(pid.ok());
  ASSERT_TRUE(rec.WaitOutput(5, "trapped", absl::Seconds(10)));
  supervisor.StopAll(absl::Seconds(60));
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(rec.WaitExit(5, absl::ZeroDuration())) << "SIGTERM is trapped";
  const absl::Time kill = absl::Now();
  supervisor.KillAll(absl::Seconds(1));
  ASSERT_TRUE(rec.WaitExit(5, absl::Seconds(10)));
  EXPECT_LT(rec.ExitTime(5) - kill, absl::Seconds(3));
  EXPECT_EQ(rec.Exit(5).signal, SIGKILL);
  EXPECT_TRUE(rec.Exit(5).stop_requested);
  ASSERT_TRUE(supervisor.WaitUntilIdle(absl::Seconds(10)));
  EXPECT_TRUE(FullyGone(*pid));
}

// After KillAll(reap_timeout) the destructor gives up on a child it cannot reap within
// reap_timeout, not its (here long) shutdown reap timeout.
TEST(RankSupervisorTest, KillAllShortensTheDestructorsWaitForAChildThatCannotBeReaped) {
  Recorder rec;
  auto supervisor = std::make_unique<RankSupervisor>(rec.Callbacks(), absl::Seconds(60));
  absl::StatusOr<pid_t> started = supervisor->Start(9, Shell("exec sleep 60"));
  ASSERT_TRUE(started.ok()) << started.status();
  const pid_t pid = *started;
  const pid_t tracer = TraceFromAnotherProcess(pid);
  if (tracer < 0) GTEST_SKIP() << "ptrace is not permitted here";
  supervisor->KillAll(absl::Milliseconds(300));
  absl::Notification destroyed;
  const absl::Time start = absl::Now();
  std::thread destroyer([&] {
    supervisor.reset();
    destroyed.Notify();
  });
  const bool in_time = destroyed.WaitForNotificationWithTimeout(absl::Seconds(10));
  const char state = ProcessState(pid);
  kill(tracer, SIGKILL);  // releases the zombie to its real parent, this process
  waitpid(tracer, nullptr, 0);
  destroyer.join();
  EXPECT_TRUE(in_time) << "the destructor waited its 60 s reap timeout";
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(state, 'Z') << "the child did not get its SIGKILL";
  EXPECT_FALSE(rec.WaitExit(9, absl::ZeroDuration())) << "an end was reported for it";
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
}

}  // namespace
}  // namespace dropless
