// fp8-block quantization: row-wise 1x128 tiles, grouped column-wise 1x128 tiles or 128x128 blocks
// (transposed, from the same read; the tile kernel is fp8_block_tile.cuh's), and 128x128 weight
// blocks in both orientations. Format,
// layouts and rounding: dropless/kernels/fp8_block.h; every value is bit for bit the CPU
// reference's.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "dropless/kernels/adamw_update.h"
#include "dropless/kernels/fp8_block.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/fp8_block_math.cuh"
#include "kernels/cuda/fp8_block_tile.cuh"
#include "kernels/cuda/fp8_block_weight.cuh"
#include "kernels/cuda/padded_offsets.cuh"

namespace dropless::kernels::cuda {
namespace {

// ---- Weights: one block per 128x128 block of one expert (fp8_block_weight.cuh). ----

constexpr int kWeightThreads = 256;

__global__ void __launch_bounds__(kWeightThreads)
    WeightKernel(const uint2* __restrict__ w, int64_t k, int64_t n, bool pow2,
                 uint32_t* __restrict__ data, float* __restrict__ scales,
                 uint32_t* __restrict__ data_t, float* __restrict__ scales_t) {
  namespace fw = fp8_block_weight;
  __shared__ fw::BlockSmem<kWeightThreads> smem;
  const fw::Block b = fw::BlockOfCta(k, n);
  uint2 v[fw::kRowsPerThread<kWeightThreads>];
#pragma unroll
  for (int s = 0; s < fw::kRowsPerThread<kWeightThreads>; ++s) {
    v[s] = w[fw::ElementOf<kWeightThreads>(b, k, n, s) / 4];
  }
  fw::QuantizeBlock<kWeightThreads>(v, b, k, n, pow2, data, scales, data_t, scales_t, smem);
}

// AdamW fused with the weight quantization: one block of 512 threads per 128x128 block
// (fp8_block_weight.cuh's thread layout), each thread updating its 8 x 4 elements and quantizing
// the block from their bf16 values.
constexpr int kAdamWWeightThreads = 512;

template <typename M>  // the moments' element type: float or __nv_bfloat16 (moments.bf16)
__global__ void __launch_bounds__(kAdamWWeightThreads)
    AdamWWeightKernel(const AdamWStep* __restrict__ step, const float* __restrict__ grad,
                      float* __restrict__ param, const AdamWMoments moments, int64_t k, int64_t n,
                      bool pow2, uint32_t* __restrict__ data, float* __restrict__ scales,
                      uint32_t* __restrict__ data_t, float* __restrict__ scales_t) {
  namespace fw = fp8_block_weight;
  __shared__ fw::BlockSmem<kAdamWWeightThreads> smem;
  const AdamWStep s = *step;
  const fw::Block b = fw::BlockOfCta(k, n);
  constexpr int kRows = fw::kRowsPerThread<kAdamWWeightThreads>;
  uint2 values[kRows];
  // The loads of kLoadBatch rows in flight at once, then their updates.
  constexpr int kLoadBatch = 4;
  static_assert(kRows % kLoadBatch == 0, "whole batches of rows");
#pragma unroll
  for (int r0 = 0; r0 < kRows; r0 += kLoadBatch) {
    AdamWFour x[kLoadBatch];
#pragma unroll
    for (int q = 0; q < kLoadBatch; ++q) {
      x[q] = LoadAdamWFour<M>(fw::ElementOf<kAdamWWeightThreads>(b, k, n, r0 + q), grad, param,
                              moments);
    }
#pragma unroll
    for (int q = 0; q < kLoadBatch; ++q) {
      values[r0 + q] = ApplyAdamWFour<M>(s, fw::ElementOf<kAdamWWeightThreads>(b, k, n, r0 + q),
                                         x[q], param, moments);
    }
  }
  fw::QuantizeBlock<kAdamWWeightThreads>(values, b, k, n, pow2, data, scales, data_t, scales_t, smem);
}

// ---- Permute fused with row-wise quantization: one warp per (token, tile), the token's tile
// quantized once and stored to each of its k slots. ----

constexpr int kRowThreads = 256;

__global__ void __launch_bounds__(kRowThreads)
    PermuteKernel(const uint2* __restrict__ x, int64_t tokens, int64_t hidden, int top_k,
                  const int32_t* __restrict__ slot_of_choice, bool pow2,
                  uint32_t* __restrict__ data, float* __restrict__ scales) {
  namespace fb = fp8_block_math;
  const int lane = threadIdx.x & 31;
  const int64_t tiles_per_row = hidden / kFp8Block;
  const int64_t tiles = tokens * tiles_per_row;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kRowThreads / 32);
  for (int64_t t = (static_cast<int64_t>(blockIdx.x) * kRowThreads + threadIdx.x) / 32; t < tiles;
       t += warps) {
    const int64_t token = t / tiles_per_row, tile = t - token * tiles_per_row;
    const uint2 v = x[t * 32 + lane];
    uint32_t m = fb::MagnitudeMax(fb::MagnitudeMax(0, v.x), v.y);
    m = fb::WarpMaxBits(max(m & 0xffffu, m >> 16));
    const fb::DeviceScale s = fb::ScaleForAmax(fb::AmaxFromBits(m), pow2);
    const uint32_t q = fb::QuantizeFour(v.x, v.y, s.inverse);
    for (int j = 0; j < top_k; ++j) {
      const int64_t slot = slot_of_choice[token * top_k + j];
      if (slot < 0) continue;
      data[(slot * tiles_per_row + tile) * 32 + lane] = q;
      if (lane == 0) scales[slot * tiles_per_row + tile] = s.scale;
    }
  }
}

// ---- Row-wise dequantization to bf16: four elements per thread. ----

__global__ void __launch_bounds__(kRowThreads)
    DequantizeKernel(const uint32_t* __restrict__ data, const float* __restrict__ scales,
                     int64_t rows, int64_t cols, const int32_t* __restrict__ num_rows,
                     uint2* __restrict__ out) {
  const int64_t live =
      num_rows == nullptr ? rows : min(rows, static_cast<int64_t>(max(0, *num_rows)));
  const int64_t total = live * (cols / 4);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t q = data[i];
    const float scale = scales[i / (kFp8Block / 4)];  // 32 words per 128-element tile
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(q & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(q >> 16), __NV_E4M3);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    out[i] = make_uint2(detail::PackBf16x2(__fmul_rn(a.x, scale), __fmul_rn(a.y, scale)),
                        detail::PackBf16x2(__fmul_rn(b.x, scale), __fmul_rn(b.y, scale)));
  }
}

