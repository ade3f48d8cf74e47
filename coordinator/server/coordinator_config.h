// CoordinatorConfig: how dropless-coordinator is run. Defaults, then an optional YAML file
// (configs/coordinator.yaml, same keys as the flags), then flags given on the command line.
#ifndef DROPLESS_COORDINATOR_SERVER_COORDINATOR_CONFIG_H_
#define DROPLESS_COORDINATOR_SERVER_COORDINATOR_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dropless::coordinator {

struct CoordinatorConfig {
  std::string listen = "0.0.0.0:7070";  // gRPC address
  // Where WorkerService and RendezvousService listen (workers' --coordinator); empty: on `listen`
  // with JobService.
  std::string worker_listen;
  std::string db = "dropless.db";       // SQLite file
  int metrics_port = 9090;              // /metrics; 0 disables
  std::string metrics_address = "0.0.0.0";
  int64_t heartbeat_interval_ms = 1000;
  int64_t lease_timeout_ms = 10000;
  // Largest request message a listener accepts (RESOURCE_EXHAUSTED beyond): the largest legitimate
  // ones are a rendezvous value (1 MiB) and a worker's log batch (about 512 KiB).
  int64_t max_message_bytes = 4 << 20;
  // Hang watchdog (coordinator/controller/hang_watchdog.h): a rank in one step phase for longer
  // than hang_step_multiple x the median step time (at least hang_min_stall_ms; before any step
  // time is known, hang_first_step_ms) has its attempt aborted. 0 multiple: off.
  double hang_step_multiple = 20;
  int64_t hang_min_stall_ms = 60000;
  int64_t hang_first_step_ms = 600000;
  // Security (docs/security.md). Every listener speaks TLS with tls_cert/tls_key; worker and
  // rendezvous calls need a client certificate signed by worker_ca whose common name is the node;
  // JobService calls need a bearer token from tokens_file. insecure: plaintext and no
  // authentication at all, for development only.
  bool insecure = false;
  std::string tls_cert;
  std::string tls_key;
  std::string worker_ca;
  std::string tokens_file;
  // SubmitJob calls per bearer token: refilled at this rate up to the burst; 0: no limit.
  double submit_rate_per_second = 5;
  double submit_burst = 20;
  // Open WatchJob / GetLogs streams: per authenticated user and in all (each holds a server
  // thread, up to 8 MiB of queued updates or lines and one GetLogs backlog page of up to 8 MiB).
  int max_streams_per_user = 16;
  int max_streams = 128;
  // Threads serving calls, per listener (gRPC's sync server holds one per open call, streams and
  // worker sessions included); a call beyond is refused RESOURCE_EXHAUSTED. At least 16.
  int max_server_threads = 1024;
  // Unfinished (pending, scheduled, running) jobs per authenticated user; 0: no limit.
  int64_t max_unfinished_jobs_per_user = 1000;
  // The highest priority a job submitted by a user below role admin may have (the spec's or the
  // submit's override; higher runs first): without it anyone could put their jobs before every
  // other user's. 0..kMaxJobPriority (common/job_spec.h; at that maximum, no limit).
  int32_t max_user_priority = 100;
  // Finished jobs (with their events, logs and step metrics) are deleted from the store this long
  // after they ended; 0 keeps them for good; otherwise at least kMinJobRetention. A duration:
  // "720h", "90m", "0". In YAML a string.
  absl::Duration job_retention = absl::Hours(720);
  // A worker LOST (no session) for longer than this is forgotten: removed from the registry and
  // the store, no longer listed or counted as capacity; 0 keeps lost workers for good; otherwise
  // at least kMinLostWorkerExpiry. A duration: "24h", "90m", "0". In YAML a string.
  absl::Duration lost_worker_expiry = absl::Hours(24);
};

// The shortest retention ValidateConfig accepts (but 0). A cancelled job's ranks may still be
// stopping (their grace period) when the coordinator restarts; the ranks a worker's Hello lists
// hold their slots only while their job is in the store, so a job deleted by the sweep at start
// would let a new gang land on a GPU its old process still holds.
inline constexpr absl::Duration kMinJobRetention = absl::Hours(1);

// The shortest lost-worker expiry ValidateConfig accepts (but 0): well beyond a lease and a
// worker daemon's reconnect backoff, so a network blip or a coordinator restart never makes a
// live worker a new one.
inline constexpr absl::Duration kMinLostWorkerExpiry = absl::Minutes(1);

// Overlays the keys present in a YAML mapping onto base. Unknown keys, wrong types and files
// that cannot be read are errors naming the key or file.
absl::StatusOr<CoordinatorConfig> ApplyConfigFile(const std::string& path,
                                                  CoordinatorConfig base);
absl::StatusOr<CoordinatorConfig> ApplyConfigYaml(const std::string& yaml,
                                                  CoordinatorConfig base);

absl::Status ValidateConfig(const CoordinatorConfig& config);

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_SERVER_COORDINATOR_CONFIG_H_
