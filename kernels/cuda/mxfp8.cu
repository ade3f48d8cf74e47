// MXFP8 quantization (row-wise, and row-wise + column-wise from one read, grouped) and
// dequantization. Layouts and rounding: dropless/kernels/mxfp8.h.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "absl/status/status.h"
#include "dropless/kernels/mxfp8.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.cuh"

namespace dropless::kernels::cuda {
namespace {

using detail::kFullMask;

// ---- Row-wise only: 16 elements (two vectors) per thread, 2 lanes per block, 16-byte stores;
// the next pass's loads are issued before this pass is quantized. ----

constexpr int kRowThreads = 256;
constexpr int kRowUnroll = 2;  // pairs per thread per pass

__device__ __forceinline__ int64_t LiveRows(int64_t rows, const int32_t* group_offsets,
                                            int num_groups) {
  if (group_offsets == nullptr) return rows;
  return min(rows, static_cast<int64_t>(max(0, group_offsets[num_groups])));
}

__device__ __forceinline__ void LoadPairs(const uint4* __restrict__ x, int64_t base, int64_t total,
                                          uint4 (&a)[kRowUnroll], uint4 (&b)[kRowUnroll]) {
#pragma unroll
  for (int u = 0; u < kRowUnroll; ++u) {
    const int64_t i = base + u * kRowThreads + threadIdx.x;
    a[u] = i < total ? detail::LoadVecStreaming(x + 2 * i) : make_uint4(0, 0, 0, 0);
    b[u] = i < total ? detail::LoadVecStreaming(x + 2 * i + 1) : make_uint4(0, 0, 0, 0);
  }
}

__global__ void __launch_bounds__(kRowThreads)
    QuantizeRowwiseKernel(const uint4* __restrict__ x, int64_t rows, int64_t cols,
                          const int32_t* __restrict__ group_offsets, int num_groups,
                          uint4* __restrict__ data, uint8_t* __restrict__ scales) {
  // Pairs of vectors (16 elements); cols % 32 == 0 keeps both lanes of an MX block valid or
  // invalid together, and the block-uniform loop keeps every lane at the shuffle.
  const int64_t total = LiveRows(rows, group_offsets, num_groups) * (cols / 16);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kRowThreads * kRowUnroll;
  int64_t base = static_cast<int64_t>(blockIdx.x) * kRowThreads * kRowUnroll;
  uint4 a[kRowUnroll], b[kRowUnroll];
  LoadPairs(x, base, total, a, b);
  for (; base < total; base += stride) {
    uint4 next_a[kRowUnroll], next_b[kRowUnroll];
    LoadPairs(x, base + stride, total, next_a, next_b);
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int64_t i = base + u * kRowThreads + threadIdx.x;
      const detail::MxPair q = detail::QuantizeMxPair(a[u], b[u]);
      if (i < total) {
        data[i] = q.data;
        if ((threadIdx.x & 1) == 0) scales[i / 2] = static_cast<uint8_t>(q.scale);
      }
      a[u] = next_a[u];
      b[u] = next_b[u];
    }
  }
}

// ---- Padded column-wise group offsets (one block). ----

constexpr int kScanThreads = 1024;

__global__ void __launch_bounds__(kScanThreads)
    PaddedOffsetsKernel(const int32_t* __restrict__ group_offsets, int num_groups, int64_t rows,
                        int32_t* __restrict__ padded_offsets) {
  __shared__ int32_t warp_sums[kScanThreads / 32];
  __shared__ int32_t carry;
  if (threadIdx.x == 0) carry = 0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int base = 0; base < num_groups; base += kScanThreads) {
    __syncthreads();
    const int g = base + threadIdx.x;
    int32_t padded = 0;
    if (g < num_groups) {
      const int32_t count =
          group_offsets == nullptr ? static_cast<int32_t>(rows) : group_offsets[g + 1] - group_offsets[g];
      padded = (max(count, 0) + kMxBlock - 1) / kMxBlock * kMxBlock;
    }
    int32_t inclusive = padded;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t n = __shfl_up_sync(kFullMask, inclusive, o);
      if (lane >= o) inclusive += n;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
      int32_t s = warp_sums[lane];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int32_t n = __shfl_up_sync(kFullMask, s, o);
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

// ---- Row-wise + column-wise tile kernel: 128 padded rows x 128 columns per block. ----

constexpr int kTileRows = 128;
constexpr int kTileCols = 128;
constexpr int kTileThreads = 256;
constexpr int kRowBlocksPerTile = kTileRows / kMxBlock;  // 4

struct RowBlock {
  int64_t source_row;  // input row of the block's first padded row; -1: past the last group
  int32_t live;        // rows of the block that hold data (the rest is group padding)
};

// Warp `w` resolves the tile's row block w: which group its padded rows belong to.
__device__ RowBlock ResolveRowBlock(int64_t padded_row, const int32_t* __restrict__ offsets,
                                    const int32_t* __restrict__ padded_offsets, int num_groups,
                                    int64_t rows) {
  const int lane = threadIdx.x & 31;
  if (padded_row >= padded_offsets[num_groups]) return {-1, 0};
  // g = number of j in [1, G] with padded_offsets[j] <= padded_row (empty groups count too).
  int g = 0;
  for (int base = 1; base <= num_groups; base += 32) {
    const int j = base + lane;
    const bool le = j <= num_groups && padded_offsets[j] <= padded_row;
    g += __popc(__ballot_sync(kFullMask, le));
  }
  const int64_t local = padded_row - padded_offsets[g];
  const int64_t begin = offsets == nullptr ? 0 : offsets[g];
  const int64_t count = offsets == nullptr ? rows : offsets[g + 1] - begin;
  const int64_t live = count - local;
  return {begin + local, static_cast<int32_t>(live < 0 ? 0 : (live > kMxBlock ? kMxBlock : live))};
}

// Loads the tile's 128 rows x 8 columns of this thread (rows (tid / 16) + 16 i, columns col..col+7);
// padding rows and rows past the last group read as zeros.
__device__ __forceinline__ void LoadTile(const Bf16* __restrict__ x, int64_t cols, int64_t col,
                                         const RowBlock* blocks, uint4 (&v)[kTileRows / 16]) {
#pragma unroll
  for (int i = 0; i < kTileRows / 16; ++i) {
    const int r = (threadIdx.x >> 4) + 16 * i;
    const RowBlock b = blocks[r / kMxBlock];
    const bool ok = col < cols && b.source_row >= 0 && (r % kMxBlock) < b.live;
    v[i] = ok ? detail::LoadVecStreaming(x + (b.source_row + r % kMxBlock) * cols + col)
              : make_uint4(0, 0, 0, 0);
  }
}

// Column-wise MXFP8 of one staged tile. Thread -> (column pair p, row block w); a warp reads 128
// contiguous bytes of one tile row per step (no bank conflicts). Two passes over shared memory
// (amax, then convert) keep the registers for the next tile's prefetch. Lanes 2m and 2m+1 swap
// halves of their 32-byte column blocks so every store writes whole 32-byte sectors.
__device__ __forceinline__ void ColumnPass(const Bf16 (*tile)[kTileCols], const RowBlock* blocks,
                                           int64_t tile_row, int64_t tile_col, int64_t cols,
                                           uint8_t* __restrict__ col_data,
                                           uint8_t* __restrict__ col_scales, int64_t padded_rows) {
  const int pair = threadIdx.x & 63;
  const int w = threadIdx.x >> 6;
  if (blocks[w].source_row < 0) return;  // whole warps: w is shared by 64 threads
  const int64_t c0 = tile_col + 2 * pair;
  const bool valid = c0 < cols;  // shared by lanes 2m, 2m+1 (cols % 32 == 0)
  const int r0 = w * kMxBlock;
  uint32_t amax = 0;
#pragma unroll
  for (int i = 0; i < kMxBlock; ++i) {
    amax = __vmaxu2(amax, *reinterpret_cast<const uint32_t*>(&tile[r0 + i][2 * pair]) & 0x7fff7fffu);
  }
  const uint32_t scale_lo = detail::ScaleByteForAmaxBits(amax & 0xffffu);
  const uint32_t scale_hi = detail::ScaleByteForAmaxBits(amax >> 16);
  const float inv_lo = detail::InverseScale(scale_lo), inv_hi = detail::InverseScale(scale_hi);
  uint32_t lo[8], hi[8];
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    uint32_t word[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) word[e] = *reinterpret_cast<const uint32_t*>(&tile[r0 + 4 * q + e][2 * pair]);
    lo[q] = detail::E4M3x2(detail::BfLo(word[0]) * inv_lo, detail::BfLo(word[1]) * inv_lo) |
            (detail::E4M3x2(detail::BfLo(word[2]) * inv_lo, detail::BfLo(word[3]) * inv_lo) << 16);
    hi[q] = detail::E4M3x2(detail::BfHi(word[0]) * inv_hi, detail::BfHi(word[1]) * inv_hi) |
            (detail::E4M3x2(detail::BfHi(word[2]) * inv_hi, detail::BfHi(word[3]) * inv_hi) << 16);
    if (scale_lo == kE8M0Nan) lo[q] = 0x7f7f7f7fu;
    if (scale_hi == kE8M0Nan) hi[q] = 0x7f7f7f7fu;
  }
  // The pair holds columns P..P+3 (even lane P, P+1; odd lane P+2, P+3). The even lane receives
  // the odd lane's first halves, the odd lane the even lane's second halves.
  const bool odd = threadIdx.x & 1;
  uint32_t got_lo[4], got_hi[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    got_lo[q] = __shfl_xor_sync(detail::kFullMask, odd ? lo[q] : lo[4 + q], 1);
    got_hi[q] = __shfl_xor_sync(detail::kFullMask, odd ? hi[q] : hi[4 + q], 1);
  }
  if (!valid) return;
  const int64_t out_row = tile_row + r0;
  const int64_t first_col = odd ? c0 - 2 : c0;
  uint8_t* base = col_data + first_col * padded_rows + out_row + (odd ? 16 : 0);
  const uint4 own_lo = odd ? make_uint4(lo[4], lo[5], lo[6], lo[7]) : make_uint4(lo[0], lo[1], lo[2], lo[3]);
  const uint4 own_hi = odd ? make_uint4(hi[4], hi[5], hi[6], hi[7]) : make_uint4(hi[0], hi[1], hi[2], hi[3]);
  const uint4 other_lo = make_uint4(got_lo[0], got_lo[1], got_lo[2], got_lo[3]);
  const uint4 other_hi = make_uint4(got_hi[0], got_hi[1], got_hi[2], got_hi[3]);
  *reinterpret_cast<uint4*>(base) = odd ? other_lo : own_lo;                        // column P
  *reinterpret_cast<uint4*>(base + padded_rows) = odd ? other_hi : own_hi;          // column P+1
  *reinterpret_cast<uint4*>(base + 2 * padded_rows) = odd ? own_lo : other_lo;      // column P+2
  *reinterpret_cast<uint4*>(base + 3 * padded_rows) = odd ? own_hi : other_hi;      // column P+3
  const int64_t scales_per_col = padded_rows / kMxBlock;
  col_scales[c0 * scales_per_col + out_row / kMxBlock] = static_cast<uint8_t>(scale_lo);
  col_scales[(c0 + 1) * scales_per_col + out_row / kMxBlock] = static_cast<uint8_t>(scale_hi);
}

// One block: 128 padded rows (their groups resolved once) x kColTilesPerBlock column tiles of 128,
// the next tile's loads in flight while the current one is quantized column-wise.
constexpr int kColTilesPerBlock = 4;

__global__ void __launch_bounds__(kTileThreads, 3)
    QuantizeRowColKernel(const Bf16* __restrict__ x, int64_t rows, int64_t cols,
                         const int32_t* __restrict__ offsets, int num_groups,
                         uint8_t* __restrict__ row_data, uint8_t* __restrict__ row_scales,
                         uint8_t* __restrict__ col_data, uint8_t* __restrict__ col_scales,
                         const int32_t* __restrict__ padded_offsets, int64_t padded_rows) {
  __shared__ __align__(16) Bf16 tile[kTileRows][kTileCols];
  __shared__ RowBlock blocks[kRowBlocksPerTile];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t tile_row = static_cast<int64_t>(blockIdx.y) * kTileRows;
  if (warp < kRowBlocksPerTile) {
    const RowBlock b = ResolveRowBlock(tile_row + warp * kMxBlock, offsets, padded_offsets,
                                       num_groups, rows);
    if (lane == 0) blocks[warp] = b;
  }
  __syncthreads();
  if (blocks[0].source_row < 0) return;  // the whole row tile is past the last group

  const int col_tiles = static_cast<int>((cols + kTileCols - 1) / kTileCols);
  const int first = blockIdx.x * kColTilesPerBlock;
  const int last = min(first + kColTilesPerBlock, col_tiles);
  const int vec = threadIdx.x & 15;  // 16 vectors of 8 columns per tile row
  const int64_t blocks_per_row = cols / kMxBlock;
  uint4 v[kTileRows / 16];
  LoadTile(x, cols, static_cast<int64_t>(first) * kTileCols + vec * 8, blocks, v);
  for (int ct = first; ct < last; ++ct) {
    const int64_t tile_col = static_cast<int64_t>(ct) * kTileCols;
    const int64_t col = tile_col + vec * 8;
    // Row-wise from registers (the condition is block-uniform: every lane reaches the shuffles).
#pragma unroll
    for (int i = 0; i < kTileRows / 16 && row_data != nullptr; ++i) {
      const int r = (threadIdx.x >> 4) + 16 * i;
      const RowBlock b = blocks[r / kMxBlock];
      const detail::MxQuad q = detail::QuantizeMxQuad(v[i]);
      if (col < cols && b.source_row >= 0 && (r % kMxBlock) < b.live) {
        const int64_t row = b.source_row + r % kMxBlock;
        *reinterpret_cast<uint2*>(row_data + row * cols + col) = q.data;
        if ((vec & 3) == 0) {
          row_scales[row * blocks_per_row + col / kMxBlock] = static_cast<uint8_t>(q.scale);
        }
      }
    }
    __syncthreads();  // the previous tile's column pass is done with `tile`
#pragma unroll
    for (int i = 0; i < kTileRows / 16; ++i) {
      *reinterpret_cast<uint4*>(&tile[(threadIdx.x >> 4) + 16 * i][vec * 8]) = v[i];
    }
    __syncthreads();
    if (ct + 1 < last) LoadTile(x, cols, col + kTileCols, blocks, v);
    ColumnPass(tile, blocks, tile_row, tile_col, cols, col_data, col_scales, padded_rows);
  }
}

// ---- Dequantize (row-wise) ----

template <typename Out>
__global__ void __launch_bounds__(256)
    DequantizeKernel(const uint2* __restrict__ data, const uint8_t* __restrict__ scales,
                     int64_t rows, int64_t cols, const int32_t* __restrict__ num_rows,
                     Out* __restrict__ out) {
  const int64_t live = num_rows == nullptr ? rows : min(rows, static_cast<int64_t>(max(0, *num_rows)));
  const int64_t total = live * (cols / 8);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint2 q = data[i];
    const uint8_t s = scales[i / 4];
    const float x = s == kE8M0Nan ? __uint_as_float(0x7fc00000u) : __uint_as_float(static_cast<uint32_t>(s) << 23);
    const uint32_t bytes[2] = {q.x, q.y};
    float f[8];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const __nv_fp8x2_storage_t two = static_cast<__nv_fp8x2_storage_t>(bytes[h] >> (16 * p));
        const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(two, __NV_E4M3);
        const float2 lohi = __half22float2(*reinterpret_cast<const __half2*>(&hr));
        // s == 0 is 2^-127, a binary32 subnormal: build it by multiplying two normal halves.
        const float scale = s == 0 ? 0x1p-64f * 0x1p-63f : x;
        f[4 * h + 2 * p] = lohi.x * scale;
        f[4 * h + 2 * p + 1] = lohi.y * scale;
      }
    }
    if constexpr (std::is_same_v<Out, float>) {
      reinterpret_cast<float4*>(out)[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
      reinterpret_cast<float4*>(out)[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
    } else {
      reinterpret_cast<uint4*>(out)[i] = detail::Pack8(f);
    }
  }
}

