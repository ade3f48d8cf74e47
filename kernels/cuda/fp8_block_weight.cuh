// One 128x128 block of an [E][k][n] expert weight to fp8-block (fp8_block.h: one fp32 scale per
// block, W and W^T), from bf16 values already in the block's registers. Shared by the weight
// quantizer (fp8_block.cu's WeightKernel, which loads the bf16 weight) and AdamW fused with the
// quantization (fp8_block.cu's AdamWWeightKernel, which computes the bf16 values from the updated
// fp32 masters), so that both write the same bits.
//
// A block runs on kThreads threads (256 or 512; W warps = kThreads / 32): thread t holds rows
// t / 32 + W s (s < RowsPerThread), columns 4 (t % 32) .. + 3 of the block, as four bf16 in a
// uint2. The block's amax meets in
// shared memory; the E4M3 bytes go out as W (4-byte stores along n) and, through a shared-memory
// byte tile, as W^T (4-byte stores along k).
#ifndef DROPLESS_KERNELS_CUDA_FP8_BLOCK_WEIGHT_CUH_
#define DROPLESS_KERNELS_CUDA_FP8_BLOCK_WEIGHT_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "dropless/kernels/fp8_block.h"
#include "kernels/cuda/fp8_block_math.cuh"

namespace dropless::kernels::cuda::fp8_block_weight {

template <int kThreads>
inline constexpr int kRowsPerThread = kFp8Block / (kThreads / 32);
inline constexpr int kBytePitch = kFp8Block + 4;

template <int kThreads>
struct BlockSmem {
  static_assert(kThreads == 256 || kThreads == 512, "a block runs on 256 or 512 threads");
  uint8_t bytes[kFp8Block * kBytePitch];
  uint32_t warp_max[kThreads / 32];
};

// The block blockIdx.x of an [E][k][n] weight: expert e, block row i (along k), block column j.
struct Block {
  int64_t e, i, j;
};
__device__ __forceinline__ Block BlockOfCta(int64_t k, int64_t n) {
  const int64_t kb = k / kFp8Block, nb = n / kFp8Block;
  return Block{blockIdx.x / (kb * nb), (blockIdx.x / nb) % kb, blockIdx.x % nb};
}

// Element index of the first of the four columns the calling thread holds in row slot s.
template <int kThreads>
__device__ __forceinline__ int64_t ElementOf(const Block& b, int64_t k, int64_t n, int s) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = b.e * k + b.i * kFp8Block + warp + (kThreads / 32) * s;
  return row * n + b.j * kFp8Block + 4 * lane;
}

// Quantizes the block from v (the thread's bf16 values, see above). data / scales (W) and
// data_t / scales_t (W^T) may each be null.
template <int kThreads>
__device__ __forceinline__ void QuantizeBlock(const uint2 (&v)[kRowsPerThread<kThreads>],
                                              const Block& b, int64_t k, int64_t n, bool pow2,
                                              uint32_t* data, float* scales, uint32_t* data_t,
                                              float* scales_t, BlockSmem<kThreads>& smem) {
  constexpr int kWarps = kThreads / 32, kRows = kRowsPerThread<kThreads>;
  using fp8_block_math::AmaxFromBits;
  using fp8_block_math::DeviceScale;
  using fp8_block_math::MagnitudeMax;
  using fp8_block_math::QuantizeFour;
  using fp8_block_math::ScaleForAmax;
  using fp8_block_math::WarpMaxBits;
  const int64_t kb = k / kFp8Block, nb = n / kFp8Block;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint32_t m = 0;
#pragma unroll
  for (int s = 0; s < kRows; ++s) m = MagnitudeMax(MagnitudeMax(m, v[s].x), v[s].y);
  m = WarpMaxBits(max(m & 0xffffu, m >> 16));
  if (lane == 0) smem.warp_max[warp] = m;
  __syncthreads();
  m = 0;
#pragma unroll
  for (int q = 0; q < kWarps; ++q) m = max(m, smem.warp_max[q]);
  const DeviceScale sc = ScaleForAmax(AmaxFromBits(m), pow2);
#pragma unroll
  for (int s = 0; s < kRows; ++s) {
    const int r = warp + kWarps * s;
    const uint32_t q = QuantizeFour(v[s].x, v[s].y, sc.inverse);
    if (data != nullptr) data[ElementOf<kThreads>(b, k, n, s) / 4] = q;
    *reinterpret_cast<uint32_t*>(smem.bytes + r * kBytePitch + 4 * lane) = q;
  }
  if (threadIdx.x == 0) {
    if (scales != nullptr) scales[(b.e * kb + b.i) * nb + b.j] = sc.scale;
    if (scales_t != nullptr) scales_t[(b.e * nb + b.j) * kb + b.i] = sc.scale;
  }
  if (data_t == nullptr) return;
  __syncthreads();
#pragma unroll
  for (int s = 0; s < kRows; ++s) {
    const int c = warp + kWarps * s;  // a column of the block: a row of W^T
    uint32_t packed = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      packed |= static_cast<uint32_t>(smem.bytes[(4 * lane + q) * kBytePitch + c]) << (8 * q);
    }
    data_t[((b.e * n + b.j * kFp8Block + c) * k + b.i * kFp8Block) / 4 + lane] = packed;
  }
}

}  // namespace dropless::kernels::cuda::fp8_block_weight

#endif  // DROPLESS_KERNELS_CUDA_FP8_BLOCK_WEIGHT_CUH_
