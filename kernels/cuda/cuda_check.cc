#include "kernels/cuda/cuda_check.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"

namespace dropless::kernels::cuda {

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  // The runtime also keeps a failed call's error as the last error; this status reports it, so
  // it is consumed here: the next launch check (LaunchStatus) then reports that launch's own
  // error, not a failed allocation's or query's from before. Sticky errors stay regardless.
  (void)cudaGetLastError();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")"));
}

absl::Status CublasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": cuBLASLt status ", static_cast<int>(status)));
}

DeviceShape CurrentDeviceShape() {
  constexpr int kMaxDevices = 64;
  // Per device: multiprocessors and shared memory, 0 until known.
  static std::atomic<int64_t> known[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    (void)cudaGetLastError();  // the query's own error (every launch before it was checked)
    return DeviceShape{};
  }
  const int64_t cached = known[device].load(std::memory_order_relaxed);
  if (cached != 0) {
    return DeviceShape{static_cast<int>(cached >> 32), static_cast<int>(cached & 0xffffffff)};
  }
  DeviceShape shape;
  if (cudaDeviceGetAttribute(&shape.multiprocessors, cudaDevAttrMultiProcessorCount, device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&shape.smem_per_multiprocessor,
                             cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess ||
      shape.multiprocessors <= 0 || shape.smem_per_multiprocessor <= 0) {
    (void)cudaGetLastError();
    return DeviceShape{};
  }
  known[device].store((int64_t{shape.multiprocessors} << 32) | shape.smem_per_multiprocessor,
                      std::memory_order_relaxed);
  return shape;
}

int GridStrideBlocks(int64_t work_items, int64_t items_per_block) {
  const int sms = CurrentDeviceShape().multiprocessors;
  const int64_t blocks = (work_items + items_per_block - 1) / items_per_block;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t{sms} * 16)));
}

absl::Status LaunchStatus(const char* kernel) {
  return CudaStatus(cudaGetLastError(), kernel);
}

}  // namespace dropless::kernels::cuda
