#include "worker/daemon/rank_supervisor.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "common/log.h"
#include "common/utf8.h"
#include "worker/daemon/rank_log_file.h"

extern char** environ;

namespace dropless {
namespace {

// How often live children are polled with waitpid when no output arrives.
constexpr int kPollIntervalMs = 20;
// Pipe ends handed to a child are moved to fds >= this so dup2 onto 0..3 never clobbers them.
constexpr int kFirstHighFd = 10;

absl::Status ErrnoError(absl::string_view what, int err) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(err)));
}

void CloseFd(int& fd) {
  if (fd >= 0) {
    while (close(fd) != 0 && errno == EINTR) {
    }
    fd = -1;
  }
}

// fd moved to a close-on-exec descriptor >= kFirstHighFd (the original is closed).
absl::StatusOr<int> MoveHigh(int fd) {
  int high = fcntl(fd, F_DUPFD_CLOEXEC, kFirstHighFd);
  int err = errno;
  close(fd);
  if (high < 0) return ErrnoError("fcntl(F_DUPFD_CLOEXEC)", err);
  return high;
}

struct Pipe {
  int read = -1;
  int write = -1;
};

absl::StatusOr<Pipe> MakePipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoError("pipe2", errno);
  Pipe p;
  absl::StatusOr<int> r = MoveHigh(fds[0]);
  absl::StatusOr<int> w = MoveHigh(fds[1]);
  if (!r.ok() || !w.ok()) {
    if (r.ok()) close(*r);
    if (w.ok()) close(*w);
    return r.ok() ? w.status() : r.status();
  }
  p.read = *r;
  p.write = *w;
  return p;
}

// The daemon's environment with `overrides` ("KEY=VALUE") replacing or adding entries.
std::vector<std::string> MergedEnvironment(const std::vector<std::string>& overrides) {
  std::map<std::string, std::string> by_key;
  std::vector<std::string> order;
  auto put = [&](const std::string& entry) {
    std::string key = entry.substr(0, entry.find('='));
    if (by_key.count(key) == 0) order.push_back(key);
    by_key[key] = entry;
  };
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) put(*e);
  for (const std::string& entry : overrides) put(entry);
  std::vector<std::string> env;
  env.reserve(order.size());
  for (const std::string& key : order) env.push_back(by_key[key]);
  return env;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Runs in the forked child: async-signal-safe calls only. Never returns.
[[noreturn]] void ExecChild(const char* path, char* const argv[], char* const envp[], int devnull,
                            int out_write, int report_write, int error_write, pid_t parent) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the daemon died between fork and prctl
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);  // fails harmlessly for some
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (dup2(devnull, 0) < 0 || dup2(out_write, 1) < 0 || dup2(out_write, 2) < 0 ||
      (report_write >= 0 && dup2(report_write, 3) < 0)) {
    int err = errno;
    ssize_t ignored = write(error_write, &err, sizeof(err));
    (void)ignored;
    _exit(127);
  }
#ifdef SYS_close_range
  // Everything of the daemon above the child's fds closes at exec (most is O_CLOEXEC already).
  syscall(SYS_close_range, report_write >= 0 ? 4u : 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */);
#endif
  execve(path, argv, envp);
  int err = errno;
  ssize_t ignored = write(error_write, &err, sizeof(err));
  (void)ignored;
  _exit(127);
}

}  // namespace

std::string ChildExit::Describe() const {
  if (signal != 0) {
    const char* name = strsignal(signal);
    return absl::StrCat("signal ", signal, " (", name != nullptr ? name : "unknown", ")");
  }
  return absl::StrCat("exit code ", exit_code);
}

struct RankSupervisor::StartRequest {
  ChildId id;
  const ChildSpec* spec;
  absl::StatusOr<pid_t> result;
  absl::Notification done;
};

struct RankSupervisor::Child {
  ChildId id = 0;
  pid_t pid = -1;
  int out_fd = -1;
  int report_fd = -1;
  std::unique_ptr<RankLogFile> log;  // null: no log file
  LineBuffer out_lines;
  LineBuffer report_lines;
  bool stop_requested = false;
  bool killed = false;  // SIGKILL sent
  absl::Time kill_at = absl::InfiniteFuture();
};

RankSupervisor::RankSupervisor(Callbacks callbacks, absl::Duration shutdown_reap_timeout)
    : callbacks_(std::move(callbacks)), shutdown_reap_timeout_(shutdown_reap_timeout) {
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    // Without a wake fd the loop still works, polling every kPollIntervalMs.
    LogWarning(absl::StrCat("rank supervisor: eventfd: ", strerror(errno)));
  }
  thread_ = std::thread([this] { Loop(); });
}

