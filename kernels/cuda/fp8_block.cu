// fp8-block quantization: row-wise 1x128 tiles, grouped column-wise 1x128 tiles (transposed, from
// the same read), and 128x128 weight blocks in both orientations. Format, layouts and rounding:
// dropless/kernels/fp8_block.h; every value is bit for bit the CPU reference's.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "dropless/kernels/fp8_block.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/fp8_block_math.cuh"
#include "kernels/cuda/fp8_block_weight.cuh"
#include "kernels/cuda/padded_offsets.cuh"

namespace dropless::kernels::cuda {
namespace {

using detail::kFullMask;
using fp8_block_math::AmaxFromBits;
using fp8_block_math::DeviceScale;
using fp8_block_math::MagnitudeMax;
using fp8_block_math::QuantizeFour;
using fp8_block_math::ScaleForAmax;
using fp8_block_math::WarpMaxBits;

__device__ __forceinline__ int64_t LiveRows(int64_t rows, const int32_t* offsets, int groups) {
  if (offsets == nullptr) return rows;
  return min(rows, static_cast<int64_t>(max(0, offsets[groups])));
}

// The row-wise output's first live row: offsets[0] (0 for whole buffers).
__device__ __forceinline__ int64_t FirstLiveRow(int64_t rows, const int32_t* offsets) {
  if (offsets == nullptr) return 0;
  return min(rows, static_cast<int64_t>(max(0, offsets[0])));
}

// ---- Row-wise only: one warp per 1x128 tile, four elements per lane; each warp loads two tiles
// before it quantizes either. ----

constexpr int kRowThreads = 256;

// One row-wise tile t from its loaded elements v: the E4M3 word of the lane and the tile's scale.
__device__ __forceinline__ void QuantizeRowTile(uint2 v, int64_t t, int lane, bool pow2,
                                                uint32_t* __restrict__ data,
                                                float* __restrict__ scales) {
  uint32_t m = MagnitudeMax(MagnitudeMax(0, v.x), v.y);
  m = WarpMaxBits(max(m & 0xffffu, m >> 16));
  const DeviceScale s = ScaleForAmax(AmaxFromBits(m), pow2);
  data[t * 32 + lane] = QuantizeFour(v.x, v.y, s.inverse);
  if (lane == 0) scales[t] = s.scale;
}

__global__ void __launch_bounds__(kRowThreads)
    RowwiseKernel(const uint2* __restrict__ x, int64_t rows, int64_t cols,
                  const int32_t* __restrict__ offsets, int groups, bool pow2,
                  uint32_t* __restrict__ data, float* __restrict__ scales) {
  const int lane = threadIdx.x & 31;
  const int64_t tiles = LiveRows(rows, offsets, groups) * (cols / kFp8Block);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kRowThreads / 32);
  for (int64_t t = FirstLiveRow(rows, offsets) * (cols / kFp8Block) +
                   (static_cast<int64_t>(blockIdx.x) * kRowThreads + threadIdx.x) / 32;
       t < tiles; t += 2 * warps) {
    // tile t = elements [128 t, 128 t + 128) of the row-major x
    const bool second = t + warps < tiles;  // warp-uniform
    const uint2 v0 = x[t * 32 + lane];
    const uint2 v1 = second ? x[(t + warps) * 32 + lane] : make_uint2(0, 0);
    QuantizeRowTile(v0, t, lane, pow2, data, scales);
    if (second) QuantizeRowTile(v1, t + warps, lane, pow2, data, scales);
  }
}

// ---- Row-wise and/or column-wise from one read: one block per (128 padded rows, 128 columns). ----
//
// The block stages its tile (the live rows of one group, zeros past them) in shared memory with a
// row pitch of 65 words, so that a warp reading one column over 32 consecutive rows touches 32
// different banks; each thread issues all its 16 loads before storing any. Column-wise: warp w
// quantizes the column pairs 2w, 2w + 16, ... (a pair shares each staged word): lane l holds
// rows l, l + 32, l + 64, l + 96 of both columns, the pair's two amaxes are reduced together, and
// four shuffles regroup the E4M3 bytes so that lane l stores rows 4l .. 4l + 3 of a column as one
// word: the warp writes each column's 128 output bytes in one store. Row-wise: warp w quantizes
// rows w, w + 8, ... of the live rows, four elements per lane. A warp computes the scales of its
// 16 columns (or rows) in one pass, a lane each, and shuffles each line's inverse to the warp.
// 64 registers (4 blocks per multiprocessor), no spills.

constexpr int kTileThreads = 256;
constexpr int kTileWarps = kTileThreads / 32;
constexpr int kPitchWords = kFp8Block / 2 + 1;
constexpr int kTileLoads = kFp8Block * (kFp8Block / 4) / kTileThreads;  // uint2 loads per thread

// Rows lane, lane + 32, lane + 64, lane + 96 of one column (the bf16 bit patterns in half[]),
// quantized with `inverse`, regrouped so that the lane returns rows 4 lane .. 4 lane + 3 as one
// word (low byte first).
__device__ __forceinline__ uint32_t ColumnWord(const uint32_t (&half)[4], float inverse,
                                               int lane) {
  uint32_t mine = 0;  // byte s: row lane + 32 s
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const float v = __fmul_rn(__uint_as_float(half[s] << 16), inverse);
    const uint32_t q = isnan(inverse) ? kE4M3Nan : (detail::E4M3x2(v, 0.0f) & 0xffu);
    mine |= q << (8 * s);
  }
  // Row 4 lane + b sits in lane (4 lane + b) % 32, byte (4 lane + b) / 32 = lane / 8.
  const int byte = 8 * (lane >> 3);
  uint32_t word = 0;
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const uint32_t from = __shfl_sync(kFullMask, mine, (4 * lane + b) & 31);
    word |= ((from >> byte) & 0xffu) << (8 * b);
  }
  return word;
}

