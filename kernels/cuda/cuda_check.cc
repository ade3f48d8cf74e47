#include "kernels/cuda/cuda_check.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dropless::kernels::cuda {

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")"));
}

absl::Status CublasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": cuBLASLt status ", static_cast<int>(status)));
}

int GridStrideBlocks(int64_t work_items, int64_t items_per_block) {
  int device = 0, sms = 132;
  if (cudaGetDevice(&device) == cudaSuccess) {
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  const int64_t blocks = (work_items + items_per_block - 1) / items_per_block;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t{sms} * 16)));
}

absl::Status LaunchStatus(const char* kernel) {
  return CudaStatus(cudaGetLastError(), kernel);
}

}  // namespace dropless::kernels::cuda
