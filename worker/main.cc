// dropless-worker: the worker daemon (no subcommand) and the rank process (`rank` subcommand).
//
//   dropless-worker [--coordinator ADDR] [--node NAME] [--cpu-slots N] [--metrics-port P] ...
//   dropless-worker rank --coordinator ADDR --job ID --attempt N --rank R --world-size W
//                        --slot S --spec FILE --host ADDR --node NAME --report-fd 3
//
// `rank` execs dropless-worker-rank from the directory of this binary with the same arguments
// (same pid, same file descriptors): the rank image links the engine and OpenBLAS, whose static
// TLS would shrink the thread stacks of this daemon's /metrics server below what it needs
// (see worker/rank/rank_main.cc). Flags may be spelled with '-' or '_' (--cpu-slots, --cpu_slots).
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "worker/daemon/rank_binary.h"
#include "worker/daemon/rank_log_file.h"
#include "worker/daemon/worker_config.h"
#include "worker/daemon/worker_daemon.h"

// Empty / -1 means "not given": the config file or the built-in default applies.
ABSL_FLAG(std::string, coordinator, "", "coordinator gRPC address host:port (default localhost:7070)");
ABSL_FLAG(bool, insecure, false,
          "plaintext to the coordinator, no certificate (development only; logged loudly)");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA certificate that signed the coordinator's certificate");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate of this node (its common name must be --node)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, node, "", "node name, unique in the cluster (default: hostname)");
ABSL_FLAG(std::string, config, "", "worker YAML config (e.g. configs/worker.yaml); flags win over it");
ABSL_FLAG(std::string, advertise_address, "",
          "host peers and Prometheus reach this node at (default 127.0.0.1 when the coordinator "
          "is on loopback, else the hostname)");
ABSL_FLAG(std::optional<int>, metrics_port, std::nullopt,
          "port of /metrics (default 9100; 0 disables)");
ABSL_FLAG(std::string, metrics_address, "", "bind address of /metrics (default 0.0.0.0)");
ABSL_FLAG(std::optional<int>, cpu_slots, std::nullopt,
          "offer N CPU slots, 1..4096 (default: one per CPU when no GPU is used)");
ABSL_FLAG(std::string, gpus, "", "auto | none | N: GPUs to offer as cuda slots (default auto)");
ABSL_FLAG(std::string, work_dir, "",
          "directory for per-attempt spec files and rank logs (default $TMPDIR/dropless-worker-<node>)");
ABSL_FLAG(std::optional<int64_t>, kill_grace_ms, std::nullopt,
          "SIGTERM -> SIGKILL delay when stopping ranks, in ms (default 5000)");
ABSL_FLAG(std::optional<int64_t>, rank_log_max_bytes, std::nullopt,
          "cap of each rank's log file (<work-dir>/jobs/<job>/attempt-<N>/rank-<R>.log) in bytes: "
          "past it the file is renamed to rank-<R>.log.1, replacing the older one, so a rank keeps "
          "at most twice this on disk; 0: no cap (default 67108864, 64 MiB; else at least 65536)");
ABSL_FLAG(std::string, checkpoint_roots, "",
          "comma-separated absolute directories that jobs' checkpoint.dir must be in (symbolic "
          "links resolved); a spec naming another is a job error. Default: anywhere the ranks may "
          "write (development only; deploy/base sets the checkpoint volume)");
ABSL_FLAG(std::optional<int64_t>, retained_job_bytes, std::nullopt,
          "bytes of finished jobs' directories (spec files, rank logs) kept under <work-dir>/jobs: "
          "the oldest go first when a new assignment arrives (at most 32 are kept either way); "
          "0: by count only (default 8589934592, 8 GiB; else at least 65536)");