__global__ void __launch_bounds__(kTileThreads, 4)
    TileKernel(const Bf16* __restrict__ x, int64_t rows, int64_t cols,
               const int32_t* __restrict__ offsets, int groups, bool pow2,
               const int32_t* __restrict__ padded_offsets, int64_t padded_rows,
               uint32_t* __restrict__ row_data, float* __restrict__ row_scales,
               uint8_t* __restrict__ col_data, float* __restrict__ col_scales) {
  __shared__ uint32_t tile[kFp8Block * kPitchWords];
  __shared__ int32_t source_row, live;
  const int64_t segs = cols / kFp8Block;
  const int64_t tile_row = static_cast<int64_t>(blockIdx.x) / segs;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) - tile_row * segs) * kFp8Block;
  const int32_t p0 = static_cast<int32_t>(tile_row * kFp8Block);
  if (p0 >= padded_offsets[groups]) return;  // past the last group: block-uniform
  if (threadIdx.x < 32) {
    // The group g: the last with padded_offsets[g] <= p0 (groups are padded to whole tiles, so
    // the tile lies in one group; empty groups have no padded rows). Offsets never decrease, so g
    // is the count of g' in [1, G) with padded_offsets[g'] <= p0: the warp counts them with
    // independent loads (one memory latency, where a binary search waits for log2(G) in turn).
    const int lane = threadIdx.x;
    int g = 0;
#pragma unroll 8
    for (int i = 1 + lane; i < groups; i += 32) g += padded_offsets[i] <= p0 ? 1 : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) g += __shfl_xor_sync(kFullMask, g, o);
    if (lane == 0) {
      const int32_t local = p0 - padded_offsets[g];
      const int32_t begin = offsets == nullptr ? 0 : offsets[g];
      const int32_t count =
          offsets == nullptr ? static_cast<int32_t>(rows) : offsets[g + 1] - begin;
      source_row = begin + local;
      live = min(kFp8Block, max(0, count - local));
    }
  }
  __syncthreads();
  const int32_t first = source_row, n = live;
  // Stage the tile: 128 rows of 128 bf16 columns, 8-byte loads (32 per row), all in flight at once.
  const uint2* src = reinterpret_cast<const uint2*>(x);
  uint2 v[kTileLoads];