RankSupervisor::~RankSupervisor() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    // The stop below SIGKILLs at once; a child still there this long after it will not go.
    shutdown_deadline_ = std::min(shutdown_deadline_, absl::Now() + shutdown_reap_timeout_);
    stops_.push_back(StopRequest{true, 0, absl::ZeroDuration()});
  }
  Wake();
  thread_.join();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void RankSupervisor::Wake() {
  if (wake_fd_ < 0) return;
  uint64_t one = 1;
  ssize_t n = write(wake_fd_, &one, sizeof(one));
  (void)n;  // EAGAIN means a wake-up is already pending
}

absl::StatusOr<pid_t> RankSupervisor::Start(ChildId id, const ChildSpec& spec) {
  if (spec.path.empty() || spec.argv.empty()) {
    return absl::InvalidArgumentError("child spec: path and argv must not be empty");
  }
  StartRequest request{id, &spec, absl::UnknownError("not started"), {}};
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::FailedPreconditionError("rank supervisor is shutting down");
    starts_.push_back(&request);
  }
  Wake();
  request.done.WaitForNotification();
  return request.result;
}

void RankSupervisor::Stop(ChildId id, absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    stops_.push_back(StopRequest{false, id, grace});
  }
  Wake();
}

void RankSupervisor::StopAll(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    stops_.push_back(StopRequest{true, 0, grace});
  }
  Wake();
}

void RankSupervisor::KillAll(absl::Duration reap_timeout) {
  {
    absl::MutexLock lock(&mu_);
    shutdown_reap_timeout_ = std::min(shutdown_reap_timeout_, reap_timeout);
    // Already in the destructor: its wait for unreapable children ends this soon at the latest.
    if (shutting_down_) {
      shutdown_deadline_ = std::min(shutdown_deadline_, absl::Now() + reap_timeout);
    }
    stops_.push_back(StopRequest{true, 0, absl::ZeroDuration()});
  }
  Wake();
}

int RankSupervisor::live_children() const {
  absl::MutexLock lock(&mu_);
  return live_;
}

bool RankSupervisor::WaitUntilIdle(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return live_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void RankSupervisor::HandleStart(StartRequest* request) {
  const ChildSpec& spec = *request->spec;
  auto fail = [&](absl::Status status) {
    request->result = std::move(status);
    request->done.Notify();
  };
  for (const Child& c : children_) {
    if (c.id == request->id) return fail(absl::AlreadyExistsError(
                                  absl::StrCat("child id ", request->id, " is still running")));
  }
  absl::StatusOr<Pipe> out = MakePipe();
  if (!out.ok()) return fail(out.status());
  Pipe report;
  if (spec.report_pipe) {
    absl::StatusOr<Pipe> p = MakePipe();
    if (!p.ok()) {
      CloseFd(out->read), CloseFd(out->write);
      return fail(p.status());
    }
    report = *p;
  }
  absl::StatusOr<Pipe> exec_error = MakePipe();
  int devnull_raw = open("/dev/null", O_RDONLY | O_CLOEXEC);
  absl::StatusOr<int> devnull = devnull_raw >= 0 ? MoveHigh(devnull_raw)
                                                 : absl::StatusOr<int>(ErrnoError("open /dev/null", errno));
  absl::StatusOr<std::unique_ptr<RankLogFile>> log = std::unique_ptr<RankLogFile>();
  if (!spec.log_path.empty()) {
    log = RankLogFile::Open(spec.log_path,
                            spec.log_max_bytes);
  }
  auto close_all = [&]() {
    CloseFd(out->read), CloseFd(out->write), CloseFd(report.read), CloseFd(report.write);
    if (exec_error.ok()) CloseFd(exec_error->read), CloseFd(exec_error->write);
    if (devnull.ok()) CloseFd(*devnull);
  };
  if (!exec_error.ok() || !devnull.ok() || !log.ok()) {
    absl::Status st = !exec_error.ok() ? exec_error.status()
                      : !devnull.ok()  ? devnull.status()
                                       : log.status();
    close_all();
    return fail(st);
  }

  // Everything the child touches is built before fork: it may only make async-signal-safe calls.
  std::vector<std::string> argv_strings = spec.argv;
  std::vector<std::string> env_strings = MergedEnvironment(spec.env);
  std::vector<char*> argv = CStrings(argv_strings);
  std::vector<char*> envp = CStrings(env_strings);
  const pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) {
    absl::Status st = ErrnoError("fork", errno);
    close_all();
    return fail(st);
  }
  if (pid == 0) {
    ExecChild(spec.path.c_str(), argv.data(), envp.data(), *devnull, out->write, report.write,
              exec_error->write, parent);
  }
  setpgid(pid, pid);  // also done by the child; whichever runs first wins, the other may fail
  CloseFd(out->write);
  CloseFd(report.write);
  CloseFd(exec_error->write);
  CloseFd(*devnull);

  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(exec_error->read, &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  CloseFd(exec_error->read);
  if (n > 0) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    CloseFd(out->read), CloseFd(report.read);
    return fail(ErrnoError(absl::StrCat("exec ", spec.path), exec_errno));
  }

  fcntl(out->read, F_SETFL, O_NONBLOCK);
  if (report.read >= 0) fcntl(report.read, F_SETFL, O_NONBLOCK);
  Child child;
  child.id = request->id;
  child.pid = pid;
  child.out_fd = out->read;
  child.report_fd = report.read;
  child.log = *std::move(log);
  children_.push_back(std::move(child));
  {
    absl::MutexLock lock(&mu_);
    ++live_;
  }
  request->result = pid;
  request->done.Notify();
}

