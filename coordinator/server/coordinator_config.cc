#include "coordinator/server/coordinator_config.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/host_port.h"
#include "common/job_spec.h"
#include "common/status_context.h"

namespace dropless::coordinator {
namespace {

constexpr size_t kMaxConfigBytes = 64 * 1024;

template <typename T>
absl::Status Read(const YAML::Node& node, const std::string& key, T* out) {
  try {
    *out = node.as<T>();
  } catch (const YAML::Exception&) {
    return absl::InvalidArgumentError(absl::StrCat("coordinator config: ", key, ": wrong type"));
  }
  return absl::OkStatus();
}

// A duration as the flags take it (absl::ParseDuration: "720h", "90m", "0").
absl::Status ReadDuration(const YAML::Node& node, const std::string& key, absl::Duration* out) {
  std::string text;
  if (absl::Status s = Read(node, key, &text); !s.ok()) return s;
  if (!absl::ParseDuration(text, out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator config: ", key, ": not a duration such as 720h, 90m or 0 (got \"",
                     text, "\")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CoordinatorConfig> ApplyConfigYaml(const std::string& yaml,
                                                  CoordinatorConfig base) {
  if (yaml.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError("coordinator config: larger than 64 KiB");
  }
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("coordinator config: not YAML: ", e.what()));
  }
  if (root.IsNull()) return base;
  if (!root.IsMap()) return absl::InvalidArgumentError("coordinator config: must be a mapping");
  for (const auto& entry : root) {
    std::string key;
    try {
      key = entry.first.as<std::string>();
    } catch (const YAML::Exception&) {
      return absl::InvalidArgumentError("coordinator config: keys must be strings");
    }
    const YAML::Node& value = entry.second;
    absl::Status s;
    if (key == "listen") {
      s = Read(value, key, &base.listen);
    } else if (key == "worker_listen") {
      s = Read(value, key, &base.worker_listen);
    } else if (key == "db") {
      s = Read(value, key, &base.db);
    } else if (key == "metrics_port") {
      s = Read(value, key, &base.metrics_port);
    } else if (key == "metrics_address") {
      s = Read(value, key, &base.metrics_address);
    } else if (key == "heartbeat_interval_ms") {
      s = Read(value, key, &base.heartbeat_interval_ms);
    } else if (key == "lease_timeout_ms") {
      s = Read(value, key, &base.lease_timeout_ms);
    } else if (key == "max_message_bytes") {
      s = Read(value, key, &base.max_message_bytes);
    } else if (key == "hang_step_multiple") {
      s = Read(value, key, &base.hang_step_multiple);
    } else if (key == "hang_min_stall_ms") {
      s = Read(value, key, &base.hang_min_stall_ms);
    } else if (key == "hang_first_step_ms") {
      s = Read(value, key, &base.hang_first_step_ms);
    } else if (key == "insecure") {
      s = Read(value, key, &base.insecure);
    } else if (key == "tls_cert") {
      s = Read(value, key, &base.tls_cert);
    } else if (key == "tls_key") {
      s = Read(value, key, &base.tls_key);
    } else if (key == "worker_ca") {
      s = Read(value, key, &base.worker_ca);
    } else if (key == "tokens_file") {
      s = Read(value, key, &base.tokens_file);
    } else if (key == "submit_rate_per_second") {
      s = Read(value, key, &base.submit_rate_per_second);
    } else if (key == "submit_burst") {
      s = Read(value, key, &base.submit_burst);
    } else if (key == "max_streams_per_user") {
      s = Read(value, key, &base.max_streams_per_user);
    } else if (key == "max_streams") {
      s = Read(value, key, &base.max_streams);
    } else if (key == "max_server_threads") {
      s = Read(value, key, &base.max_server_threads);
    } else if (key == "max_unfinished_jobs_per_user") {
      s = Read(value, key, &base.max_unfinished_jobs_per_user);
    } else if (key == "max_user_priority") {
      s = Read(value, key, &base.max_user_priority);
    } else if (key == "job_retention") {
      s = ReadDuration(value, key, &base.job_retention);
    } else if (key == "lost_worker_expiry") {
      s = ReadDuration(value, key, &base.lost_worker_expiry);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "coordinator config: unknown key \"", key,
          "\" (known: listen, worker_listen, db, metrics_port, metrics_address, "
          "heartbeat_interval_ms, lease_timeout_ms, max_message_bytes, hang_step_multiple, "
          "hang_min_stall_ms, hang_first_step_ms, insecure, tls_cert, tls_key, worker_ca, "
          "tokens_file, submit_rate_per_second, submit_burst, max_streams_per_user, "
          "max_streams, max_server_threads, max_unfinished_jobs_per_user, max_user_priority, "
          "job_retention, lost_worker_expiry)"));
    }
    if (!s.ok()) return s;
  }
  return base;
}

absl::StatusOr<CoordinatorConfig> ApplyConfigFile(const std::string& path,
                                                  CoordinatorConfig base) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("coordinator config ", path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<CoordinatorConfig> config = ApplyConfigYaml(text.str(), base);
  if (!config.ok()) {
    return WithContext(path, config.status());
  }
  return config;
}

absl::Status ValidateConfig(const CoordinatorConfig& config) {
  if (config.listen.empty()) return absl::InvalidArgumentError("listen: must not be empty");
  // Port 0: any free port (tests; the chosen one is logged).
  if (absl::Status s = ParseHostPort("listen", config.listen, 0).status(); !s.ok()) return s;
  if (!config.worker_listen.empty()) {
    if (absl::Status s = ParseHostPort("worker_listen", config.worker_listen, 0).status();
        !s.ok()) {
      return s;
    }
  }
  if (!config.worker_listen.empty() && config.worker_listen == config.listen) {
    return absl::InvalidArgumentError("worker_listen: must differ from listen (or be empty)");
  }
  if (config.db.empty()) return absl::InvalidArgumentError("db: must not be empty");
  if (config.metrics_port < 0 || config.metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("metrics_port: must be 0..65535 (got %d)", config.metrics_port));
  }
  if (config.heartbeat_interval_ms <= 0) {
    return absl::InvalidArgumentError("heartbeat_interval_ms: must be positive");
  }
  if (config.lease_timeout_ms <= config.heartbeat_interval_ms) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "lease_timeout_ms: must be larger than heartbeat_interval_ms (got %d <= %d)",
        config.lease_timeout_ms, config.heartbeat_interval_ms));
  }
  if (config.max_message_bytes < (2 << 20) || config.max_message_bytes > (1 << 30)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_message_bytes: must be 2 MiB..1 GiB (a rendezvous value alone may be 1 MiB; got %d)",
        config.max_message_bytes));
  }
  if (!(config.hang_step_multiple >= 0)) {
    return absl::InvalidArgumentError("hang_step_multiple: must not be negative (0: off)");
  }
  if (config.hang_min_stall_ms <= 0) {
    return absl::InvalidArgumentError("hang_min_stall_ms: must be positive");
  }
  if (config.hang_first_step_ms <= 0) {
    return absl::InvalidArgumentError("hang_first_step_ms: must be positive");
  }
  if (!config.insecure) {
    for (const auto& [value, key] : {std::pair{&config.tls_cert, "tls_cert"},
                                     std::pair{&config.tls_key, "tls_key"},
                                     std::pair{&config.worker_ca, "worker_ca"},
                                     std::pair{&config.tokens_file, "tokens_file"}}) {
      if (value->empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            key, ": required with TLS (scripts/dev-certs DIR makes development certificates and "
                 "tokens); plaintext only with insecure: true / --insecure, for development"));
      }
    }
  }
  if (!(config.submit_rate_per_second >= 0) || !(config.submit_burst >= 1)) {
    return absl::InvalidArgumentError(
        "submit_rate_per_second: must not be negative (0: no limit); submit_burst: at least 1");
  }
  if (config.max_streams_per_user < 1 || config.max_streams < 1) {
    return absl::InvalidArgumentError("max_streams_per_user, max_streams: at least 1");
  }
  if (config.max_server_threads < 16) {
    return absl::InvalidArgumentError("max_server_threads (--max-server-threads): at least 16");
  }
  if (config.max_unfinished_jobs_per_user < 0) {
    return absl::InvalidArgumentError(
        "max_unfinished_jobs_per_user: must not be negative (0: no limit)");
  }
  if (config.max_user_priority < 0 || config.max_user_priority > kMaxJobPriority) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_user_priority (--max-user-priority): must be 0..%d, the spec's priority range "
        "(%d: no limit; got %d)",
        kMaxJobPriority, kMaxJobPriority, config.max_user_priority));
  }
  if (config.job_retention != absl::ZeroDuration() && config.job_retention < kMinJobRetention) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job_retention (--job-retention): 0 (finished jobs kept for good) or at least ",
        absl::FormatDuration(kMinJobRetention), " (got ",
        absl::FormatDuration(config.job_retention), ")"));
  }
  if (config.lost_worker_expiry != absl::ZeroDuration() &&
      config.lost_worker_expiry < kMinLostWorkerExpiry) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lost_worker_expiry (--lost-worker-expiry): 0 (lost workers kept for good) or at least ",
        absl::FormatDuration(kMinLostWorkerExpiry), " (got ",
        absl::FormatDuration(config.lost_worker_expiry), ")"));
  }
  return absl::OkStatus();
}

}  // namespace dropless::coordinator
