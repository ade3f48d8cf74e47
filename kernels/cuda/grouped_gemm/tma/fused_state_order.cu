// ReorderFusedState (dropless/kernels/grouped_wgrad_adamw.h): an expert weight's AdamW state
// between [E][k][n] and fused_state_order.h's order, one expert at a time (an expert's elements
// occupy the same index range in both orders).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "dropless/kernels/fused_state_order.h"
#include "dropless/kernels/grouped_wgrad_adamw.h"

namespace dropless::kernels {
namespace {

// One expert: element (r, c) of the [k][n] `row_major` to or from its place in `fused`.
template <typename T>
__global__ void ReorderExpertKernel(const T* src, T* dst, int64_t k, int64_t n, bool to_fused) {
  const int64_t count = k * n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t f = FusedStateIndex(0, i / n, i % n, k, n);
    if (to_fused) {
      dst[f] = src[i];
    } else {
      dst[i] = src[f];
    }
  }
}

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("reorder fused state: ", what, ": ", cudaGetErrorString(e)));
}

}  // namespace

absl::Status ReorderFusedState(void* data, int element_bytes, int64_t experts, int64_t k, int64_t n,
                               bool to_fused, void* scratch, cudaStream_t stream) {
  if (data == nullptr || scratch == nullptr || (element_bytes != 2 && element_bytes != 4) ||
      experts < 0 || k <= 0 || n <= 0 || k % kFusedStateTile != 0 || n % kFusedStateTile != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reorder fused state: needs data, scratch, 2- or 4-byte elements and k, n multiples of ",
        kFusedStateTile, "; got ", element_bytes, "-byte elements, ", k, " x ", n));
  }
  const int64_t bytes = k * n * element_bytes;
  const int blocks = static_cast<int>(std::min<int64_t>((k * n + 255) / 256, 4096));
  for (int64_t e = 0; e < experts; ++e) {
    char* expert = static_cast<char*>(data) + e * bytes;
    if (absl::Status s = CudaStatus(
            cudaMemcpyAsync(scratch, expert, bytes, cudaMemcpyDeviceToDevice, stream), "copy");
        !s.ok()) {
      return s;
    }
    if (element_bytes == 4) {
      ReorderExpertKernel<<<blocks, 256, 0, stream>>>(
          static_cast<const float*>(scratch), reinterpret_cast<float*>(expert), k, n, to_fused);
    } else {
      ReorderExpertKernel<<<blocks, 256, 0, stream>>>(static_cast<const uint16_t*>(scratch),
                                                      reinterpret_cast<uint16_t*>(expert), k, n,
                                                      to_fused);
    }
    if (absl::Status s = CudaStatus(cudaGetLastError(), "launch"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace dropless::kernels