template <typename Out>
absl::Status Dequantize(int64_t rows, int64_t cols, const int32_t* num_rows, const uint8_t* data,
                        const uint8_t* scales, Out* out, Stream stream) {
  if (rows < 0) return absl::InvalidArgumentError("rows: must be >= 0");
  if (cols <= 0 || cols % kMxBlock != 0) {
    return absl::InvalidArgumentError("cols: must be a positive multiple of 32");
  }
  if (rows == 0) return absl::OkStatus();
  if (data == nullptr || scales == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("data, scales and out must be set");
  }
  DequantizeKernel<Out><<<GridStrideBlocks(rows * cols / 8, 256), 256, 0, stream>>>(
      reinterpret_cast<const uint2*>(data), scales, rows, cols, num_rows, out);
  return LaunchStatus("DequantizeKernel");
}

}  // namespace

absl::Status QuantizeMxfp8(const MxQuantizeShape& shape, const Bf16* x,
                           const int32_t* group_offsets, const MxRowwise* rowwise,
                           const MxColwise* colwise, Stream stream) {
  if (absl::Status s = ValidateMxQuantize(shape, x, rowwise, colwise); !s.ok()) return s;
  if (group_offsets == nullptr && shape.num_groups != 1) {
    return absl::InvalidArgumentError("num_groups: must be 1 when group_offsets is null");
  }
  if (colwise == nullptr) {
    if (shape.rows == 0) return absl::OkStatus();
    const int blocks = GridStrideBlocks(shape.rows * shape.cols / 16, kRowThreads * kRowUnroll);
    QuantizeRowwiseKernel<<<blocks, kRowThreads, 0, stream>>>(
        reinterpret_cast<const uint4*>(x), shape.rows, shape.cols, group_offsets,
        shape.num_groups, reinterpret_cast<uint4*>(rowwise->data), rowwise->scales);
    return LaunchStatus("QuantizeRowwiseKernel");
  }
  PaddedOffsetsKernel<<<1, kScanThreads, 0, stream>>>(group_offsets, shape.num_groups, shape.rows,
                                                      colwise->group_offsets);
  if (absl::Status s = LaunchStatus("PaddedOffsetsKernel"); !s.ok()) return s;
  const int64_t row_tiles = colwise->padded_rows / kTileRows + (colwise->padded_rows % kTileRows != 0);
  if (row_tiles > 65535) return absl::InvalidArgumentError("colwise.padded_rows: too many rows (> 8M)");
  const dim3 grid(detail::CeilDiv(detail::CeilDiv(shape.cols, kTileCols), kColTilesPerBlock),
                  static_cast<unsigned>(row_tiles));
  QuantizeRowColKernel<<<grid, kTileThreads, 0, stream>>>(
      x, shape.rows, shape.cols, group_offsets, shape.num_groups,
      rowwise == nullptr ? nullptr : rowwise->data, rowwise == nullptr ? nullptr : rowwise->scales,
      colwise->data, colwise->scales, colwise->group_offsets, colwise->padded_rows);
  return LaunchStatus("QuantizeRowColKernel");
}

absl::Status DequantizeMxfp8Rowwise(int64_t rows, int64_t cols, const int32_t* num_rows,
                                    const uint8_t* data, const uint8_t* scales, float* out,
                                    Stream stream) {
  return Dequantize(rows, cols, num_rows, data, scales, out, stream);
}

absl::Status DequantizeMxfp8Rowwise(int64_t rows, int64_t cols, const int32_t* num_rows,
                                    const uint8_t* data, const uint8_t* scales, Bf16* out,
                                    Stream stream) {
  return Dequantize(rows, cols, num_rows, data, scales, reinterpret_cast<__nv_bfloat16*>(out),
                    stream);
}

}  // namespace dropless::kernels::cuda
