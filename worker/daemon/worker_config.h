// WorkerConfig: how one dropless-worker daemon is set up. Sources, later ones win: built-in
// defaults, the YAML file (--config, e.g. configs/worker.yaml), command-line flags. Facts of the
// host (name, CPU count) are passed in so tests can resolve a config for any machine.
#ifndef DROPLESS_WORKER_DAEMON_WORKER_CONFIG_H_
#define DROPLESS_WORKER_DAEMON_WORKER_CONFIG_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "common/grpc_security.h"
#include "worker/daemon/gpu_discovery.h"
#include "worker/daemon/rank_log_file.h"

namespace dropless {

// Settings as given by one source; unset fields fall through to the next source.
struct WorkerSettings {
  std::optional<std::string> coordinator;
  std::optional<std::string> node;
  std::optional<std::string> advertise_address;
  std::optional<int> metrics_port;
  std::optional<std::string> metrics_address;
  std::optional<int> cpu_slots;
  std::optional<std::string> gpus;  // auto | none | N
  std::optional<std::string> work_dir;
  std::optional<int64_t> kill_grace_ms;
  std::optional<int64_t> rank_log_max_bytes;
  std::optional<int64_t> retained_job_bytes;
  std::optional<std::string> checkpoint_roots;  // "/a,/b"
  std::optional<bool> insecure;  // plaintext to the coordinator (development only)
  std::optional<std::string> tls_ca;    // CA of the coordinator's certificate
  std::optional<std::string> tls_cert;  // this node's client certificate (CN = node name)
  std::optional<std::string> tls_key;
};

// Flat YAML mapping whose keys are the field names above (coordinator, node, advertise_address,
// metrics_port, metrics_address, cpu_slots, gpus, work_dir, kill_grace_ms, rank_log_max_bytes,
// retained_job_bytes, checkpoint_roots, insecure, tls_ca, tls_cert, tls_key). Unknown keys and values of the wrong type are
// InvalidArgument naming the key.
absl::StatusOr<WorkerSettings> ParseWorkerSettingsYaml(absl::string_view yaml);
absl::StatusOr<WorkerSettings> LoadWorkerSettingsFile(const std::string& path);

struct HostFacts {
  std::string hostname;
  int cpu_count = 1;
  std::string temp_dir = "/tmp";
};
HostFacts CurrentHostFacts();

// The most slots a worker may offer: the coordinator refuses a registration of more (and a worker
// refused as invalid stops), so the worker checks it before it starts.
inline constexpr int kMaxWorkerSlots = 4096;

// Default of WorkerConfig::retained_job_bytes (8 GiB).
inline constexpr int64_t kDefaultRetainedJobBytes = int64_t{8} << 30;

// The smallest rank log cap other than 0 (none): one read of a rank's output pipe, so that a cap
// mistaken for MiB (--rank-log-max-bytes=64) is refused rather than leaving useless logs.
inline constexpr int64_t kMinRankLogMaxBytes = int64_t{64} << 10;

struct WorkerConfig {
  std::string coordinator;        // host:port of the coordinator's gRPC API
  std::string node;               // unique node name (the same node always gets the same id)
  std::string advertise_address;  // host other ranks and Prometheus reach this node at
  int metrics_port = 0;           // 0: no /metrics
  std::string metrics_address;    // bind address of /metrics
  int cpu_slots = 0;              // 0: as many as CPUs (used when no GPU is used)
  bool cpu_slots_given = false;   // cpu_slots was set explicitly (chooses CPU slots under gpus=auto)
  std::string gpus;               // auto | none | N
  std::string work_dir;           // per-attempt spec files and rank logs
  int64_t kill_grace_ms = 0;      // SIGTERM -> SIGKILL delay when stopping ranks
  // Cap of each rank's log file before it rotates to rank-<R>.log.1 (rank_log_file.h); 0: none.
  int64_t rank_log_max_bytes = kDefaultRankLogMaxBytes;
  // Bytes of finished jobs' directories (spec files, rank logs) kept under <work_dir>/jobs, the
  // oldest removed first when a new assignment arrives; 0: bounded by their count only.
  int64_t retained_job_bytes = kDefaultRetainedJobBytes;
  // Where jobs' checkpoint.dir may be (worker/rank/checkpoint_roots.h); empty: anywhere.
  std::vector<std::string> checkpoint_roots;
  // Mutual TLS to the coordinator (the ranks use the same files), or plaintext when insecure.
  ChannelSecurity security;
};

// Applies defaults, then `file`, then `flags`, and validates the result (errors name the field).
// Defaults: coordinator localhost:7070; node = hostname; advertise_address 127.0.0.1 when the
// coordinator is on loopback, else the hostname; metrics_port 9100; metrics_address 0.0.0.0;
// gpus auto; work_dir <temp_dir>/dropless-worker-<node>; kill_grace_ms 5000; rank_log_max_bytes
// kDefaultRankLogMaxBytes (64 MiB; 0 or at least kMinRankLogMaxBytes); retained_job_bytes
// kDefaultRetainedJobBytes (8 GiB; 0 or at least kMinRankLogMaxBytes).
absl::StatusOr<WorkerConfig> ResolveWorkerConfig(const WorkerSettings& file,
                                                 const WorkerSettings& flags,
                                                 const HostFacts& host);

// True when host:port (or [v6]:port) names this machine's loopback (localhost, 127/8, ::1).
bool IsLoopbackAddress(absl::string_view host_port);

// The slots this worker offers: one per GPU (kind "cuda", device names) or per CPU slot
// (kind "cpu", devices "cpu").
struct SlotPlan {
  std::string slot_kind;             // cpu | cuda
  std::vector<std::string> devices;  // one entry per slot
  std::vector<std::string> uuids;    // one entry per slot: the GPU's UUID; empty for CPU slots
  // One entry per cuda slot: the GPU's total memory in bytes (0: unknown); none for CPU slots.
  std::vector<int64_t> memory_bytes;
};

// gpus=none: CPU slots. gpus=N: the first N GPUs (error when fewer are found, or when cpu_slots
// was also given). gpus=auto: CPU slots when cpu_slots was given, else every GPU found, else one
// CPU slot per CPU. `discover` returns the GPUs; it is called only when GPUs are wanted, and
// under auto a discovery error falls back to CPU slots (reported through `warning`).
absl::StatusOr<SlotPlan> PlanSlots(
    const WorkerConfig& config, int cpu_count,
    const std::function<absl::StatusOr<std::vector<CudaDevice>>()>& discover,
    std::string* warning);

}  // namespace dropless

#endif  // DROPLESS_WORKER_DAEMON_WORKER_CONFIG_H_
