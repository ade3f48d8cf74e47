// GPU discovery for the worker daemon. The daemon links no CUDA library (see docs/architecture.md):
// it loads the driver API with dlopen, asks for the device names and nothing else.
#ifndef DROPLESS_WORKER_DAEMON_GPU_DISCOVERY_H_
#define DROPLESS_WORKER_DAEMON_GPU_DISCOVERY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dropless {

inline constexpr char kCudaDriverLibrary[] = "libcuda.so.1";

// Names of the CUDA devices in driver order (index = CUDA device ordinal = slot). An empty list,
// not an error, when the driver library cannot be loaded or reports no device; an error when the
// driver is present but fails (cuInit or a query returns another error code).
absl::StatusOr<std::vector<std::string>> DiscoverCudaDevices(
    const std::string& driver_library = kCudaDriverLibrary);

}  // namespace dropless

#endif  // DROPLESS_WORKER_DAEMON_GPU_DISCOVERY_H_
