// fp8-block quantization: row-wise 1x128 tiles, grouped column-wise 1x128 tiles or 128x128 blocks
// (transposed, from the same read), and 128x128 weight blocks in both orientations. Format,
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

// ---- Row-wise and/or column-wise from one read: one block per 128x128 tile. ----
//
// Block b covers 128 columns from c0 = 128 (b % (cols / 128)) of a 128-row tile: column-wise, the
// padded tile p0 = 128 (b / (cols / 128)) of one group (found by one warp counting padded_offsets,
// rows past the group's end are its padding); row-wise only, input rows offsets[0] + p0 .. + 127.
// The block reads the tile's live rows with 16-byte streaming loads, eight per thread, all issued
// before the first is stored (rows past the live count read as zeros), stages them with row r at
// r * 256 + 16 (r / 16) bytes, and after one barrier each warp quantizes on its own:
//   column-wise: warp w owns column pairs 8 w .. 8 w + 7 (two units of four pairs); lane (q =
//     lane / 8, g = lane % 8) holds rows 16 g .. 16 g + 15 of pair 4 u + q (the 16-byte band shift
//     puts the 8 lanes reading rows 16 g + e of one pair on 8 different 4-bank groups); the 8 lanes
//     of a pair join their amaxes in three shuffles, lanes 8 q + g (g < 4) compute the warp's 16
//     scales, and each lane stores its 16 E4M3 bytes of a column with one 16-byte store (8 lanes:
//     the column's whole 128-byte line). Two elements per E4M3 conversion, no byte regrouping.
//     Per 128 x 128 block, the warps' amaxes meet in shared memory after a second barrier and
//     every lane computes the block's one scale;
//   row-wise: 16 lanes per row (8 elements, one 16-byte shared read); warp w takes rows 2 i and
//     2 i + 1 for i = w + 8 k (k < 8), keeps them in registers and computes their 16 scales a lane
//     each; rows past the live count are not written.
// Measured on an H200: 0.22 ms for 65536x4096 column-wise, 88% of a device copy (row+col 0.34 ms,
// row-wise 0.23 ms, against 0.25 ms for a warp-per-tile row-wise kernel). A persistent,
// warp-specialized variant (a producer warp bulk-copying 128x256 items into a 3-stage mbarrier
// ring, 16 consumer warps) measured slower: 0.30 ms column-wise, 0.36 ms row+col.

constexpr int kTileThreads = 256;
constexpr int kTileWarps = kTileThreads / 32;
constexpr int kTilePitch = 2 * kFp8Block;  // bytes of a staged row
constexpr int kTileBytes = kFp8Block * kTilePitch + kFp8Block / 16 * 16;
constexpr int kTileLoads = kFp8Block * kTilePitch / 16 / kTileThreads;  // 16-byte loads a thread

__device__ __forceinline__ int StagedRow(int r) { return r * kTilePitch + (r >> 4) * 16; }

// Where a block's tile goes.
struct TileOut {
  int64_t cols, padded_rows;
  int64_t source_row;  // input row of the tile's first row
  int64_t c0;          // first column
  int32_t padded_row;  // first padded row (column-wise position)
  int32_t live;        // rows holding data, 0..128
};

// Block-collective (every thread calls it): the column-wise tiles of column pairs 8 warp ..
// 8 warp + 7 in each warp. Per block (per_block): the warps' amaxes meet in `warp_amax` and every
// lane quantizes with the one scale of the 128 x 128 block.
__device__ __forceinline__ void QuantizeColumns(const uint8_t* stage, int warp, int lane, bool pow2,
                                                bool per_block, uint32_t* warp_amax,
                                                const TileOut& t, uint8_t* __restrict__ col_data,
                                                float* __restrict__ col_scales) {
  constexpr int kUnits = kFp8Block / 8 / kTileWarps;  // units of four pairs per warp
  static_assert(kUnits == 2, "lanes 8 q + g (g < 2 kUnits) compute the scales");
  const int g = lane & 7, q = lane >> 3;
  const uint8_t* base = stage + StagedRow(16 * g);
  uint32_t w[kUnits][16];
  uint32_t m[kUnits];  // the pair's two magnitudes, packed as the words are
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int pair = 4 * (kUnits * warp + u) + q;
    m[u] = 0;
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      w[u][e] = *reinterpret_cast<const uint32_t*>(base + e * kTilePitch + 4 * pair);
      m[u] = MagnitudeMax(m[u], w[u][e]);
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) m[u] = __vmaxu2(m[u], __shfl_xor_sync(kFullMask, m[u], o));
  }
  // Lane 8 q + g: the scale of unit (g / 2) % kUnits, column g % 2 of pair 4 u + q.
  const int su = (g >> 1) % kUnits;
  uint32_t amax = 0;
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    if (u == su) amax = (g & 1) ? (m[u] >> 16) : (m[u] & 0xffffu);
  }
  if (per_block) {
    uint32_t block = 0;
#pragma unroll
    for (int u = 0; u < kUnits; ++u) block = max(block, max(m[u] & 0xffffu, m[u] >> 16));
    block = WarpMaxBits(block);
    if (lane == 0) warp_amax[warp] = block;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kTileWarps; ++w) block = max(block, warp_amax[w]);
    amax = block;
  }
  const DeviceScale mine = ScaleForAmax(AmaxFromBits(amax), pow2);
  if (per_block) {
    if (warp == 0 && lane == 0) {
      col_scales[t.padded_row / kFp8Block * (t.cols / kFp8Block) + t.c0 / kFp8Block] = mine.scale;
    }
  } else if (g < 2 * kUnits) {
    col_scales[t.padded_row / kFp8Block * t.cols + t.c0 + 2 * (4 * (kUnits * warp + su) + q) +
               (g & 1)] = mine.scale;
  }
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int pair = 4 * (kUnits * warp + u) + q;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float inverse = __shfl_sync(kFullMask, mine.inverse, 8 * q + 2 * u + h);
      uint32_t out[4];  // rows 16 g + 4 k .. + 3, low byte first
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float f[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t v = w[u][4 * k + j];
          f[j] = __fmul_rn(h == 0 ? detail::BfLo(v) : detail::BfHi(v), inverse);
        }
        out[k] = isnan(inverse) ? 0x7f7f7f7fu
                                : detail::E4M3x2(f[0], f[1]) | (detail::E4M3x2(f[2], f[3]) << 16);
      }
      uint8_t* dst = col_data + (t.c0 + 2 * pair + h) * t.padded_rows + t.padded_row + 16 * g;
      *reinterpret_cast<uint4*>(dst) = make_uint4(out[0], out[1], out[2], out[3]);
    }
  }
}

