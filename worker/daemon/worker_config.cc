#include "worker/daemon/worker_config.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/host_port.h"
#include "common/status_context.h"
#include "worker/daemon/rank_log_file.h"
#include "worker/rank/checkpoint_roots.h"
#include "yaml-cpp/yaml.h"

namespace dropless {
namespace {

absl::Status FieldError(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

absl::Status ReadScalar(const YAML::Node& value, absl::string_view key, std::string* out) {
  if (!value.IsScalar()) return FieldError(key, "must be a string");
  *out = value.Scalar();
  return absl::OkStatus();
}

template <typename Int>
absl::Status ReadInt(const YAML::Node& value, absl::string_view key, Int* out) {
  if (!value.IsScalar() || !absl::SimpleAtoi(value.Scalar(), out)) {
    return FieldError(key, absl::StrCat("must be an integer (got '",
                                        value.IsScalar() ? value.Scalar() : "<not a scalar>",
                                        "')"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<WorkerSettings> ParseWorkerSettingsYaml(absl::string_view yaml) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("worker config: not valid YAML: ", e.what()));
  }
  WorkerSettings s;
  if (root.IsNull()) return s;
  if (!root.IsMap()) return absl::InvalidArgumentError("worker config: must be a mapping");
  for (const auto& entry : root) {
    if (!entry.first.IsScalar()) return absl::InvalidArgumentError("worker config: bad key");
    const std::string key = entry.first.Scalar();
    const YAML::Node& value = entry.second;
    std::string text;
    absl::Status st;
    if (key == "coordinator" || key == "node" || key == "advertise_address" ||
        key == "metrics_address" || key == "gpus" || key == "work_dir" || key == "tls_ca" ||
        key == "tls_cert" || key == "tls_key" || key == "checkpoint_roots") {
      st = ReadScalar(value, key, &text);
      if (st.ok()) {
        if (key == "coordinator") s.coordinator = text;
        if (key == "node") s.node = text;
        if (key == "advertise_address") s.advertise_address = text;
        if (key == "metrics_address") s.metrics_address = text;
        if (key == "gpus") s.gpus = text;
        if (key == "work_dir") s.work_dir = text;
        if (key == "tls_ca") s.tls_ca = text;
        if (key == "tls_cert") s.tls_cert = text;
        if (key == "tls_key") s.tls_key = text;
        if (key == "checkpoint_roots") s.checkpoint_roots = text;
      }
    } else if (key == "insecure") {
      try {
        s.insecure = value.as<bool>();
      } catch (const YAML::Exception&) {
        st = FieldError(key, "must be true or false");
      }
    } else if (key == "metrics_port") {
      int v = 0;
      st = ReadInt(value, key, &v);
      s.metrics_port = v;
    } else if (key == "cpu_slots") {
      int v = 0;
      st = ReadInt(value, key, &v);
      s.cpu_slots = v;
    } else if (key == "kill_grace_ms") {
      int64_t v = 0;
      st = ReadInt(value, key, &v);
      s.kill_grace_ms = v;
    } else if (key == "rank_log_max_bytes") {
      int64_t v = 0;
      st = ReadInt(value, key, &v);
      s.rank_log_max_bytes = v;
    } else if (key == "retained_job_bytes") {
      int64_t v = 0;
      st = ReadInt(value, key, &v);
      s.retained_job_bytes = v;
    } else {
      return FieldError(key, "unknown key in worker config");
    }
    if (!st.ok()) return st;
  }
  return s;
}

absl::StatusOr<WorkerSettings> LoadWorkerSettingsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--config: cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<WorkerSettings> s = ParseWorkerSettingsYaml(text.str());
  if (!s.ok()) {
    return WithContext(path, s.status());
  }
  return s;
}

HostFacts CurrentHostFacts() {
  HostFacts facts;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') {
    facts.hostname = name;
  } else {
    facts.hostname = "localhost";
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  facts.cpu_count = cpus > 0 ? static_cast<int>(cpus) : 1;
  const char* tmp = std::getenv("TMPDIR");
  if (tmp != nullptr && tmp[0] != '\0') facts.temp_dir = tmp;
  return facts;
}

bool IsLoopbackAddress(absl::string_view host_port) {
  std::string host = absl::AsciiStrToLower(HostOf(host_port));
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.") ||
         absl::EndsWith(host, ".localhost");
}

absl::StatusOr<WorkerConfig> ResolveWorkerConfig(const WorkerSettings& file,
                                                 const WorkerSettings& flags,
                                                 const HostFacts& host) {
  auto pick = [](const auto& flag, const auto& from_file, auto fallback) {
    if (flag.has_value()) return *flag;
    if (from_file.has_value()) return *from_file;
    return std::decay_t<decltype(*flag)>(fallback);
  };
  WorkerConfig c;
  c.coordinator = pick(flags.coordinator, file.coordinator, std::string("localhost:7070"));
  c.node = pick(flags.node, file.node, host.hostname);
  c.metrics_port = pick(flags.metrics_port, file.metrics_port, 9100);
  c.metrics_address = pick(flags.metrics_address, file.metrics_address, std::string("0.0.0.0"));
  c.cpu_slots_given = flags.cpu_slots.has_value() || file.cpu_slots.has_value();
  c.cpu_slots = pick(flags.cpu_slots, file.cpu_slots, 0);
  c.gpus = absl::AsciiStrToLower(pick(flags.gpus, file.gpus, std::string("auto")));
  c.kill_grace_ms = pick(flags.kill_grace_ms, file.kill_grace_ms, int64_t{5000});
  c.rank_log_max_bytes =
      pick(flags.rank_log_max_bytes, file.rank_log_max_bytes, kDefaultRankLogMaxBytes);
  c.retained_job_bytes =
      pick(flags.retained_job_bytes, file.retained_job_bytes, kDefaultRetainedJobBytes);
  absl::StatusOr<std::vector<std::string>> roots = ParseCheckpointRoots(
      pick(flags.checkpoint_roots, file.checkpoint_roots, std::string()), "checkpoint_roots");
  if (!roots.ok()) return roots.status();
  c.checkpoint_roots = *std::move(roots);

  if (c.coordinator.empty()) return FieldError("coordinator", "must not be empty");
  if (absl::Status s = ParseHostPort("coordinator", c.coordinator, 1).status(); !s.ok()) return s;
  if (c.node.empty()) return FieldError("node", "must not be empty");
  for (char ch : c.node) {
    if (!absl::ascii_isalnum(ch) && ch != '-' && ch != '_' && ch != '.') {
      return FieldError("node", absl::StrCat("may hold only letters, digits, '-', '_' and '.' (got '",
                                             c.node, "')"));
    }
  }
  std::string default_advertise = IsLoopbackAddress(c.coordinator) ? "127.0.0.1" : host.hostname;
  c.advertise_address = pick(flags.advertise_address, file.advertise_address, default_advertise);
  if (c.advertise_address.empty()) return FieldError("advertise_address", "must not be empty");
  c.work_dir = pick(flags.work_dir, file.work_dir,
                    absl::StrCat(host.temp_dir, "/dropless-worker-", c.node));
  if (c.work_dir.empty()) return FieldError("work_dir", "must not be empty");

  if (c.metrics_port < 0 || c.metrics_port > 65535) {
    return FieldError("metrics_port", absl::StrCat("must be in 0..65535 (got ", c.metrics_port, ")"));
  }
  if (c.metrics_port != 0 && c.metrics_address.empty()) {
    return FieldError("metrics_address", "must not be empty");
  }
  if (c.cpu_slots_given && (c.cpu_slots < 1 || c.cpu_slots > kMaxWorkerSlots)) {
    return FieldError("cpu_slots",
                      absl::StrCat("must be in 1..", kMaxWorkerSlots, " (got ", c.cpu_slots, ")"));
  }
  int gpu_count = 0;
  if (c.gpus != "auto" && c.gpus != "none" &&
      (!absl::SimpleAtoi(c.gpus, &gpu_count) || gpu_count < 1)) {
    return FieldError("gpus", absl::StrCat("must be auto, none or a count >= 1 (got '", c.gpus, "')"));
  }
  if (gpu_count > 0 && c.cpu_slots_given) {
    return FieldError("cpu_slots", "cannot be combined with a GPU count in gpus; use one kind of slot");
  }
  if (c.kill_grace_ms < 0) {
    return FieldError("kill_grace_ms", absl::StrCat("must be >= 0 (got ", c.kill_grace_ms, ")"));
  }
  if (c.rank_log_max_bytes != 0 && c.rank_log_max_bytes < kMinRankLogMaxBytes) {
    return FieldError("rank_log_max_bytes",
                      absl::StrCat("must be 0 (no cap) or at least ", kMinRankLogMaxBytes,
                                   " bytes (got ", c.rank_log_max_bytes, ")"));
  }
  // Also the smallest other than 0: a budget mistaken for GiB (=8) is refused.
  if (c.retained_job_bytes != 0 && c.retained_job_bytes < kMinRankLogMaxBytes) {
    return FieldError("retained_job_bytes",
                      absl::StrCat("must be 0 (count only) or at least ", kMinRankLogMaxBytes,
                                   " bytes (got ", c.retained_job_bytes, ")"));
  }
  c.security.insecure = pick(flags.insecure, file.insecure, false);
  c.security.tls.ca = pick(flags.tls_ca, file.tls_ca, std::string());
  c.security.tls.cert = pick(flags.tls_cert, file.tls_cert, std::string());
  c.security.tls.key = pick(flags.tls_key, file.tls_key, std::string());
  if (!c.security.insecure) {
    for (const auto& [value, key] : {std::pair{&c.security.tls.ca, "tls_ca"},
                                     std::pair{&c.security.tls.cert, "tls_cert"},
                                     std::pair{&c.security.tls.key, "tls_key"}}) {
      if (value->empty()) {
        return FieldError(key, "required: workers use mutual TLS (scripts/dev-certs makes "
                               "development certificates); plaintext only with --insecure");
      }
    }
  }
  return c;
}

absl::StatusOr<SlotPlan> PlanSlots(
    const WorkerConfig& config, int cpu_count,
    const std::function<absl::StatusOr<std::vector<CudaDevice>>()>& discover,
    std::string* warning) {
  auto cpu_plan = [&]() {
    SlotPlan plan;
    plan.slot_kind = "cpu";
    int n = config.cpu_slots_given ? config.cpu_slots : std::max(cpu_count, 1);
    plan.devices.assign(n, "cpu");
    plan.uuids.assign(n, "");
    return plan;
  };
  if (config.gpus == "none") return cpu_plan();
  if (config.gpus == "auto" && config.cpu_slots_given) return cpu_plan();

  absl::StatusOr<std::vector<CudaDevice>> gpus = discover();
  auto gpu_plan = [](const std::vector<CudaDevice>& found) {
    SlotPlan plan{"cuda", {}, {}, {}};
    for (const CudaDevice& d : found) {
      plan.devices.push_back(d.name);
      plan.uuids.push_back(d.uuid);
      plan.memory_bytes.push_back(d.total_memory_bytes);
    }
    return plan;
  };
  if (config.gpus == "auto") {
    if (!gpus.ok()) {
      if (warning != nullptr) {
        *warning = absl::StrCat("GPU discovery failed, offering CPU slots: ", gpus.status().message());
      }
      return cpu_plan();
    }
    if (gpus->empty()) return cpu_plan();
    return gpu_plan(*gpus);
  }
  int wanted = 0;
  if (!absl::SimpleAtoi(config.gpus, &wanted) || wanted < 1) {
    return FieldError("gpus", absl::StrCat("must be auto, none or a count >= 1 (got '", config.gpus, "')"));
  }
  if (!gpus.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("gpus: ", wanted, " wanted but discovery failed: ", gpus.status().message()));
  }
  if (static_cast<int>(gpus->size()) < wanted) {
    return absl::FailedPreconditionError(
        absl::StrCat("gpus: ", wanted, " wanted but ", gpus->size(), " found"));
  }
  gpus->resize(wanted);
  return gpu_plan(*gpus);
}

}  // namespace dropless