namespace {

// absl flags are C identifiers; accept the documented dashed spellings too.
std::string NormalizeFlag(const std::string& arg) {
  if (!absl::StartsWith(arg, "--") || arg == "--") return arg;
  size_t end = arg.find('=');
  if (end == std::string::npos) end = arg.size();
  std::string out = arg;
  for (size_t i = 2; i < end; ++i) {
    if (out[i] == '-') out[i] = '_';
  }
  return out;
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "dropless-worker: %s\n", message.c_str());
  return 2;
}

// `dropless-worker rank ARGS...` becomes `dropless-worker-rank ARGS...`.
int ExecRank(int argc, char** argv) {
  absl::StatusOr<std::string> binary = dropless::FindRankBinary();
  if (!binary.ok()) {
    dropless::LogError(binary.status().message());
    return 127;
  }
  std::vector<char*> args;
  args.push_back(binary->data());
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  execv(binary->c_str(), args.data());
  dropless::LogError(absl::StrCat("exec ", *binary, ": ", strerror(errno)));
  return 127;
}

int RunDaemon() {
  dropless::WorkerSettings flags;
  auto set_string = [](std::optional<std::string>* out, const std::string& v) {
    if (!v.empty()) *out = v;
  };
  set_string(&flags.coordinator, absl::GetFlag(FLAGS_coordinator));
  set_string(&flags.node, absl::GetFlag(FLAGS_node));
  set_string(&flags.advertise_address, absl::GetFlag(FLAGS_advertise_address));
  set_string(&flags.metrics_address, absl::GetFlag(FLAGS_metrics_address));
  set_string(&flags.gpus, absl::GetFlag(FLAGS_gpus));
  set_string(&flags.work_dir, absl::GetFlag(FLAGS_work_dir));
  // Optional flags: a value given on the command line is validated like the config file's, so
  // that -1 is an error rather than a sentinel for "not given".
  flags.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  flags.cpu_slots = absl::GetFlag(FLAGS_cpu_slots);
  flags.kill_grace_ms = absl::GetFlag(FLAGS_kill_grace_ms);
  flags.rank_log_max_bytes = absl::GetFlag(FLAGS_rank_log_max_bytes);
  flags.retained_job_bytes = absl::GetFlag(FLAGS_retained_job_bytes);
  set_string(&flags.checkpoint_roots, absl::GetFlag(FLAGS_checkpoint_roots));
  if (absl::GetFlag(FLAGS_insecure)) flags.insecure = true;
  set_string(&flags.tls_ca, absl::GetFlag(FLAGS_tls_ca));
  set_string(&flags.tls_cert, absl::GetFlag(FLAGS_tls_cert));
  set_string(&flags.tls_key, absl::GetFlag(FLAGS_tls_key));

  dropless::WorkerSettings file;
  if (const std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    absl::StatusOr<dropless::WorkerSettings> loaded = dropless::LoadWorkerSettingsFile(path);
    if (!loaded.ok()) return Usage(std::string(loaded.status().message()));
    file = *loaded;
  }
  const dropless::HostFacts host = dropless::CurrentHostFacts();
  absl::StatusOr<dropless::WorkerConfig> config = dropless::ResolveWorkerConfig(file, flags, host);
  if (!config.ok()) return Usage(std::string(config.status().message()));
  return dropless::RunWorkerDaemon(*config, host);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "rank") return ExecRank(argc, argv);

  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) args.push_back(i == 0 ? argv[0] : NormalizeFlag(argv[i]));
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  absl::SetProgramUsageMessage(
      "dropless worker daemon.\n"
      "  dropless-worker [--coordinator ADDR] [--node NAME] [--cpu-slots N] [--gpus auto|none|N]\n"
      "                  [--metrics-port P] [--config FILE] ...\n"
      "  dropless-worker rank --coordinator ADDR --job ID --attempt N --rank R --world-size W\n"
      "                  --slot S --spec FILE --host ADDR --node NAME --report-fd 3");
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  if (positional.size() > 1) {
    return Usage(absl::StrCat("unexpected argument '", positional[1], "'"));
  }
  return RunDaemon();
}