// Warp-collective: the row-wise tiles of rows 2 i (lanes 0-15) and 2 i + 1 (lanes 16-31), i =
// warp + 8 k for pass k; lane 2 k + h computes the scale of pass k's row 2 i + h.
__device__ __forceinline__ void QuantizeRows(const uint8_t* stage, int warp, int lane, bool pow2,
                                             const TileOut& t, uint8_t* __restrict__ row_data,
                                             float* __restrict__ row_scales) {
  constexpr int kPasses = kFp8Block / 2 / kTileWarps;
  static_assert(kPasses <= 16, "one lane per row scale");
  const int half = lane >> 4, l16 = lane & 15;
  uint4 v[kPasses];
  uint32_t amax = 0;
#pragma unroll
  for (int k = 0; k < kPasses; ++k) {
    const int r = 2 * (warp + kTileWarps * k) + half;
    v[k] = *reinterpret_cast<const uint4*>(stage + StagedRow(r) + 16 * l16);
    uint32_t m =
        MagnitudeMax(MagnitudeMax(MagnitudeMax(MagnitudeMax(0, v[k].x), v[k].y), v[k].z), v[k].w);
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) m = __vmaxu2(m, __shfl_xor_sync(kFullMask, m, o));
    uint32_t a = max(m & 0xffffu, m >> 16);
    a = half ? a << 16 : a;
    a = __vmaxu2(a, __shfl_xor_sync(kFullMask, a, 16));  // low half: row 2 i, high: 2 i + 1
    if ((lane >> 1) == k) amax = (lane & 1) ? a >> 16 : a & 0xffffu;
  }
  const DeviceScale mine = ScaleForAmax(AmaxFromBits(amax), pow2);
  if (lane < 2 * kPasses) {
    const int r = 2 * (warp + kTileWarps * (lane >> 1)) + (lane & 1);
    if (r < t.live) row_scales[((t.source_row + r) * t.cols + t.c0) / kFp8Block] = mine.scale;
  }
#pragma unroll
  for (int k = 0; k < kPasses; ++k) {
    const int r = 2 * (warp + kTileWarps * k) + half;
    const float inverse = __shfl_sync(kFullMask, mine.inverse, 2 * k + half);
    const uint2 e4m3 =
        make_uint2(QuantizeFour(v[k].x, v[k].y, inverse), QuantizeFour(v[k].z, v[k].w, inverse));
    if (r < t.live) {
      *reinterpret_cast<uint2*>(row_data + (t.source_row + r) * t.cols + t.c0 + 8 * l16) = e4m3;
    }
  }
}

