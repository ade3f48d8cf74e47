// CUDA and cuBLASLt return codes as absl::Status, and the launch check every launcher ends with.
#ifndef DROPLESS_KERNELS_CUDA_CUDA_CHECK_H_
#define DROPLESS_KERNELS_CUDA_CUDA_CHECK_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dropless::kernels::cuda {

absl::Status CudaStatus(cudaError_t error, const char* what);
absl::Status CublasStatus(cublasStatus_t status, const char* what);

// The current device's multiprocessor count and shared memory per multiprocessor, queried once
// per device. A failed query is not cached and its error is cleared (the next launch check then
// reports that launch's own error, not the query's); the answer is then an H100's / H200's.
struct DeviceShape {
  int multiprocessors = 132;
  int smem_per_multiprocessor = 228 * 1024;
};
DeviceShape CurrentDeviceShape();

// Blocks for a grid-stride loop over `work_items` items, `items_per_block` per block per pass:
// enough to fill the current device (16 blocks per multiprocessor), never more than the work.
int GridStrideBlocks(int64_t work_items, int64_t items_per_block);

// After a launch: the launch error (bad configuration, no kernel image for the device).
absl::Status LaunchStatus(const char* kernel);

}  // namespace dropless::kernels::cuda

#define DROPLESS_CUDA_RETURN_IF_ERROR(expr)                                          \
  do {                                                                               \
    if (absl::Status _s = ::dropless::kernels::cuda::CudaStatus((expr), #expr); !_s.ok()) \
      return _s;                                                                     \
  } while (0)

#endif  // DROPLESS_KERNELS_CUDA_CUDA_CHECK_H_
