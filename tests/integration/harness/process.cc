#include "tests/integration/harness/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dropless::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<char*> CArgv(std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (auto& a : argv) out.push_back(a.data());
  out.push_back(nullptr);
  return out;
}

int DecodeWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// Forks and execs argv with stdin/stdout/stderr redirected to the given fds.
pid_t Spawn(std::vector<std::string> argv, const std::map<std::string, std::string>& env,
            int in_fd, int out_fd, int err_fd) {
  auto cargv = CArgv(argv);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid != 0) return pid;
  // Child: new process group so that a test's kill reaches nothing else, and killed when the test
  // process dies (a crashed test must not leave coordinators and workers behind).
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  if (in_fd >= 0) dup2(in_fd, 0);
  dup2(out_fd, 1);
  dup2(err_fd, 2);
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  execvp(cargv[0], cargv.data());
  std::fprintf(stderr, "exec %s: %s\n", cargv[0], std::strerror(errno));
  _exit(127);
}

}  // namespace

int PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

absl::StatusOr<std::unique_ptr<Process>> Process::Start(std::vector<std::string> argv,
                                                        std::map<std::string, std::string> env) {
  if (argv.empty()) return absl::InvalidArgumentError("argv: empty");
  std::string path = MakeTempDir() + "/output.log";
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t pid = Spawn(argv, env, devnull, fd, fd);
  close(fd);
  if (devnull >= 0) close(devnull);
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  return std::unique_ptr<Process>(new Process(pid, path));
}

Process::~Process() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
}

bool Process::Running() {
  if (reaped_) return false;
  int status;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    exit_code_ = DecodeWaitStatus(status);
    return false;
  }
  return r == 0;
}

absl::Status Process::Signal(int sig) {
  if (!Running()) return absl::FailedPreconditionError("process already exited");
  if (kill(pid_, sig) != 0) return absl::InternalError(std::strerror(errno));
  return absl::OkStatus();
}

absl::StatusOr<int> Process::Wait(absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (Running()) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("pid ", pid_, " still running"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return exit_code_;
}

std::string Process::Output() const { return ReadFile(output_path_); }

CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout,
                         const std::string& stdin_data) {
  CommandResult result;
  std::string dir = MakeTempDir();
  std::string in_path = dir + "/stdin", out_path = dir + "/stdout", err_path = dir + "/stderr";
  {
    std::ofstream in(in_path, std::ios::binary);
    in << stdin_data;
  }
  int in_fd = open(in_path.c_str(), O_RDONLY | O_CLOEXEC);
  int out_fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int err_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (in_fd < 0 || out_fd < 0 || err_fd < 0) return result;
  pid_t pid = Spawn(argv, {}, in_fd, out_fd, err_fd);
  close(in_fd);
  close(out_fd);
  close(err_fd);
  if (pid < 0) return result;
  absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (true) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  result.exit_code = DecodeWaitStatus(status);
  result.out = ReadFile(out_path);
  result.err = ReadFile(err_path);
  return result;
}

std::string BinaryPath(const std::string& name) {
  if (const char* dir = std::getenv("DROPLESS_BIN_DIR")) return absl::StrCat(dir, "/", name);
  return absl::StrCat(DROPLESS_BIN_DIR, "/", name);
}

std::string SourcePath(const std::string& relative) {
  return absl::StrCat(DROPLESS_SOURCE_DIR, "/", relative);
}

bool WaitForTcpPort(int port, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (ok) return true;
    absl::SleepFor(absl::Milliseconds(25));
  }
  return false;
}

std::string MakeTempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = absl::StrCat(base && *base ? base : "/tmp", "/dropless-test-XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) return "/tmp";
  return tmpl;
}

std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, static_cast<size_t>(n));
  close(fd);
  size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos || response.rfind("HTTP/1.", 0) != 0) return "";
  if (response.find(" 200 ") == std::string::npos) return "";
  return response.substr(body + 4);
}

}  // namespace dropless::testing