#pragma unroll
  for (int j = 0; j < kTileLoads; ++j) {
    const int i = threadIdx.x + j * kTileThreads;
    const int r = i / (kFp8Block / 4), q = i % (kFp8Block / 4);
    v[j] = r < n ? src[((first + r) * cols + c0) / 4 + q] : make_uint2(0, 0);
  }
#pragma unroll
  for (int j = 0; j < kTileLoads; ++j) {
    const int i = threadIdx.x + j * kTileThreads;
    const int r = i / (kFp8Block / 4), q = i % (kFp8Block / 4);
    tile[r * kPitchWords + 2 * q] = v[j].x;
    tile[r * kPitchWords + 2 * q + 1] = v[j].y;
  }
  __syncthreads();
  // Each warp first finds the amaxes of all its lines (lane i keeps line i's), computes their
  // scales in one pass (one per lane, instead of every lane computing each line's), then
  // quantizes with the line's inverse taken from its lane.
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (col_data != nullptr) {
    constexpr int kPairs = kFp8Block / 2 / kTileWarps;  // column pairs per warp: 2 warp + 16 k
    uint32_t w[kPairs][4];
    uint32_t amax = 0;  // lane 2 k + h: column 2 (warp + 8 k) + h
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      const int pair = warp + kTileWarps * k;
      uint32_t m = 0;  // the two columns' magnitudes, packed as the words are
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        w[k][s] = tile[(lane + 32 * s) * kPitchWords + pair];
        m = MagnitudeMax(m, w[k][s]);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = __vmaxu2(m, __shfl_xor_sync(kFullMask, m, o));
      if (lane == 2 * k) amax = m & 0xffffu;
      if (lane == 2 * k + 1) amax = m >> 16;
    }
    const DeviceScale mine = ScaleForAmax(AmaxFromBits(amax), pow2);
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      const int pair = warp + kTileWarps * k;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int c = 2 * pair + half;
        const float inverse = __shfl_sync(kFullMask, mine.inverse, 2 * k + half);
        uint32_t bits[4];
#pragma unroll
        for (int s = 0; s < 4; ++s) bits[s] = half == 0 ? (w[k][s] & 0xffffu) : (w[k][s] >> 16);
        const uint32_t word = ColumnWord(bits, inverse, lane);
        reinterpret_cast<uint32_t*>(col_data + (c0 + c) * padded_rows + p0)[lane] = word;
        if (lane == 2 * k + half) col_scales[tile_row * cols + c0 + c] = mine.scale;
      }
    }
  }
  if (row_data != nullptr) {
    constexpr int kRows = kFp8Block / kTileWarps;  // rows per warp: warp + 8 k
    uint32_t w[kRows][2];
    uint32_t amax = 0;  // lane k: row warp + 8 k
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int r = warp + kTileWarps * k;
      if (r >= n) break;  // warp-uniform
      w[k][0] = tile[r * kPitchWords + 2 * lane];
      w[k][1] = tile[r * kPitchWords + 2 * lane + 1];
      uint32_t m = MagnitudeMax(MagnitudeMax(0, w[k][0]), w[k][1]);
      m = WarpMaxBits(max(m & 0xffffu, m >> 16));
      if (lane == k) amax = m;
    }
    const DeviceScale mine = ScaleForAmax(AmaxFromBits(amax), pow2);
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int r = warp + kTileWarps * k;
      if (r >= n) break;
      const float inverse = __shfl_sync(kFullMask, mine.inverse, k);
      const int64_t at = (first + r) * cols + c0;
      row_data[at / 4 + lane] = QuantizeFour(w[k][0], w[k][1], inverse);
      if (lane == k) row_scales[at / kFp8Block] = mine.scale;
    }
  }
}

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

