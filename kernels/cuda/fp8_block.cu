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
#include "kernels/cuda/hopper/bulk_copy.cuh"
#include "kernels/cuda/hopper/mbarrier.cuh"
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

// ---- Row-wise and/or column-wise from one read: a persistent, warp-specialized grid (the MXFP8
// QuantizeStreamKernel's skeleton). ----
//
// Items are (one padded 128-row tile of one group) x (a segment of kW columns), segments fastest,
// so the blocks running at once read whole input rows. A producer warp resolves an item's group
// (a ballot search that resumes at its previous group) and copies the item's live rows into a stage
// of a ring, one bulk copy (cp.async.bulk) of kW * 2 bytes per row completing on the stage's full
// mbarrier, kStages - 1 items ahead; kConsumerWarps warps quantize from the stage, each on its own
// (no block barrier), and release it through the stage's empty mbarrier:
//   column-wise: lane (q = lane / 8, g = lane % 8) holds rows 16 g .. 16 g + 15 of column pair
//     4 u + q (a unit u: 4 pairs); the 8 lanes of a pair join their amaxes in three shuffles, and
//     each lane stores its 16 E4M3 bytes of a column as one 16-byte store (8 lanes: the column's
//     whole 128-byte line). No byte regrouping across lanes, two elements per E4M3 conversion;
//   row-wise: 16 lanes per 1x128 tile, eight elements (one 16-byte shared read) per lane.
// A warp keeps a batch of lines (2 units, or up to 16 row tiles) in registers and computes their
// scales in one pass, a lane each (two IEEE divisions per scale). Stage row r starts 16 (r / 16)
// bytes past r * 2 kW, so the 8 lanes reading rows 16 g + e of one column pair use 8 different
// 4-bank groups. Rows past an item's live count are read as zeros (column-wise; they are the
// group's padding) and not written (row-wise).

template <int kW, int kStagesT, int kConsumerWarpsT>
struct TileStreamConfig {
  static constexpr int kWidth = kW, kStages = kStagesT, kConsumerWarps = kConsumerWarpsT;
  static constexpr int kThreads = (kConsumerWarps + 1) * 32;
  static constexpr int kPitch = kW * 2;  // bytes of a staged row
  static constexpr int kStageBytes = kFp8Block * kPitch + kFp8Block / 16 * 16;
  static constexpr size_t kSmemBytes = size_t{kStages} * kStageBytes + kStages * (16 + 16);
  static constexpr int kUnitsPerWarp = kW / 8 / kConsumerWarps;         // 8 columns per unit
  static constexpr int kUnits = kUnitsPerWarp < 2 ? kUnitsPerWarp : 2;  // units per batch
  static constexpr int kBatches = kUnitsPerWarp / kUnits;
  static constexpr int kPasses = kW / 2 / kConsumerWarps;  // row-tile pairs per warp
  static_assert(kW % kFp8Block == 0 && kStages >= 2, "whole tiles, one item in flight");
  static_assert(kUnitsPerWarp >= 1 && kUnitsPerWarp % kUnits == 0 && 16 % kUnits == 0,
                "whole units per warp");
  static_assert(kPasses >= 1 && kPasses <= 16 && kW / 2 % kConsumerWarps == 0,
                "one lane per row-tile scale");
  __device__ static constexpr int RowOffset(int r) { return r * kPitch + (r >> 4) * 16; }
};

struct TileSlot {
  int32_t source_row;  // input row of the item's first row
  int32_t live;        // rows holding data, 1..128
  int32_t padded_row;  // first padded row (column-wise position)
  int32_t c0;          // first column of the segment
};

// What a consumer needs of its item.
struct TileItem {
  int64_t cols, padded_rows, source_row;
  int32_t padded_row, c0, width, live;
};

// Warp-collective: the group holding padded rows [padded_row, padded_row + 128). `group` is the
// warp's previous answer (0 at first): padded rows only grow along a block's items.
__device__ __forceinline__ TileSlot ResolveTile(int32_t padded_row, int32_t c0, int& group,
                                                const int32_t* __restrict__ offsets,
                                                const int32_t* __restrict__ padded_offsets,
                                                int num_groups, int32_t rows) {
  const int lane = threadIdx.x & 31;
  // group = number of j in [1, G] with padded_offsets[j] <= padded_row (a prefix of [1, G]).
  for (;;) {
    const int j = group + 1 + lane;
    const unsigned le =
        __ballot_sync(kFullMask, j <= num_groups && padded_offsets[j] <= padded_row);
    group += __popc(le);
    if (le != kFullMask) break;
  }
  const int32_t local = padded_row - padded_offsets[group];
  const int32_t begin = offsets == nullptr ? 0 : offsets[group];
  const int32_t count = offsets == nullptr ? rows : offsets[group + 1] - begin;
  return {begin + local, min(kFp8Block, max(0, count - local)), padded_row, c0};
}

