// Zero gradient for experts that received no tokens: the grouped GEMM gives such a group no tile.
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/grouped_gemm/grouped_gemm_runner.h"

namespace dropless::kernels::grouped_gemm_internal {
namespace {

// grid.y = group; the blocks of a non-empty group return at once, so the launch costs a few
// microseconds when every group has tokens.
__global__ void ZeroEmptyGroupsKernel(const int32_t* __restrict__ offsets, int64_t max_rows,
                                      int64_t bytes_per_group, char* d) {
  const int e = blockIdx.y;
  const int64_t begin = min(max(static_cast<int64_t>(offsets[e]), int64_t{0}), max_rows);
  const int64_t end = min(max(static_cast<int64_t>(offsets[e + 1]), begin), max_rows);
  if (end != begin) return;
  char* group = d + e * bytes_per_group;
  // bytes_per_group is a multiple of 16 (k and n are multiples of 8) and d is 16-byte aligned.
  const int64_t vectors = bytes_per_group / 16;
  const int4 zero = make_int4(0, 0, 0, 0);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vectors;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    reinterpret_cast<int4*>(group)[i] = zero;
  }
}

}  // namespace

absl::Status ZeroEmptyGroups(const int32_t* offsets, int num_groups, int64_t max_rows,
                             int64_t elements_per_group, int element_bytes, void* d,
                             cudaStream_t stream) {
  if (num_groups == 0) return absl::OkStatus();
  const int threads = 256;
  const dim3 grid(16, num_groups);
  ZeroEmptyGroupsKernel<<<grid, threads, 0, stream>>>(
      offsets, max_rows, elements_per_group * element_bytes, static_cast<char*>(d));
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("grouped gemm: zero-empty-groups launch: ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

}  // namespace dropless::kernels::grouped_gemm_internal