template <bool kRowwise, bool kColwise>
__global__ void __launch_bounds__(kTileThreads, 4)
    TileKernel(const Bf16* __restrict__ x, int64_t rows, int64_t cols,
               const int32_t* __restrict__ offsets, int groups, bool pow2, bool col_per_block,
               const int32_t* __restrict__ padded_offsets, int64_t padded_rows,
               uint8_t* __restrict__ row_data, float* __restrict__ row_scales,
               uint8_t* __restrict__ col_data, float* __restrict__ col_scales) {
  static_assert(kColwise || kRowwise, "nothing to produce");
  __shared__ __align__(16) uint8_t stage[kTileBytes];
  __shared__ int32_t tile_source_row, tile_live;
  __shared__ uint32_t warp_amax[kTileWarps];  // column-wise per block: the warps' amaxes
  const int64_t segs = cols / kFp8Block;
  const int64_t tile_row = static_cast<int64_t>(blockIdx.x) / segs;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) - tile_row * segs) * kFp8Block;
  const int32_t p0 = static_cast<int32_t>(tile_row * kFp8Block);
  int64_t first;
  int32_t n;
  if constexpr (kColwise) {
    if (p0 >= padded_offsets[groups]) return;  // past the last group's padding
    if (threadIdx.x < 32) {
      // The tile's group: the number of j in [1, G) with padded_offsets[j] <= p0.
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
        tile_source_row = begin + local;
        tile_live = min(kFp8Block, max(0, count - local));
      }
    }
    __syncthreads();
    first = tile_source_row;
    n = tile_live;
  } else {  // row-wise only: the live rows offsets[0] .. offsets[G] (every row without offsets)
    const int64_t begin =
        offsets == nullptr ? 0 : min(rows, static_cast<int64_t>(max(0, offsets[0])));
    const int64_t end =
        offsets == nullptr ? rows : min(rows, static_cast<int64_t>(max(0, offsets[groups])));
    first = begin + tile_row * kFp8Block;
    if (first >= end) return;
    n = static_cast<int32_t>(min(static_cast<int64_t>(kFp8Block), end - first));
  }
  uint4 v[kTileLoads];
#pragma unroll
  for (int j = 0; j < kTileLoads; ++j) {
    const int i = threadIdx.x + j * kTileThreads;
    const int r = i >> 4, q = i & 15;  // row r, bytes 16 q .. 16 q + 15
    v[j] = r < n ? detail::LoadVecStreaming(x + (first + r) * cols + c0 + 8 * q)
                 : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int j = 0; j < kTileLoads; ++j) {
    const int i = threadIdx.x + j * kTileThreads;
    *reinterpret_cast<uint4*>(stage + StagedRow(i >> 4) + 16 * (i & 15)) = v[j];
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const TileOut t{cols, padded_rows, first, c0, p0, n};
  if constexpr (kColwise) {
    QuantizeColumns(stage, warp, lane, pow2, col_per_block, warp_amax, t, col_data, col_scales);
  }
  if constexpr (kRowwise) QuantizeRows(stage, warp, lane, pow2, t, row_data, row_scales);
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
  // The tile kernel reads x in 16-byte row pieces and stores 8-byte row pieces and 16-byte column
  // runs.
  if (!Aligned(x, 16)) return absl::InvalidArgumentError("x: must be 16-byte aligned");
  if (rowwise != nullptr && !Aligned(rowwise->data, 8)) {
    return absl::InvalidArgumentError("rowwise.data: must be 8-byte aligned");
  }
  const bool pow2 = shape.mode == Fp8ScaleMode::kPowerOfTwo;
  const int64_t segs = shape.cols / kFp8Block;
  if (colwise == nullptr) {
    const int64_t blocks = (shape.rows + kFp8Block - 1) / kFp8Block * segs;
    if (blocks == 0) return absl::OkStatus();
    if (blocks > INT32_MAX) return absl::InvalidArgumentError("rows: too many tiles");
    TileKernel<true, false><<<static_cast<unsigned>(blocks), kTileThreads, 0, stream>>>(
        x, shape.rows, shape.cols, group_offsets, shape.num_groups, pow2, false, nullptr, 0,
        rowwise->data, rowwise->scales, nullptr, nullptr);
    return LaunchStatus("Fp8Block TileKernel");
  }
  if (!Aligned(colwise->data, 16)) {
    return absl::InvalidArgumentError("colwise.data: must be 16-byte aligned");
  }
  const int64_t blocks = colwise->padded_rows / kFp8Block * segs;
  if (shape.rows > INT32_MAX || shape.cols > INT32_MAX || blocks > INT32_MAX) {
    return absl::InvalidArgumentError("colwise.padded_rows: too many tiles");
  }
  detail::PaddedOffsetsKernel<kFp8Block><<<1, detail::kScanThreads, 0, stream>>>(
      group_offsets, shape.num_groups, shape.rows, colwise->group_offsets);
  if (absl::Status s = LaunchStatus("Fp8Block PaddedOffsetsKernel"); !s.ok()) return s;
  if (blocks == 0) return absl::OkStatus();
  // One block per padded tile the buffer can hold; those past the live groups' padding return.
  auto kernel = rowwise != nullptr ? TileKernel<true, true> : TileKernel<false, true>;
  kernel<<<static_cast<unsigned>(blocks), kTileThreads, 0, stream>>>(
      x, shape.rows, shape.cols, group_offsets, shape.num_groups, pow2,
      colwise->scaling == Fp8ColwiseScaling::kPerBlock, colwise->group_offsets,
      colwise->padded_rows, rowwise == nullptr ? nullptr : rowwise->data,
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

}  // namespace dropless::kernels::cuda
