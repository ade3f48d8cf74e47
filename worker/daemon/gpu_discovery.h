// GPU discovery for the worker daemon. The daemon links no CUDA library (see docs/architecture.md):
// it loads the driver API with dlopen, asks for the device names, UUIDs and total memory and
// nothing else.
#ifndef DROPLESS_WORKER_DAEMON_GPU_DISCOVERY_H_
#define DROPLESS_WORKER_DAEMON_GPU_DISCOVERY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dropless {

inline constexpr char kCudaDriverLibrary[] = "libcuda.so.1";

struct CudaDevice {
  std::string name;  // e.g. "NVIDIA H200"
  // As nvidia-smi and DCGM's exporter print it ("GPU-" and the 16 bytes as 8-4-4-4-12 hex
  // digits), so /metrics series join with DCGM's on UUID; empty when the driver has no
  // cuDeviceGetUuid.
  std::string uuid;
  // cuDeviceTotalMem_v2; 0 when the driver has no such entry point.
  int64_t total_memory_bytes = 0;
};

// The CUDA devices in driver order (index = CUDA device ordinal = slot). An empty list, not an
// error, when the driver library cannot be loaded or reports no device; an error when the driver
// is present but fails (cuInit or a query returns another error code).
absl::StatusOr<std::vector<CudaDevice>> DiscoverCudaDevices(
    const std::string& driver_library = kCudaDriverLibrary);

}  // namespace dropless

#endif  // DROPLESS_WORKER_DAEMON_GPU_DISCOVERY_H_