void RankSupervisor::HandleStop(const StopRequest& stop) {
  const absl::Time now = absl::Now();
  for (Child& c : children_) {
    if (!stop.all && c.id != stop.id) continue;
    absl::Time deadline = now + stop.grace;
    if (c.stop_requested && c.kill_at <= deadline) continue;
    if (!c.stop_requested) {
      c.stop_requested = true;
      if (kill(-c.pid, SIGTERM) != 0) kill(c.pid, SIGTERM);
    }
    c.kill_at = deadline;
  }
}

void RankSupervisor::EmitLines(ChildId id, LineBuffer* lines, bool report, bool flush_partial) {
  const auto& callback = report ? callbacks_.on_report : callbacks_.on_output;
  std::string* buffer = &lines->text;
  size_t start = 0;
  // A newline right after a line that was split at the limit ends that line, not an empty one.
  if (lines->split_at_limit && !buffer->empty()) {
    lines->split_at_limit = false;
    if ((*buffer)[0] == '\n') start = 1;
  }
  while (start < buffer->size()) {
    size_t newline = buffer->find('\n', start);
    size_t end;       // end of the line emitted
    size_t next;      // where the next line starts
    if (newline != std::string::npos && newline - start <= kMaxLineBytes) {
      end = newline;
      next = newline + 1;
    } else if (buffer->size() - start >= kMaxLineBytes) {
      // Too long: split, but never inside a UTF-8 character.
      end = next = start + Utf8PrefixLength(absl::string_view(*buffer).substr(start),
                                            kMaxLineBytes);
      if (next < buffer->size() && (*buffer)[next] == '\n') {
        ++next;
      } else if (next == buffer->size()) {
        lines->split_at_limit = true;
      }
    } else if (flush_partial) {
      end = next = buffer->size();
    } else {
      break;
    }
    absl::string_view line(buffer->data() + start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (callback) callback(id, line);
    start = next;
  }
  buffer->erase(0, start);
}

void RankSupervisor::ReadOutput(Child& child, bool drain) {
  char chunk[64 * 1024];
  for (int* fd : {&child.out_fd, &child.report_fd}) {
    const bool report = fd == &child.report_fd;
    LineBuffer* buffer = report ? &child.report_lines : &child.out_lines;
    // One chunk per pass keeps a chatty child from starving the others, unless draining at exit.
    for (int chunks = 0; *fd >= 0 && (drain || chunks < 1); ++chunks) {
      ssize_t n = read(*fd, chunk, sizeof(chunk));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n <= 0) {  // EOF or error: the child closed its end
        CloseFd(*fd);
        break;
      }
      // Never fails nor waits on anything but the local file: a full disk drops log bytes only.
      if (!report && child.log != nullptr) child.log->Append(absl::string_view(chunk, n));
      buffer->text.append(chunk, n);
      EmitLines(child.id, buffer, report, /*flush_partial=*/false);
    }
  }
}