// The source of PermuteFp8BlockGrouped and UnpermuteCombineBackwardFp8Block: row (slot) s is the
// token row of its choice c = choice_of_slot[s], x[c / k] (Permute's rows), or with weights
// w[c] * x[c / k] rounded to bf16 as the combine's backward rounds its row gradient (permute.h),
// gathered from the token rows instead of read from a stored copy.
struct GatheredTokenTiles {
  const Bf16* x;
  const int32_t* choice_of_slot;
  const float* weights;  // null: the rows themselves
  int64_t hidden;
  int top_k;
  __device__ __forceinline__ uint4 Load(int64_t row, int64_t col) const {
    const int32_t choice = choice_of_slot[row];
    const uint4 v = *reinterpret_cast<const uint4*>(x + (choice / top_k) * hidden + col);
    if (weights == nullptr) return v;
    const float w = weights[choice];
    float g[8];
    detail::Unpack8(v, g);
#pragma unroll
    for (int e = 0; e < 8; ++e) g[e] = __fmul_rn(w, g[e]);
    return detail::Pack8(g);
  }
};

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// One launch of the tile quantizer over the T*k slots of `shape`, gathering through the plan.
absl::Status GatheredTiles(const PermuteShape& shape, const Bf16* x, const int32_t* choice_of_slot,
                           const float* weights, const int32_t* group_offsets, int num_groups,
                           const Fp8BlockRowwise* rowwise, const Fp8BlockColwise* colwise,
                           Fp8ScaleMode mode, cudaStream_t stream) {
  if (absl::Status s = ValidatePermuteShape(shape, /*mxfp8=*/false); !s.ok()) return s;
  const int64_t rows = shape.num_tokens * shape.top_k;
  if (rows > 0 && (x == nullptr || choice_of_slot == nullptr)) {
    return absl::InvalidArgumentError("x: x and choice_of_slot must be set");
  }
  // x stands for the T*k rows it expands to (the validation only checks that it is set).
  const Fp8BlockQuantizeShape quantize{rows, shape.hidden, num_groups, mode};
  if (absl::Status s = ValidateFp8BlockQuantize(quantize, x, rowwise, colwise); !s.ok()) return s;
  if (!Aligned(x, 16)) return absl::InvalidArgumentError("x: must be 16-byte aligned");
  return fp8_block_tile::LaunchTiles(
      quantize, GatheredTokenTiles{x, choice_of_slot, weights, shape.hidden, shape.top_k},
      group_offsets, rowwise, colwise, stream);
}

}  // namespace

