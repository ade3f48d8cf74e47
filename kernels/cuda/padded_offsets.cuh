// Group offsets padded to a multiple of kPad rows (the column-wise quantized layouts of mxfp8.h,
// kPad = 32, and fp8_block.h, kPad = 128): padded[0] = 0, padded[g + 1] = padded[g] +
// RoundUp(count_g, kPad). One block of kScanThreads computes every group, any group count.
#ifndef DROPLESS_KERNELS_CUDA_PADDED_OFFSETS_CUH_
#define DROPLESS_KERNELS_CUDA_PADDED_OFFSETS_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace dropless::kernels::cuda::detail {

constexpr int kScanThreads = 1024;

// group_offsets null: one group of `rows` rows.
template <int kPad>
__global__ void __launch_bounds__(kScanThreads)
    PaddedOffsetsKernel(const int32_t* __restrict__ group_offsets, int num_groups, int64_t rows,
                        int32_t* __restrict__ padded_offsets) {
  constexpr unsigned kMask = 0xffffffffu;
  __shared__ int32_t warp_sums[kScanThreads / 32];
  __shared__ int32_t carry;
  if (threadIdx.x == 0) carry = 0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int base = 0; base < num_groups; base += kScanThreads) {
    __syncthreads();
    const int g = base + threadIdx.x;
    int32_t padded = 0;
    if (g < num_groups) {
      const int32_t count = group_offsets == nullptr ? static_cast<int32_t>(rows)
                                                     : group_offsets[g + 1] - group_offsets[g];
      padded = (max(count, 0) + kPad - 1) / kPad * kPad;
    }
    int32_t inclusive = padded;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t n = __shfl_up_sync(kMask, inclusive, o);
      if (lane >= o) inclusive += n;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
      int32_t s = warp_sums[lane];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int32_t n = __shfl_up_sync(kMask, s, o);
        if (lane >= o) s += n;
      }
      warp_sums[lane] = s;  // inclusive over warps
    }
    __syncthreads();
    const int32_t before = carry + (warp > 0 ? warp_sums[warp - 1] : 0) + inclusive - padded;
    if (g < num_groups) padded_offsets[g] = before;
    __syncthreads();
    if (threadIdx.x == kScanThreads - 1) carry = before + padded;
  }
  __syncthreads();
  if (threadIdx.x == 0) padded_offsets[num_groups] = carry;
}

}  // namespace dropless::kernels::cuda::detail

#endif  // DROPLESS_KERNELS_CUDA_PADDED_OFFSETS_CUH_