void RankSupervisor::Reap() {
  for (size_t i = 0; i < children_.size();) {
    Child& c = children_[i];
    // Look without reaping first: while the zombie exists its pid (and process group id) cannot
    // be reused, so the group can still be cleared of leftovers safely.
    siginfo_t info;
    memset(&info, 0, sizeof(info));
    int r = waitid(P_PID, c.pid, &info, WEXITED | WNOHANG | WNOWAIT);
    if ((r < 0 && errno == EINTR) || (r == 0 && info.si_pid == 0)) {
      ++i;
      continue;
    }
    ChildExit exit;
    exit.stop_requested = c.stop_requested;
    const bool zombie = r == 0;
    if (!zombie) {
      exit.exit_code = 127;  // ECHILD: reaped by someone else; treat as a failure
    } else {
      kill(-c.pid, SIGKILL);  // grandchildren left in its process group
      if (info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED) {
        exit.signal = info.si_status;
      } else {
        exit.exit_code = info.si_status;
      }
    }
    // Whatever the child wrote before it ended is delivered before its exit. A grandchild that
    // still holds the pipe open does not block this: the reads are non-blocking.
    ReadOutput(c, /*drain=*/true);
    EmitLines(c.id, &c.out_lines, false, /*flush_partial=*/true);
    EmitLines(c.id, &c.report_lines, true, /*flush_partial=*/true);
    CloseFd(c.out_fd);
    CloseFd(c.report_fd);
    c.log.reset();
    const ChildId id = c.id;
    const pid_t pid = c.pid;
    children_.erase(children_.begin() + i);
    // The child counts as live until its on_exit returned: WaitUntilIdle callers (the daemon's
    // stop path) rely on every final status having been handed over by then.
    if (callbacks_.on_exit) callbacks_.on_exit(id, exit);
    // Reaped only now that on_exit has handed its status over (to the outbound journal): until
    // then the zombie keeps the end visible, so a daemon killed in between loses no end that
    // anyone could have seen, and a restarted daemon is never told less than the process table.
    if (zombie) {
      int status = 0;
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    {
      absl::MutexLock lock(&mu_);
      --live_;
    }
  }
}

void RankSupervisor::EnforceDeadlines() {
  const absl::Time now = absl::Now();
  for (Child& c : children_) {
    if (c.stop_requested && !c.killed && now >= c.kill_at) {
      c.killed = true;
      if (kill(-c.pid, SIGKILL) != 0) kill(c.pid, SIGKILL);
    }
  }
}

bool RankSupervisor::AbandonUnreapedChildren(absl::Time deadline) {
  if (children_.empty() || absl::Now() < deadline) return false;
  std::vector<std::string> pids;
  for (Child& c : children_) {
    pids.push_back(absl::StrCat(c.pid));
    CloseFd(c.out_fd);
    CloseFd(c.report_fd);
    c.log.reset();
  }
  LogError(absl::StrCat(
      "rank supervisor: ", children_.size(),
      " rank process(es) not reaped in time after SIGKILL (pid ", absl::StrJoin(pids, ", "),
      "): stuck in uninterruptible sleep (a GPU driver, a hung mount?); left behind, their end "
      "unreported"));
  {
    absl::MutexLock lock(&mu_);
    live_ -= static_cast<int>(children_.size());
  }
  children_.clear();
  return true;
}

void RankSupervisor::Loop() {
  while (true) {
    std::deque<StartRequest*> starts;
    std::deque<StopRequest> stops;
    bool shutting_down;
    absl::Time shutdown_deadline;
    {
      absl::MutexLock lock(&mu_);
      starts.swap(starts_);
      stops.swap(stops_);
      shutting_down = shutting_down_;
      shutdown_deadline = shutdown_deadline_;
    }
    for (StartRequest* s : starts) {
      if (!shutting_down) {
        HandleStart(s);
        continue;
      }
      // Queued before the destructor began: its stop of every child would miss this one.
      s->result = absl::FailedPreconditionError("rank supervisor is shutting down");
      s->done.Notify();
    }
    for (const StopRequest& s : stops) HandleStop(s);
    EnforceDeadlines();
    Reap();
    if (shutting_down && (children_.empty() || AbandonUnreapedChildren(shutdown_deadline))) {
      absl::MutexLock lock(&mu_);
      if (starts_.empty()) break;
      continue;
    }

    std::vector<pollfd> fds;
    std::vector<Child*> owners;
    if (wake_fd_ >= 0) fds.push_back({wake_fd_, POLLIN, 0}), owners.push_back(nullptr);
    for (Child& c : children_) {
      if (c.out_fd >= 0) fds.push_back({c.out_fd, POLLIN, 0}), owners.push_back(&c);
      if (c.report_fd >= 0) fds.push_back({c.report_fd, POLLIN, 0}), owners.push_back(&c);
    }
    const int timeout = (children_.empty() && wake_fd_ >= 0) ? -1 : kPollIntervalMs;
    int ready = poll(fds.data(), fds.size(), timeout);
    if (ready <= 0) continue;
    Child* last = nullptr;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      if (owners[i] == nullptr) {
        uint64_t count;
        ssize_t n = read(wake_fd_, &count, sizeof(count));
        (void)n;
      } else if (owners[i] != last) {
        last = owners[i];
        ReadOutput(*owners[i], /*drain=*/false);
      }
    }
  }
  // Shutting down: nothing is left to wake.
  absl::MutexLock lock(&mu_);
  for (StartRequest* s : starts_) {
    s->result = absl::FailedPreconditionError("rank supervisor is shutting down");
    s->done.Notify();
  }
  starts_.clear();
}

}  // namespace dropless