absl::Status QuantizeFp8Block(const Fp8BlockQuantizeShape& shape, const Bf16* x,
                              const int32_t* group_offsets, const Fp8BlockRowwise* rowwise,
                              const Fp8BlockColwise* colwise, Stream stream) {
  if (absl::Status s = ValidateFp8BlockQuantize(shape, x, rowwise, colwise); !s.ok()) return s;
  // The tile kernel reads x in 16-byte row pieces.
  if (!Aligned(x, 16)) return absl::InvalidArgumentError("x: must be 16-byte aligned");
  return fp8_block_tile::LaunchTiles(shape, fp8_block_tile::Bf16Tiles{x, shape.cols}, group_offsets,
                                     rowwise, colwise, stream);
}

absl::Status QuantizeFp8BlockWeights(const Fp8BlockWeightShape& shape, const Bf16* w,
                                     const Fp8BlockWeights& out, Stream stream) {
  if (absl::Status s = ValidateFp8BlockWeights(shape, w, out); !s.ok()) return s;
  if (!Aligned(w, 8)) return absl::InvalidArgumentError("w: must be 8-byte aligned");
  if (!Aligned(out.data, 4) || !Aligned(out.data_t, 4)) {
    return absl::InvalidArgumentError("out.data: data and data_t must be 4-byte aligned");
  }
  const int64_t blocks = shape.num_experts * (shape.k / kFp8Block) * (shape.n / kFp8Block);
  if (blocks > INT32_MAX) return absl::InvalidArgumentError("num_experts: too many blocks");
  WeightKernel<<<static_cast<unsigned>(blocks), kWeightThreads, 0, stream>>>(
      reinterpret_cast<const uint2*>(w), shape.k, shape.n,
      shape.mode == Fp8ScaleMode::kPowerOfTwo, reinterpret_cast<uint32_t*>(out.data), out.scales,
      reinterpret_cast<uint32_t*>(out.data_t), out.scales_t);
  return LaunchStatus("Fp8Block WeightKernel");
}

absl::Status AdamWQuantizeFp8BlockWeights(const Fp8BlockWeightShape& shape, const AdamWStep* step,
                                          const float* grad, float* param,
                                          const AdamWMoments& moments, const Fp8BlockWeights& out,
                                          Stream stream) {
  if (absl::Status s = ValidateFp8BlockWeights(shape, reinterpret_cast<const Bf16*>(param), out);
      !s.ok()) {
    return s;
  }
  if (step == nullptr || grad == nullptr || moments.m == nullptr || moments.v == nullptr) {
    return absl::InvalidArgumentError("step: step, grad, moments.m and moments.v must be set");
  }
  if (!Aligned(param, 16) || !Aligned(grad, 16)) {
    return absl::InvalidArgumentError("param: param and grad must be 16-byte aligned");
  }
  if (!Aligned(moments.m, 4 * moments.element_bytes()) ||
      !Aligned(moments.v, 4 * moments.element_bytes())) {
    return absl::InvalidArgumentError(
        "moments: m and v must be aligned to four elements (16 bytes fp32, 8 bytes bf16)");
  }
  if (!Aligned(out.data, 4) || !Aligned(out.data_t, 4)) {
    return absl::InvalidArgumentError("out.data: data and data_t must be 4-byte aligned");
  }
  const int64_t blocks = shape.num_experts * (shape.k / kFp8Block) * (shape.n / kFp8Block);
  if (blocks > INT32_MAX) return absl::InvalidArgumentError("num_experts: too many blocks");
  const bool pow2 = shape.mode == Fp8ScaleMode::kPowerOfTwo;
  auto* data = reinterpret_cast<uint32_t*>(out.data);
  auto* data_t = reinterpret_cast<uint32_t*>(out.data_t);
  const unsigned grid = static_cast<unsigned>(blocks);
  auto kernel = moments.bf16 ? AdamWWeightKernel<__nv_bfloat16> : AdamWWeightKernel<float>;
  kernel<<<grid, kAdamWWeightThreads, 0, stream>>>(step, grad, param, moments, shape.k, shape.n,
                                                   pow2, data, out.scales, data_t, out.scales_t);
  return LaunchStatus("Fp8Block AdamWWeightKernel");
}

