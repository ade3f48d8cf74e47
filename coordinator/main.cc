// dropless-coordinator: the control plane of a dropless cluster (see docs/architecture.md).
#include <pthread.h>
#include <signal.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "coordinator/server/coordinator_server.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:7070", "gRPC listen address (host:port; port 0 picks one)");
ABSL_FLAG(std::string, worker_listen, "",
          "gRPC address of the worker and rendezvous APIs (workers' --coordinator); empty: "
          "--listen serves them too");
ABSL_FLAG(std::string, db, "dropless.db", "SQLite file holding jobs, attempts, workers, events");
ABSL_FLAG(int, metrics_port, 9090, "port of the Prometheus /metrics endpoint; 0 disables it");
ABSL_FLAG(std::string, metrics_address, "0.0.0.0", "address the /metrics endpoint binds to");
ABSL_FLAG(int64_t, heartbeat_interval_ms, 1000, "heartbeat interval the workers are told to use");
ABSL_FLAG(int64_t, lease_timeout_ms, 10000,
          "a worker with no message for this long is LOST and its attempts fail");
ABSL_FLAG(int64_t, max_message_bytes, 4 << 20,
          "largest request message accepted (RESOURCE_EXHAUSTED beyond); at least 2 MiB");
ABSL_FLAG(double, hang_step_multiple, 20,
          "hang watchdog: abort an attempt whose rank stays in one step phase for this many "
          "median step times (0: off)");
ABSL_FLAG(int64_t, hang_min_stall_ms, 60000, "hang watchdog: never abort before this long");
ABSL_FLAG(int64_t, hang_first_step_ms, 600000,
          "hang watchdog: the limit while no step time of the job is known");
ABSL_FLAG(bool, insecure, false,
          "plaintext gRPC with no authentication at all (development only; logged loudly)");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain of the coordinator's listeners");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, worker_ca, "",
          "PEM CA that signs worker client certificates (common name = node name)");
ABSL_FLAG(std::string, tokens_file, "",
          "YAML file of users' bearer tokens: token, user, role (viewer|submitter|admin), expires");
ABSL_FLAG(double, submit_rate_per_second, 5,
          "SubmitJob calls per bearer token per second (token bucket; 0: no limit)");
ABSL_FLAG(double, submit_burst, 20, "SubmitJob calls a bearer token may make at once");
ABSL_FLAG(int32_t, max_streams_per_user, 16,
          "open WatchJob / GetLogs streams per authenticated user");
ABSL_FLAG(int32_t, max_streams, 128, "open WatchJob / GetLogs streams in all");
ABSL_FLAG(int32_t, max_server_threads, 1024,
          "threads serving calls, per listener (one per open call, worker sessions and streams "
          "included; beyond, a call is refused RESOURCE_EXHAUSTED; at least 16)");
ABSL_FLAG(int64_t, max_unfinished_jobs_per_user, 1000,
          "unfinished jobs one authenticated user may have (SubmitJob beyond is refused; 0: no "
          "limit)");
ABSL_FLAG(int32_t, max_user_priority, 100,
          "the highest priority (spec or submit --priority) a user below role admin may give a "
          "job; higher is refused PERMISSION_DENIED (0..1000, the spec's range; 1000: no limit)");
ABSL_FLAG(absl::Duration, job_retention, absl::Hours(720),
          "finished jobs, with their events, logs and step metrics, are deleted from the store "
          "this long after they ended, and the cluster-wide events this old (a duration of at "
          "least 1h: 720h, 90m); 0 keeps them for good");
ABSL_FLAG(absl::Duration, lost_worker_expiry, absl::Hours(24),
          "a worker LOST (no session) for longer than this is forgotten: removed from the "
          "worker list and the store, no longer counted as capacity a job waits for; it "
          "registers as a new worker if it comes back (a duration of at least 1m: 24h, 90m); 0 "
          "keeps lost workers for good");
ABSL_FLAG(std::string, config, "",
          "optional YAML file with the same keys as the flags (flags given explicitly win)");

namespace {

using dropless::coordinator::CoordinatorConfig;

// Whether --name (or -name, with or without =value) was given before any "--".
bool FlagGiven(const std::vector<std::string>& args, const std::string& name) {
  for (const std::string& arg : args) {
    if (arg == "--") break;
    for (const std::string& prefix : {std::string("--"), std::string("-")}) {
      std::string flag = prefix + name;
      if (arg == flag || absl::StartsWith(arg, flag + "=")) return true;
    }
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  // SIGTERM/SIGINT are taken by sigwait below; block them before any thread starts so that
  // every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  if (int rc = pthread_sigmask(SIG_BLOCK, &signals, nullptr); rc != 0) {
    dropless::LogError(absl::StrCat("pthread_sigmask: ", strerror(rc)));
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);

  absl::SetProgramUsageMessage(
      "dropless-coordinator [--listen ADDR] [--db PATH] [--metrics-port P] [--config FILE]");
  // Accept --metrics-port as well as --metrics_port.
  std::vector<std::string> args;
  std::vector<char*> argv_fixed;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (i > 0 && absl::StartsWith(arg, "-")) {
      size_t end = arg.find('=');
      for (size_t c = arg.find_first_not_of('-'); c < std::min(end, arg.size()); ++c) {
        if (arg[c] == '-') arg[c] = '_';
      }
    }
    args.push_back(arg);
  }
  for (std::string& arg : args) argv_fixed.push_back(arg.data());
  absl::ParseCommandLine(static_cast<int>(argv_fixed.size()), argv_fixed.data());