// Column units first_unit .. first_unit + kUnits - 1 of a staged item (warp-collective).
template <class Cfg, int kUnits, bool kMasked>
__device__ __forceinline__ void QuantizeColumnUnits(const uint8_t* stage, int first_unit, int lane,
                                                    bool pow2, const TileItem& it,
                                                    uint8_t* __restrict__ col_data,
                                                    float* __restrict__ col_scales) {
  const int g = lane & 7, q = lane >> 3;
  const uint8_t* base = stage + Cfg::RowOffset(16 * g);
  uint32_t w[kUnits][16];
  uint32_t m[kUnits];  // the pair's two magnitudes, packed as the words are
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int pair = 4 * (first_unit + u) + q;
    m[u] = 0;
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      uint32_t v = *reinterpret_cast<const uint32_t*>(base + e * Cfg::kPitch + 4 * pair);
      if (kMasked && 16 * g + e >= it.live) v = 0;
      w[u][e] = v;
      m[u] = MagnitudeMax(m[u], v);
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) m[u] = __vmaxu2(m[u], __shfl_xor_sync(kFullMask, m[u], o));
  }
  // Lane g: the scale of unit (g / 2) % kUnits, column g % 2 of the lane's pair.
  const int su = (g >> 1) % kUnits;
  uint32_t amax = 0;
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    if (u == su) amax = (g & 1) ? (m[u] >> 16) : (m[u] & 0xffffu);
  }
  const DeviceScale mine = ScaleForAmax(AmaxFromBits(amax), pow2);
  if (g < 2 * kUnits) {
    col_scales[static_cast<int64_t>(it.padded_row / kFp8Block) * it.cols + it.c0 +
               2 * (4 * (first_unit + su) + q) + (g & 1)] = mine.scale;
  }
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int pair = 4 * (first_unit + u) + q;
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
      uint8_t* dst = col_data + (it.c0 + 2 * pair + h) * it.padded_rows + it.padded_row + 16 * g;
      *reinterpret_cast<uint4*>(dst) = make_uint4(out[0], out[1], out[2], out[3]);
    }
  }
}

// The row tiles of a staged item (warp-collective): pass k covers the tile pair i = first +
// stride k, tiles 2 i (lanes 0-15) and 2 i + 1 (lanes 16-31); tile t is row t / (kW / 128),
// 128-column segment t % (kW / 128). Lane 2 k + h computes the scale of pass k's tile h.
template <class Cfg, bool kMasked>
__device__ __forceinline__ void QuantizeRowTiles(const uint8_t* stage, int first, int stride,
                                                 int lane, bool pow2, const TileItem& it,
                                                 uint8_t* __restrict__ row_data,
                                                 float* __restrict__ row_scales) {
  constexpr int kSegs = Cfg::kWidth / kFp8Block, kPasses = Cfg::kPasses;
  const int half = lane >> 4, l16 = lane & 15;
  uint4 v[kPasses];
  uint32_t amax = 0;
#pragma unroll
  for (int k = 0; k < kPasses; ++k) {
    const int t = 2 * (first + stride * k) + half;
    v[k] = *reinterpret_cast<const uint4*>(stage + Cfg::RowOffset(t / kSegs) +
                                           (t % kSegs) * 2 * kFp8Block + 16 * l16);
    uint32_t m =
        MagnitudeMax(MagnitudeMax(MagnitudeMax(MagnitudeMax(0, v[k].x), v[k].y), v[k].z), v[k].w);
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) m = __vmaxu2(m, __shfl_xor_sync(kFullMask, m, o));
    uint32_t a = max(m & 0xffffu, m >> 16);
    a = half ? a << 16 : a;
    a = __vmaxu2(a, __shfl_xor_sync(kFullMask, a, 16));  // low half: tile 2 i, high: 2 i + 1
    if ((lane >> 1) == k) amax = (lane & 1) ? a >> 16 : a & 0xffffu;
  }
  const DeviceScale mine = ScaleForAmax(AmaxFromBits(amax), pow2);
  auto live = [&](int t) {
    return (!kMasked || t / kSegs < it.live) && (t % kSegs) * kFp8Block < it.width;
  };
  auto at = [&](int t) {  // the tile's first element in the row-wise output
    return (it.source_row + t / kSegs) * it.cols + it.c0 + (t % kSegs) * kFp8Block;
  };
  if (lane < 2 * kPasses) {
    const int t = 2 * (first + stride * (lane >> 1)) + (lane & 1);
    if (live(t)) row_scales[at(t) / kFp8Block] = mine.scale;
  }