absl::Status DequantizeFp8BlockRowwise(int64_t rows, int64_t cols, const int32_t* num_rows,
                                       const uint8_t* data, const float* scales, Bf16* out,
                                       Stream stream) {
  if (rows < 0) return absl::InvalidArgumentError("rows: must be >= 0");
  if (cols <= 0 || cols % kFp8Block != 0) {
    return absl::InvalidArgumentError("cols: must be a positive multiple of 128");
  }
  if (rows == 0) return absl::OkStatus();
  if (data == nullptr || scales == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("data: data, scales and out must be set");
  }
  if (!Aligned(data, 4) || !Aligned(out, 8)) {
    return absl::InvalidArgumentError("data: data must be 4-byte and out 8-byte aligned");
  }
  DequantizeKernel<<<GridStrideBlocks(rows * cols / 4, kRowThreads), kRowThreads, 0, stream>>>(
      reinterpret_cast<const uint32_t*>(data), scales, rows, cols, num_rows,
      reinterpret_cast<uint2*>(out));
  return LaunchStatus("Fp8Block DequantizeKernel");
}

absl::Status PermuteFp8Block(const PermuteShape& shape, const Bf16* x,
                             const int32_t* slot_of_choice, const Fp8BlockRowwise& rows,
                             Fp8ScaleMode mode, Stream stream) {
  if (absl::Status s = ValidatePermuteShape(shape, /*mxfp8=*/false); !s.ok()) return s;
  if (shape.hidden % kFp8Block != 0) {
    return absl::InvalidArgumentError("hidden: must be a multiple of 128 for fp8-block");
  }
  if (shape.num_tokens == 0) return absl::OkStatus();
  if (x == nullptr || slot_of_choice == nullptr || rows.data == nullptr || rows.scales == nullptr) {
    return absl::InvalidArgumentError("x: x, slot_of_choice and rows must be set");
  }
  if (!Aligned(x, 8) || !Aligned(rows.data, 4)) {
    return absl::InvalidArgumentError("x: x must be 8-byte and rows.data 4-byte aligned");
  }
  const int blocks =
      GridStrideBlocks(shape.num_tokens * (shape.hidden / kFp8Block), kRowThreads / 32);
  PermuteKernel<<<blocks, kRowThreads, 0, stream>>>(
      reinterpret_cast<const uint2*>(x), shape.num_tokens, shape.hidden, shape.top_k,
      slot_of_choice, mode == Fp8ScaleMode::kPowerOfTwo, reinterpret_cast<uint32_t*>(rows.data),
      rows.scales);
  return LaunchStatus("Fp8Block PermuteKernel");
}

absl::Status PermuteFp8BlockGrouped(const PermuteShape& shape, const Bf16* x,
                                    const int32_t* choice_of_slot, const int32_t* group_offsets,
                                    int num_groups, const Fp8BlockRowwise* rowwise,
                                    const Fp8BlockColwise* colwise, Fp8ScaleMode mode,
                                    Stream stream) {
  return GatheredTiles(shape, x, choice_of_slot, nullptr, group_offsets, num_groups, rowwise,
                       colwise, mode, stream);
}

absl::Status UnpermuteCombineBackwardFp8Block(const PermuteShape& shape, const Bf16* d_y,
                                              const int32_t* choice_of_slot, const float* weights,
                                              const int32_t* group_offsets, int num_groups,
                                              const Fp8BlockRowwise* rowwise,
                                              const Fp8BlockColwise* colwise, Fp8ScaleMode mode,
                                              Stream stream) {
  if (shape.num_tokens > 0 && weights == nullptr) {
    return absl::InvalidArgumentError("weights: is null");
  }
  return GatheredTiles(shape, d_y, choice_of_slot, weights, group_offsets, num_groups, rowwise,
                       colwise, mode, stream);
}

}  // namespace dropless::kernels::cuda