  CoordinatorConfig config;
  if (std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    absl::StatusOr<CoordinatorConfig> loaded = dropless::coordinator::ApplyConfigFile(path, config);
    if (!loaded.ok()) {
      dropless::LogError(std::string(loaded.status().message()));
      return 2;
    }
    config = *loaded;
  }
  std::vector<std::string> given(args.begin() + 1, args.end());
  if (FlagGiven(given, "listen")) config.listen = absl::GetFlag(FLAGS_listen);
  if (FlagGiven(given, "worker_listen")) config.worker_listen = absl::GetFlag(FLAGS_worker_listen);
  if (FlagGiven(given, "db")) config.db = absl::GetFlag(FLAGS_db);
  if (FlagGiven(given, "metrics_port")) config.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (FlagGiven(given, "metrics_address")) {
    config.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  }
  if (FlagGiven(given, "heartbeat_interval_ms")) {
    config.heartbeat_interval_ms = absl::GetFlag(FLAGS_heartbeat_interval_ms);
  }
  if (FlagGiven(given, "lease_timeout_ms")) {
    config.lease_timeout_ms = absl::GetFlag(FLAGS_lease_timeout_ms);
  }
  if (FlagGiven(given, "max_message_bytes")) {
    config.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  }
  if (FlagGiven(given, "hang_step_multiple")) {
    config.hang_step_multiple = absl::GetFlag(FLAGS_hang_step_multiple);
  }
  if (FlagGiven(given, "hang_min_stall_ms")) {
    config.hang_min_stall_ms = absl::GetFlag(FLAGS_hang_min_stall_ms);
  }
  if (FlagGiven(given, "hang_first_step_ms")) {
    config.hang_first_step_ms = absl::GetFlag(FLAGS_hang_first_step_ms);
  }
  if (FlagGiven(given, "insecure")) config.insecure = absl::GetFlag(FLAGS_insecure);
  if (FlagGiven(given, "tls_cert")) config.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  if (FlagGiven(given, "tls_key")) config.tls_key = absl::GetFlag(FLAGS_tls_key);
  if (FlagGiven(given, "worker_ca")) config.worker_ca = absl::GetFlag(FLAGS_worker_ca);
  if (FlagGiven(given, "tokens_file")) config.tokens_file = absl::GetFlag(FLAGS_tokens_file);
  if (FlagGiven(given, "submit_rate_per_second")) {
    config.submit_rate_per_second = absl::GetFlag(FLAGS_submit_rate_per_second);
  }
  if (FlagGiven(given, "submit_burst")) config.submit_burst = absl::GetFlag(FLAGS_submit_burst);
  if (FlagGiven(given, "max_streams_per_user")) {
    config.max_streams_per_user = absl::GetFlag(FLAGS_max_streams_per_user);
  }
  if (FlagGiven(given, "max_streams")) config.max_streams = absl::GetFlag(FLAGS_max_streams);
  if (FlagGiven(given, "max_server_threads")) {
    config.max_server_threads = absl::GetFlag(FLAGS_max_server_threads);
  }
  if (FlagGiven(given, "max_unfinished_jobs_per_user")) {
    config.max_unfinished_jobs_per_user = absl::GetFlag(FLAGS_max_unfinished_jobs_per_user);
  }
  if (FlagGiven(given, "max_user_priority")) {
    config.max_user_priority = absl::GetFlag(FLAGS_max_user_priority);
  }
  if (FlagGiven(given, "job_retention")) config.job_retention = absl::GetFlag(FLAGS_job_retention);
  if (FlagGiven(given, "lost_worker_expiry")) {
    config.lost_worker_expiry = absl::GetFlag(FLAGS_lost_worker_expiry);
  }
  if (absl::Status s = dropless::coordinator::ValidateConfig(config); !s.ok()) {
    dropless::LogError(std::string(s.message()));
    return 2;
  }

  auto server = dropless::coordinator::CoordinatorServer::Start(config);
  if (!server.ok()) {
    dropless::LogError(absl::StrCat("cannot start: ", server.status().ToString()));
    return 1;
  }
  int received = 0;
  while (sigwait(&signals, &received) != 0) {
  }
  dropless::LogInfo(absl::StrCat("received ", strsignal(received), "; shutting down"));
  (*server)->Shutdown(absl::Seconds(5));
  return 0;
}