#pragma unroll
  for (int k = 0; k < kPasses; ++k) {
    const int t = 2 * (first + stride * k) + half;
    const float inverse = __shfl_sync(kFullMask, mine.inverse, 2 * k + half);
    const uint2 e4m3 =
        make_uint2(QuantizeFour(v[k].x, v[k].y, inverse), QuantizeFour(v[k].z, v[k].w, inverse));
    if (live(t)) *reinterpret_cast<uint2*>(row_data + at(t) + 8 * l16) = e4m3;
  }
}

template <class Cfg, bool kRowwise, bool kColwise>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    TileStreamKernel(const Bf16* __restrict__ x, int32_t rows, int32_t cols,
                     const int32_t* __restrict__ offsets, int num_groups, bool pow2,
                     const int32_t* __restrict__ padded_offsets, int64_t padded_rows,
                     uint8_t* __restrict__ row_data, float* __restrict__ row_scales,
                     uint8_t* __restrict__ col_data, float* __restrict__ col_scales) {
  constexpr int kW = Cfg::kWidth, kStages = Cfg::kStages, kWarps = Cfg::kConsumerWarps;
  extern __shared__ __align__(128) uint8_t smem[];
  TileSlot* const slots = reinterpret_cast<TileSlot*>(smem + size_t{kStages} * Cfg::kStageBytes);
  uint64_t* const full = reinterpret_cast<uint64_t*>(slots + kStages);
  uint64_t* const empty = full + kStages;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int32_t live_padded = padded_offsets[num_groups];
  const uint32_t segs = static_cast<uint32_t>(cols + kW - 1) / kW;
  const uint32_t items = static_cast<uint32_t>(live_padded / kFp8Block) * segs;  // < 2^31
  if (threadIdx.x == 0) {
    hopper::BarrierInitRing(full, empty, kStages, 1, kWarps);
    hopper::BarrierInitFence();
  }
  __syncthreads();
  int s = 0;
  uint32_t phase = 0;
  auto advance = [&] {
    if (++s == kStages) {
      s = 0;
      phase ^= 1;
    }
  };
  if (warp == kWarps) {  // producer warp
    int group = 0;
    for (uint32_t c = blockIdx.x; c < items; c += gridDim.x, advance()) {
      const uint32_t tile_row = c / segs, seg = c - tile_row * segs;
      const TileSlot slot =
          ResolveTile(static_cast<int32_t>(tile_row) * kFp8Block, static_cast<int32_t>(seg) * kW,
                      group, offsets, padded_offsets, num_groups, rows);
      const uint32_t bytes = static_cast<uint32_t>(min(kW, cols - slot.c0)) * 2;
      hopper::BarrierWait(&empty[s], phase ^ 1);
      if (lane == 0) {
        slots[s] = slot;
        hopper::BarrierArriveExpectBytes(&full[s], bytes * static_cast<uint32_t>(slot.live));
      }
      __syncwarp();
      uint8_t* const stage = smem + size_t{Cfg::kStageBytes} * s;
      for (int r = lane; r < slot.live; r += 32) {
        hopper::BulkLoad(stage + Cfg::RowOffset(r),
                         x + (static_cast<int64_t>(slot.source_row) + r) * cols + slot.c0, bytes,
                         &full[s]);
      }
    }
    return;
  }
  for (uint32_t c = blockIdx.x; c < items; c += gridDim.x, advance()) {
    hopper::BarrierWait(&full[s], phase);
    const TileSlot slot = slots[s];
    const uint8_t* const stage = smem + size_t{Cfg::kStageBytes} * s;
    const TileItem it{
        cols,     padded_rows, slot.source_row, slot.padded_row, slot.c0, min(kW, cols - slot.c0),
        slot.live};
    const bool whole = slot.live == kFp8Block;
    if constexpr (kColwise) {
#pragma unroll
      for (int b = 0; b < Cfg::kBatches; ++b) {
        const int first_unit = (b * kWarps + warp) * Cfg::kUnits;
        if (first_unit * 8 >= it.width) break;  // warp-uniform: a narrower last segment
        if (whole) {
          QuantizeColumnUnits<Cfg, Cfg::kUnits, false>(stage, first_unit, lane, pow2, it, col_data,
                                                       col_scales);
        } else {
          QuantizeColumnUnits<Cfg, Cfg::kUnits, true>(stage, first_unit, lane, pow2, it, col_data,
                                                      col_scales);
        }
      }
    }
    if constexpr (kRowwise) {
      if (whole) {
        QuantizeRowTiles<Cfg, false>(stage, warp, kWarps, lane, pow2, it, row_data, row_scales);
      } else {
        QuantizeRowTiles<Cfg, true>(stage, warp, kWarps, lane, pow2, it, row_data, row_scales);
      }
    }
    __syncwarp();
    if (lane == 0) hopper::BarrierArrive(&empty[s]);
  }
}

