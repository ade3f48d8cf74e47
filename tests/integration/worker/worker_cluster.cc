#include "tests/integration/worker/worker_cluster.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"

namespace dropless::testing {
namespace {

namespace v1 = dropless::v1;

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

WorkerCluster::WorkerCluster() : dir_(MakeTempDir()), port_(PickFreePort()) {
  auto channel = grpc::CreateChannel(coordinator_address(), grpc::InsecureChannelCredentials());
  stub_ = v1::JobService::NewStub(channel);
}

WorkerCluster::~WorkerCluster() {
  // Workers first (SIGTERM: they stop their ranks), then the coordinator.
  for (auto& [node, w] : workers_) {
    if (w.process && w.process->Running()) {
      (void)w.process->Signal(SIGTERM);
      (void)w.process->Wait(absl::Seconds(10));
    }
  }
  workers_.clear();
  coordinator_.reset();
}

std::string WorkerCluster::coordinator_address() const { return absl::StrCat("127.0.0.1:", port_); }

absl::Status WorkerCluster::StartCoordinator(const std::vector<std::string>& extra_flags) {
  if (coordinator_) old_coordinator_output_.push_back(coordinator_->Output());
  std::vector<std::string> argv = {
      BinaryPath("dropless-coordinator"),
      "--insecure",
      absl::StrCat("--listen=", coordinator_address()),
      absl::StrCat("--db=", dir_, "/coordinator.db"),
      "--metrics-port=0",
      "--heartbeat-interval-ms=200",
      absl::StrCat("--lease-timeout-ms=", absl::ToInt64Milliseconds(lease_)),
  };
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(argv);
  if (!p.ok()) return p.status();
  coordinator_ = std::move(*p);
  if (!WaitForTcpPort(port_, absl::Seconds(30))) {
    return absl::DeadlineExceededError(
        absl::StrCat("coordinator did not listen on ", port_, ":\n", coordinator_->Output()));
  }
  return absl::OkStatus();
}

void WorkerCluster::KillCoordinator() {
  if (!coordinator_) return;
  (void)coordinator_->Signal(SIGKILL);
  (void)coordinator_->Wait(absl::Seconds(10));
}

absl::Status WorkerCluster::StartWorker(const std::string& node,
                                        const std::map<std::string, std::string>& env,
                                        const std::vector<std::string>& extra_flags) {
  Worker w;
  w.metrics_port = PickFreePort();
  std::vector<std::string> argv = {
      BinaryPath("dropless-worker"),
      "--insecure",
      absl::StrCat("--coordinator=", coordinator_address()),
      absl::StrCat("--node=", node),
      "--cpu-slots=1",
      absl::StrCat("--metrics-port=", w.metrics_port),
      "--metrics-address=127.0.0.1",
      absl::StrCat("--work-dir=", worker_dir(node)),
      "--kill-grace-ms=2000",
  };
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(argv, env);
  if (!p.ok()) return p.status();
  w.process = std::move(*p);
  workers_[node] = std::move(w);
  if (!WaitForTcpPort(workers_[node].metrics_port, absl::Seconds(30))) {
    return absl::DeadlineExceededError(absl::StrCat("worker ", node, " did not serve /metrics:\n",
                                                    workers_[node].process->Output()));
  }
  return absl::OkStatus();
}

std::optional<v1::Worker> WorkerCluster::WaitForWorker(
    const std::string& node, const std::function<bool(const v1::Worker&)>& accept,
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::ListWorkersResponse response;
    if (stub_->ListWorkers(&ctx, v1::ListWorkersRequest(), &response).ok()) {
      for (const v1::Worker& w : response.workers()) {
        if (w.node() == node && accept(w)) return w;
      }
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return std::nullopt;
}

absl::StatusOr<v1::Job> WorkerCluster::Submit(const std::string& spec_yaml) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::SubmitJobRequest request;
  request.set_spec_yaml(spec_yaml);
  v1::Job job;
  absl::Status st = FromGrpc(stub_->SubmitJob(&ctx, request, &job), "SubmitJob");
  if (!st.ok()) return st;
  return job;
}

absl::StatusOr<v1::Job> WorkerCluster::Get(const std::string& job_id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::GetJobRequest request;
  request.set_id(job_id);
  v1::Job job;
  absl::Status st = FromGrpc(stub_->GetJob(&ctx, request, &job), "GetJob");
  if (!st.ok()) return st;
  return job;
}

absl::StatusOr<v1::Job> WorkerCluster::Cancel(const std::string& job_id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::CancelJobRequest request;
  request.set_id(job_id);
  request.set_reason("integration test");
  v1::Job job;
  absl::Status st = FromGrpc(stub_->CancelJob(&ctx, request, &job), "CancelJob");
  if (!st.ok()) return st;
  return job;
}

absl::StatusOr<v1::Job> WorkerCluster::WaitForState(const std::string& job_id,
                                                    std::vector<v1::JobState> states,
                                                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<v1::Job> job = absl::UnavailableError("never asked");
  while (absl::Now() < deadline) {
    job = Get(job_id);
    if (job.ok()) {
      for (v1::JobState s : states) {
        if (job->state() == s) return job;
      }
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return job;
}

absl::StatusOr<v1::Job> WorkerCluster::Watch(const std::string& job_id, absl::Duration timeout,
                                             std::vector<v1::StepMetrics>* metrics) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::WatchJobRequest request;
  request.set_id(job_id);
  auto reader = stub_->WatchJob(&ctx, request);
  v1::JobUpdate update;
  v1::Job last;
  while (reader->Read(&update)) {
    last = update.job();
    if (update.has_metrics()) metrics->push_back(update.metrics());
    if (IsTerminal(last.state())) {
      ctx.TryCancel();
      break;
    }
  }
  grpc::Status st = reader->Finish();
  if (IsTerminal(last.state())) return last;
  return FromGrpc(st.ok() ? grpc::Status(grpc::StatusCode::UNKNOWN, "stream ended early") : st,
                  absl::StrCat("WatchJob ", job_id, " (last state ", v1::JobState_Name(last.state()),
                               ")"));
}

std::string WorkerCluster::Diagnostics() const {
  std::string out;
  for (const std::string& old : old_coordinator_output_) {
    absl::StrAppend(&out, "--- earlier coordinator ---\n", old);
  }
  if (coordinator_) absl::StrAppend(&out, "--- coordinator ---\n", coordinator_->Output());
  for (const auto& [node, w] : workers_) {
    absl::StrAppend(&out, "--- worker ", node, " ---\n", w.process->Output());
  }
  return out;
}

absl::StatusOr<std::vector<v1::Event>> WorkerCluster::Events(const std::string& job_id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::ListEventsRequest request;
  request.set_job_id(job_id);
  v1::ListEventsResponse response;
  absl::Status st = FromGrpc(stub_->ListEvents(&ctx, request, &response), "ListEvents");
  if (!st.ok()) return st;
  return std::vector<v1::Event>(response.events().begin(), response.events().end());
}

absl::StatusOr<std::vector<v1::LogLine>> WorkerCluster::Logs(const std::string& job_id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::GetLogsRequest request;
  request.set_job_id(job_id);
  std::unique_ptr<grpc::ClientReader<v1::LogLine>> reader = stub_->GetLogs(&ctx, request);
  std::vector<v1::LogLine> lines;
  v1::LogLine line;
  while (reader->Read(&line)) lines.push_back(line);
  absl::Status st = FromGrpc(reader->Finish(), "GetLogs");
  if (!st.ok()) return st;
  return lines;
}

absl::StatusOr<std::vector<v1::StepMetrics>> WorkerCluster::StepMetrics(
    const std::string& job_id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::ListStepMetricsRequest request;
  request.set_job_id(job_id);
  v1::ListStepMetricsResponse response;
  absl::Status st =
      FromGrpc(stub_->ListStepMetrics(&ctx, request, &response), "ListStepMetrics");
  if (!st.ok()) return st;
  return std::vector<v1::StepMetrics>(response.metrics().begin(), response.metrics().end());
}

std::string TinyCpuSpec(int steps) {
  std::string spec = ReadAll(SourcePath("configs/jobs/tiny-cpu.yaml"));
  if (steps > 0) {
    const std::string from = "\nsteps: 40\n";
    size_t at = spec.find(from);
    if (at != std::string::npos) spec.replace(at, from.size(), absl::StrCat("\nsteps: ", steps, "\n"));
  }
  return spec;
}

std::vector<pid_t> RankPids(const std::string& coordinator, const std::string& job_id) {
  std::vector<pid_t> pids;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* entry = readdir(proc)) {
    pid_t pid;
    if (!absl::SimpleAtoi(entry->d_name, &pid)) continue;
    std::string cmdline = ReadAll(absl::StrCat("/proc/", pid, "/cmdline"));
    std::vector<std::string> args = absl::StrSplit(cmdline, '\0');
    if (args.empty() || args[0].find("dropless-worker") == std::string::npos) continue;
    auto has = [&](const std::string& flag, const std::string& value) {
      for (size_t i = 0; i + 1 < args.size(); ++i) {
        if ((args[i] == flag && args[i + 1] == value) || args[i] == flag + "=" + value) return true;
      }
      return false;
    };
    if (has("--job", job_id) && has("--coordinator", coordinator)) pids.push_back(pid);
  }
  closedir(proc);
  return pids;
}

bool WaitGone(const std::vector<pid_t>& pids, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    bool any = false;
    for (pid_t pid : pids) {
      struct stat st;
      any = any || stat(absl::StrCat("/proc/", pid).c_str(), &st) == 0;
    }
    if (!any) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

}  // namespace dropless::testing
