// CoordinatorConfig: how dropless-coordinator is run. Defaults, then an optional YAML file
// (configs/coordinator.yaml, same keys as the flags), then flags given on the command line.
#ifndef DROPLESS_COORDINATOR_SERVER_COORDINATOR_CONFIG_H_
#define DROPLESS_COORDINATOR_SERVER_COORDINATOR_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dropless::coordinator {

struct CoordinatorConfig {
  std::string listen = "0.0.0.0:7070";  // gRPC address
  std::string db = "dropless.db";       // SQLite file
  int metrics_port = 9090;              // /metrics; 0 disables
  std::string metrics_address = "0.0.0.0";
  int64_t heartbeat_interval_ms = 1000;
  int64_t lease_timeout_ms = 10000;
};

// Overlays the keys present in a YAML mapping onto base. Unknown keys, wrong types and files
// that cannot be read are errors naming the key or file.
absl::StatusOr<CoordinatorConfig> ApplyConfigFile(const std::string& path,
                                                  CoordinatorConfig base);
absl::StatusOr<CoordinatorConfig> ApplyConfigYaml(const std::string& yaml,
                                                  CoordinatorConfig base);

absl::Status ValidateConfig(const CoordinatorConfig& config);

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_SERVER_COORDINATOR_CONFIG_H_