// 64 KB items (512-byte row copies), two in flight while one is quantized, 16 consumer warps, one
// block per multiprocessor: the MXFP8 quantizer's measured best proportions.
using DefaultTileStreamConfig = TileStreamConfig<256, 3, 16>;

template <class Cfg, bool kRowwise, bool kColwise>
absl::Status LaunchTileStream(const Fp8BlockQuantizeShape& shape, const Bf16* x,
                              const int32_t* offsets, const Fp8BlockRowwise* rowwise,
                              const Fp8BlockColwise* colwise, Stream stream) {
  auto kernel = TileStreamKernel<Cfg, kRowwise, kColwise>;
  static const int resident = [kernel] {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(Cfg::kSmemBytes)) != cudaSuccess ||
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return detail::ResidentBlocks(kernel, Cfg::kThreads, Cfg::kSmemBytes);
  }();
  if (resident <= 0) {
    return absl::InternalError(
        "Fp8Block TileStreamKernel: shared-memory or occupancy setup failed");
  }
  const int64_t max_items =
      colwise->padded_rows / kFp8Block * ((shape.cols + Cfg::kWidth - 1) / Cfg::kWidth);
  if (max_items == 0) return absl::OkStatus();
  const int blocks = static_cast<int>(std::min<int64_t>(max_items, resident));
  kernel<<<blocks, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      x, static_cast<int32_t>(shape.rows), static_cast<int32_t>(shape.cols), offsets,
      shape.num_groups, shape.mode == Fp8ScaleMode::kPowerOfTwo, colwise->group_offsets,
      colwise->padded_rows, rowwise == nullptr ? nullptr : rowwise->data,
      rowwise == nullptr ? nullptr : rowwise->scales, colwise->data, colwise->scales);
  return LaunchStatus("Fp8Block TileStreamKernel");
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
  // The tile kernel reads x in whole 16-byte row pieces and stores 16-byte column runs and 8-byte
  // row pieces.
  if (!Aligned(x, 16)) return absl::InvalidArgumentError("x: must be 16-byte aligned");
  if (!Aligned(colwise->data, 16)) {
    return absl::InvalidArgumentError("colwise.data: must be 16-byte aligned");
  }
  if (rowwise != nullptr && !Aligned(rowwise->data, 8)) {
    return absl::InvalidArgumentError("rowwise.data: must be 8-byte aligned");
  }
  if (shape.rows > INT32_MAX || shape.cols > INT32_MAX ||
      colwise->padded_rows / kFp8Block * (shape.cols / kFp8Block) > INT32_MAX) {
    return absl::InvalidArgumentError("colwise.padded_rows: too many tiles");
  }
  detail::PaddedOffsetsKernel<kFp8Block><<<1, detail::kScanThreads, 0, stream>>>(
      group_offsets, shape.num_groups, shape.rows, colwise->group_offsets);
  if (absl::Status s = LaunchStatus("Fp8Block PaddedOffsetsKernel"); !s.ok()) return s;
  using Cfg = DefaultTileStreamConfig;
  return rowwise != nullptr
             ? LaunchTileStream<Cfg, true, true>(shape, x, group_offsets, rowwise, colwise, stream)
             : LaunchTileStream<Cfg, false, true>(shape, x, group_offsets, rowwise, colwise,
                                                  stream);
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