// ---- Permute fused with row-wise quantization: one warp per (token, tile), the token's tile
// quantized once and stored to each of its k slots. ----

__global__ void __launch_bounds__(kRowThreads)
    PermuteKernel(const uint2* __restrict__ x, int64_t tokens, int64_t hidden, int top_k,
                  const int32_t* __restrict__ slot_of_choice, bool pow2,
                  uint32_t* __restrict__ data, float* __restrict__ scales) {
  const int lane = threadIdx.x & 31;
  const int64_t tiles_per_row = hidden / kFp8Block;
  const int64_t tiles = tokens * tiles_per_row;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kRowThreads / 32);
  for (int64_t t = (static_cast<int64_t>(blockIdx.x) * kRowThreads + threadIdx.x) / 32; t < tiles;
       t += warps) {
    const int64_t token = t / tiles_per_row, tile = t - token * tiles_per_row;
    const uint2 v = x[t * 32 + lane];
    uint32_t m = MagnitudeMax(MagnitudeMax(0, v.x), v.y);
    m = WarpMaxBits(max(m & 0xffffu, m >> 16));
    const DeviceScale s = ScaleForAmax(AmaxFromBits(m), pow2);
    const uint32_t q = QuantizeFour(v.x, v.y, s.inverse);
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

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

absl::Status QuantizeFp8Block(const Fp8BlockQuantizeShape& shape, const Bf16* x,
                              const int32_t* group_offsets, const Fp8BlockRowwise* rowwise,
                              const Fp8BlockColwise* colwise, Stream stream) {
  if (absl::Status s = ValidateFp8BlockQuantize(shape, x, rowwise, colwise); !s.ok()) return s;
  if (group_offsets == nullptr && shape.num_groups != 1) {
    return absl::InvalidArgumentError("num_groups: must be 1 when group_offsets is null");
  }
  if (!Aligned(x, 8)) return absl::InvalidArgumentError("x: must be 8-byte aligned");
  if (rowwise != nullptr && !Aligned(rowwise->data, 4)) {
    return absl::InvalidArgumentError("rowwise.data: must be 4-byte aligned");
  }
  const bool pow2 = shape.mode == Fp8ScaleMode::kPowerOfTwo;
  if (colwise == nullptr) {
    if (shape.rows == 0) return absl::OkStatus();
    const int blocks = GridStrideBlocks(shape.rows * (shape.cols / kFp8Block), kRowThreads / 32);
    RowwiseKernel<<<blocks, kRowThreads, 0, stream>>>(
        reinterpret_cast<const uint2*>(x), shape.rows, shape.cols, group_offsets, shape.num_groups,
        pow2, reinterpret_cast<uint32_t*>(rowwise->data), rowwise->scales);
    return LaunchStatus("Fp8Block RowwiseKernel");
  }
  detail::PaddedOffsetsKernel<kFp8Block><<<1, detail::kScanThreads, 0, stream>>>(
      group_offsets, shape.num_groups, shape.rows, colwise->group_offsets);
  if (absl::Status s = LaunchStatus("Fp8Block PaddedOffsetsKernel"); !s.ok()) return s;
  const int64_t blocks = colwise->padded_rows / kFp8Block * (shape.cols / kFp8Block);
  if (blocks == 0) return absl::OkStatus();
  if (blocks > INT32_MAX) return absl::InvalidArgumentError("colwise.padded_rows: too many tiles");
  TileKernel<<<static_cast<unsigned>(blocks), kTileThreads, 0, stream>>>(
      x, shape.rows, shape.cols, group_offsets, shape.num_groups, pow2, colwise->group_offsets,
      colwise->padded_rows,
      rowwise == nullptr ? nullptr : reinterpret_cast<uint32_t*>(rowwise->data),
      rowwise == nullptr ? nullptr : rowwise->scales, colwise->data, colwise->scales);
  return LaunchStatus("Fp8Block TileKernel");
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

}  // namespace dropless::kernels::cuda
