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

// ---- Row-wise + column-wise tile kernel ----
//
// A persistent grid walks tiles of kRows padded rows x kCols columns, column tiles fastest (the
// blocks running at once read whole input rows). Each tile is copied to shared memory with
// 16-byte cp.async (padding rows and rows past the last group arrive as zeros); kStages - 1 tiles
// are in flight while one is quantized. From the staged tile:
//   column-wise: thread -> (column pair, 32-row block); its 32 words give two MX blocks, whose
//     E4M3 bytes go to a transposed shared tile [kCols][kRows] (16-byte chunks XOR-swizzled by
//     column, so neither the writes nor the reads conflict on banks); the tile then leaves as
//     kRows-byte runs per column, 16 bytes per lane, whole 128-byte lines per 8 lanes.
//   row-wise: 4 lanes per MX block of a row (conflict-free 16-byte reads), 8-byte stores.
// Per-tile bookkeeping is kept off the critical path: a tile's coordinates and row blocks are
// resolved one pipeline step ahead, during the quantization of an earlier tile, with 32-bit
// arithmetic and a group search that resumes where the block's previous tile left it.

struct RowBlock {
  int32_t source_row;  // input row of the block's first padded row; -1: past the last group
  int32_t live;        // rows of the block that hold data (the rest is group padding)
};

template <int kBlocks>
struct TileSlot {
  int32_t tile_row;  // first padded row
  int32_t tile_col;  // first column
  RowBlock blocks[kBlocks];
};

// kAliasOutT: the transposed tile is written over the staged tile it comes from (one more barrier
// per tile, 16 KB less shared memory, so one more block fits per multiprocessor).
template <int kRowsT, int kColsT, int kStagesT, int kThreadsT, bool kAliasOutT, int kMinBlocksT>
struct RowColConfig {
  static constexpr int kRows = kRowsT, kCols = kColsT, kStages = kStagesT, kThreads = kThreadsT;
  static constexpr bool kAliasOut = kAliasOutT;
  static constexpr int kMinBlocks = kMinBlocksT;  // __launch_bounds__ occupancy target
  static constexpr int kBlocks = kRows / kMxBlock;          // 32-row blocks per tile
  static constexpr int kChunksPerRow = kCols / 8;           // 16-byte bf16 chunks per tile row
  static constexpr int kRowStep = kThreads / kChunksPerRow; // rows between one thread's chunks
  static constexpr int kRowChunks = kRows / kRowStep;       // chunks per thread
  static constexpr int kPairs = kCols / 2;                  // column pairs per tile
  static constexpr int kColItems = kPairs * kBlocks / kThreads;         // per thread
  static constexpr int kOutChunksPerCol = kRows / 16;       // 16-byte E4M3 chunks per column
  static constexpr int kColStep = kThreads / kOutChunksPerCol;  // columns between a thread's chunks
  static constexpr int kOutChunks = kCols / kColStep;       // per thread
  static constexpr int kRing = kStages + 1;                 // tile slots (see the main loop)
  static constexpr size_t kStageBytes = size_t{kRows} * kCols * 2;
  static constexpr size_t kOutBytes = size_t{kCols} * kRows;
  static constexpr size_t kOutRegion = kAliasOut ? 0 : kOutBytes;  // separate transposed tile
  static constexpr size_t kSmemBytes = kStages * kStageBytes + kOutRegion + kCols * kBlocks;
  static_assert(kRows % 128 == 0 && kCols % 64 == 0, "tile: 128k rows, 64k columns");
  static_assert(kStages >= 2, "at least one tile in flight");
  static_assert(kOutBytes <= kStageBytes, "the transposed tile fits in a stage");
  static_assert(kThreads / 32 >= kBlocks, "one warp resolves each row block");
  static_assert(kThreads % kChunksPerRow == 0 && kMxBlock % kRowStep == 0, "load mapping");
  static_assert(kColItems >= 1 && kColItems * kThreads == kPairs * kBlocks, "column items");
  static_assert(kThreads % kOutChunksPerCol == 0 && kCols % kColStep == 0, "output mapping");
};

// Position of column c's 16-byte chunk k in the transposed shared tile: chunks XOR-swizzled by
// (c / 2) % 8, so 8 consecutive column pairs (a quarter warp's writes) and the 8 chunks of one
// column (a quarter warp's reads) each fall in 8 different bank groups.
template <class Cfg>
__device__ __forceinline__ int OutChunkOffset(int c, int k) {
  return c * Cfg::kRows + ((k ^ ((c >> 1) & 7)) << 4);
}

// Warp-collective: the group holding padded rows [padded_row, padded_row + 32). `group` is the
// warp's previous answer (0 at first): padded rows only grow along a block's tiles, so the search
// resumes there and usually takes one ballot.
__device__ __forceinline__ RowBlock ResolveRowBlock(int32_t padded_row, int& group,
                                                    const int32_t* __restrict__ offsets,
                                                    const int32_t* __restrict__ padded_offsets,
                                                    int num_groups, int32_t rows,
                                                    int32_t live_padded) {
  if (padded_row >= live_padded) return {-1, 0};
  const int lane = threadIdx.x & 31;
  // group = number of j in [1, G] with padded_offsets[j] <= padded_row (a prefix of [1, G]).
  for (;;) {
    const int j = group + 1 + lane;
    const unsigned le = __ballot_sync(kFullMask, j <= num_groups && padded_offsets[j] <= padded_row);
    group += __popc(le);
    if (le != kFullMask) break;
  }
  const int32_t local = padded_row - padded_offsets[group];
  const int32_t begin = offsets == nullptr ? 0 : offsets[group];
  const int32_t count = offsets == nullptr ? rows : offsets[group + 1] - begin;
  const int32_t live = count - local;
  return {begin + local, live < 0 ? 0 : (live > kMxBlock ? kMxBlock : live)};
}

template <class Cfg, bool kRowwise>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    QuantizeRowColKernel(const Bf16* __restrict__ x, int32_t rows, int32_t cols,
                         const int32_t* __restrict__ offsets, int num_groups,
                         uint8_t* __restrict__ row_data, uint8_t* __restrict__ row_scales,
                         uint8_t* __restrict__ col_data, uint8_t* __restrict__ col_scales,
                         const int32_t* __restrict__ padded_offsets, int32_t padded_rows,
                         bool word_scales) {
  constexpr int kRows = Cfg::kRows, kCols = Cfg::kCols, kThreads = Cfg::kThreads;
  constexpr int kBlocks = Cfg::kBlocks;
  extern __shared__ __align__(128) uint8_t smem[];
  // Transposed tile [kCols][kRows] (swizzled): its own region, or the stage it comes from.
  uint8_t* const out_region = smem + Cfg::kStages * Cfg::kStageBytes;
  uint8_t* const scale_tile = out_region + Cfg::kOutRegion;  // [kCols][kBlocks]
  __shared__ TileSlot<kBlocks> ring[Cfg::kRing];

  const int tid = threadIdx.x, warp = tid >> 5;
  const int32_t live_padded = padded_offsets[num_groups];
  const uint32_t col_tiles = (cols + kCols - 1) / kCols;
  const uint32_t items = (live_padded + kRows - 1) / kRows * col_tiles;  // < 2^31 (launcher)
  const uint32_t my_items = items > blockIdx.x ? (items - blockIdx.x - 1) / gridDim.x + 1 : 0;
  int group = 0;  // resolve warps: the group search's resume point

  // Warps 0..kBlocks-1: coordinates and row blocks of the block's i-th tile into ring slot.
  auto resolve = [&](uint32_t i) {
    if (i >= my_items || warp >= kBlocks) return;
    const uint32_t item = blockIdx.x + i * gridDim.x;
    const uint32_t row_tile = item / col_tiles;
    const int32_t tile_row = static_cast<int32_t>(row_tile) * kRows;
    TileSlot<kBlocks>& slot = ring[i % Cfg::kRing];
    const RowBlock b = ResolveRowBlock(tile_row + warp * kMxBlock, group, offsets, padded_offsets,
                                       num_groups, rows, live_padded);
    if ((tid & 31) == 0) {
      slot.blocks[warp] = b;
      if (warp == 0) {
        slot.tile_row = tile_row;
        slot.tile_col = static_cast<int32_t>(item - row_tile * col_tiles) * kCols;
      }
    }
  };
  // This thread's chunks of the i-th tile: column chunk tid % kChunksPerRow of rows
  // tid / kChunksPerRow + n * kRowStep. Always commits a group (empty past the end) so the wait
  // count stays uniform.
  const int load_ch = tid % Cfg::kChunksPerRow, load_r0 = tid / Cfg::kChunksPerRow;
  auto issue = [&](uint32_t i) {
    if (i < my_items) {
      const TileSlot<kBlocks>& slot = ring[i % Cfg::kRing];
      const int32_t col = slot.tile_col + load_ch * 8;
      Bf16* stage = reinterpret_cast<Bf16*>(smem + (i % Cfg::kStages) * Cfg::kStageBytes) +
                    load_r0 * kCols + load_ch * 8;
#pragma unroll
      for (int n = 0; n < Cfg::kRowChunks; ++n) {
        const RowBlock b = slot.blocks[n * Cfg::kRowStep / kMxBlock];
        const int rin = n * Cfg::kRowStep % kMxBlock + load_r0;
        const bool ok = col < cols && rin < b.live;  // live == 0 past the last group
        const Bf16* src = ok ? x + static_cast<int64_t>(b.source_row + rin) * cols + col : x;
        detail::CpAsync16(stage + n * Cfg::kRowStep * kCols, src, ok);
      }
    }
    detail::CpAsyncCommit();
  };

  // Tiles 0..kStages-1 are resolved up front; tile i + kStages during tile i. Without aliasing,
  // tile i + kStages is copied into stage i at the end of tile i; with aliasing, stage i still
  // holds the transposed tile then, so tile i + kStages - 1 is copied into stage i - 1 at the
  // start of tile i. Either way kStages - 1 tiles are in flight while one is quantized.
  constexpr int kAhead = Cfg::kAliasOut ? Cfg::kStages - 1 : Cfg::kStages;
  for (int s = 0; s < Cfg::kStages; ++s) resolve(s);
  __syncthreads();
  for (int s = 0; s < kAhead; ++s) issue(s);

  const int out_k = tid % Cfg::kOutChunksPerCol, out_c0 = tid / Cfg::kOutChunksPerCol;
  for (uint32_t i = 0; i < my_items; ++i) {
    detail::CpAsyncWait<kAhead - 1>();  // tile i has landed (this thread's copies)
    __syncthreads();                     // ... and everyone's; tile i - 1 is written out
    if constexpr (Cfg::kAliasOut) issue(i + Cfg::kStages - 1);  // into stage i - 1
    const TileSlot<kBlocks>& slot = ring[i % Cfg::kRing];
    const int32_t tile_row = slot.tile_row, tile_col = slot.tile_col;
    uint8_t* const stage_bytes = smem + (i % Cfg::kStages) * Cfg::kStageBytes;
    const Bf16* tile = reinterpret_cast<const Bf16*>(stage_bytes);
    uint8_t* const out_tile = Cfg::kAliasOut ? stage_bytes : out_region;

    // Row-wise straight from the staged tile, same chunk mapping as the copies (every lane
    // reaches the quad shuffles).
    if constexpr (kRowwise) {
      const int32_t col = tile_col + load_ch * 8;
#pragma unroll
      for (int n = 0; n < Cfg::kRowChunks; ++n) {
        const detail::MxQuad q = detail::QuantizeMxQuad(*reinterpret_cast<const uint4*>(
            tile + (load_r0 + n * Cfg::kRowStep) * kCols + load_ch * 8));
        const RowBlock b = slot.blocks[n * Cfg::kRowStep / kMxBlock];
        const int rin = n * Cfg::kRowStep % kMxBlock + load_r0;
        if (col < cols && rin < b.live) {
          const int64_t at = static_cast<int64_t>(b.source_row + rin) * cols + col;
          *reinterpret_cast<uint2*>(row_data + at) = q.data;
          if ((load_ch & 3) == 0) row_scales[at / kMxBlock] = static_cast<uint8_t>(q.scale);
        }
      }
    }

    // Column-wise MX blocks into the transposed shared tile.
#pragma unroll
    for (int n = 0; n < Cfg::kColItems; ++n) {
      const int idx = tid + n * kThreads;
      const int p = idx % Cfg::kPairs, w = idx / Cfg::kPairs;
      uint32_t word[kMxBlock];
      uint32_t amax = 0;
#pragma unroll
      for (int e = 0; e < kMxBlock; ++e) {
        word[e] = *reinterpret_cast<const uint32_t*>(tile + (w * kMxBlock + e) * kCols + 2 * p);
        amax = __vmaxu2(amax, word[e] & 0x7fff7fffu);
      }
      const uint32_t scale_lo = detail::ScaleByteForAmaxBits(amax & 0xffffu);
      const uint32_t scale_hi = detail::ScaleByteForAmaxBits(amax >> 16);
      const float inv_lo = detail::InverseScale(scale_lo), inv_hi = detail::InverseScale(scale_hi);
      uint32_t lo[8], hi[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const uint32_t* v = word + 4 * q;
        lo[q] = detail::E4M3x2(detail::BfLo(v[0]) * inv_lo, detail::BfLo(v[1]) * inv_lo) |
                (detail::E4M3x2(detail::BfLo(v[2]) * inv_lo, detail::BfLo(v[3]) * inv_lo) << 16);
        hi[q] = detail::E4M3x2(detail::BfHi(v[0]) * inv_hi, detail::BfHi(v[1]) * inv_hi) |
                (detail::E4M3x2(detail::BfHi(v[2]) * inv_hi, detail::BfHi(v[3]) * inv_hi) << 16);
        if (scale_lo == kE8M0Nan) lo[q] = 0x7f7f7f7fu;
        if (scale_hi == kE8M0Nan) hi[q] = 0x7f7f7f7fu;
      }
      if constexpr (Cfg::kAliasOut) {
        static_assert(!Cfg::kAliasOut || Cfg::kColItems == 1, "aliasing: one column item per thread");
        resolve(i + Cfg::kStages);
        __syncthreads();  // every read of stage i is done: the transposed tile may overwrite it
      }
      const int c = 2 * p;
      *reinterpret_cast<uint4*>(out_tile + OutChunkOffset<Cfg>(c, 2 * w)) =
          make_uint4(lo[0], lo[1], lo[2], lo[3]);
      *reinterpret_cast<uint4*>(out_tile + OutChunkOffset<Cfg>(c, 2 * w + 1)) =
          make_uint4(lo[4], lo[5], lo[6], lo[7]);
      *reinterpret_cast<uint4*>(out_tile + OutChunkOffset<Cfg>(c + 1, 2 * w)) =
          make_uint4(hi[0], hi[1], hi[2], hi[3]);
      *reinterpret_cast<uint4*>(out_tile + OutChunkOffset<Cfg>(c + 1, 2 * w + 1)) =
          make_uint4(hi[4], hi[5], hi[6], hi[7]);
      scale_tile[c * kBlocks + w] = static_cast<uint8_t>(scale_lo);
      scale_tile[(c + 1) * kBlocks + w] = static_cast<uint8_t>(scale_hi);
    }

    if constexpr (!Cfg::kAliasOut) resolve(i + Cfg::kStages);  // into tile i - 1's slot
    __syncthreads();  // transposed tile complete; slot i + kStages visible

    // The transposed tile leaves as kRows-byte runs per column; rows past the last group and
    // columns past `cols` stay untouched.
    const bool out_rows_live = slot.blocks[out_k / 2].source_row >= 0;
#pragma unroll
    for (int n = 0; n < Cfg::kOutChunks; ++n) {
      const int c = out_c0 + n * Cfg::kColStep;
      const int32_t col = tile_col + c;
      if (col < cols && out_rows_live) {
        *reinterpret_cast<uint4*>(col_data + static_cast<int64_t>(col) * padded_rows + tile_row +
                                  16 * out_k) =
            *reinterpret_cast<const uint4*>(out_tile + OutChunkOffset<Cfg>(c, out_k));
      }
    }
    const int64_t scales_per_col = padded_rows / kMxBlock;
    if (kBlocks == 4 && word_scales && slot.blocks[kBlocks - 1].source_row >= 0) {
      // All four row blocks live and 4-byte aligned scale runs: one word per column.
      for (int c = tid; c < kCols; c += kThreads) {
        if (tile_col + c < cols) {
          *reinterpret_cast<uint32_t*>(col_scales + (tile_col + c) * scales_per_col +
                                       tile_row / kMxBlock) =
              *reinterpret_cast<const uint32_t*>(scale_tile + c * kBlocks);
        }
      }
    } else {
      for (int idx = tid; idx < kCols * kBlocks; idx += kThreads) {
        const int c = idx / kBlocks, w = idx % kBlocks;
        if (tile_col + c < cols && slot.blocks[w].source_row >= 0) {
          col_scales[(tile_col + c) * scales_per_col + tile_row / kMxBlock + w] = scale_tile[idx];
        }
      }
    }
    // Stage i is free (everyone passed the barrier above): tile i + kStages goes into it.
    if constexpr (!Cfg::kAliasOut) issue(i + Cfg::kStages);
  }
  detail::CpAsyncWait<0>();  // no copy may outlive the block (the empty tail groups)
}

// Launches the row+column kernel with config Cfg on a persistent grid (resident blocks only).
template <class Cfg>
absl::Status LaunchRowCol(const MxQuantizeShape& shape, const Bf16* x, const int32_t* offsets,
                          const MxRowwise* rowwise, const MxColwise* colwise, Stream stream) {
  // Per kernel instance, once: the shared-memory limit and carveout, and the resident grid.
  static const int resident = [] {
    for (auto k : {QuantizeRowColKernel<Cfg, true>, QuantizeRowColKernel<Cfg, false>}) {
      if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(Cfg::kSmemBytes)) != cudaSuccess ||
          cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
      }
    }
    return detail::ResidentBlocks(QuantizeRowColKernel<Cfg, true>, Cfg::kThreads, Cfg::kSmemBytes);
  }();
  if (resident <= 0) {
    return absl::InternalError("QuantizeRowColKernel: shared-memory or occupancy setup failed");
  }
  const int64_t row_tiles = (colwise->padded_rows + Cfg::kRows - 1) / Cfg::kRows;
  const int64_t col_tiles = (shape.cols + Cfg::kCols - 1) / Cfg::kCols;
  if (row_tiles * col_tiles >= (int64_t{1} << 31) || shape.cols > INT32_MAX) {
    return absl::InvalidArgumentError("cols: too many tiles for one launch");
  }
  const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(row_tiles * col_tiles, resident)));
  // Column scales can go out as whole words when every column's run starts 4-byte aligned.
  const bool word_scales = (colwise->padded_rows / kMxBlock) % 4 == 0 &&
                           reinterpret_cast<uintptr_t>(colwise->scales) % 4 == 0;
  auto kernel = rowwise != nullptr ? QuantizeRowColKernel<Cfg, true> : QuantizeRowColKernel<Cfg, false>;
  kernel<<<blocks, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      x, static_cast<int32_t>(shape.rows), static_cast<int32_t>(shape.cols), offsets,
      shape.num_groups, rowwise == nullptr ? nullptr : rowwise->data,
      rowwise == nullptr ? nullptr : rowwise->scales, colwise->data, colwise->scales,
      colwise->group_offsets, static_cast<int32_t>(colwise->padded_rows), word_scales);
  return LaunchStatus("QuantizeRowColKernel");
}

// The configurations measured best on an H200 (docs/kernels.md): row-wise + column-wise, and
// column-wise alone (taller tiles: 256-byte column runs; the row-wise half prefers 128 columns).
using DefaultRowColConfig = RowColConfig<128, 128, 3, 256, false, 1>;
using DefaultColwiseConfig = RowColConfig<256, 64, 2, 256, false, 1>;

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
  if (rowwise == nullptr) {
    return LaunchRowCol<DefaultColwiseConfig>(shape, x, group_offsets, rowwise, colwise, stream);
  }
  return LaunchRowCol<DefaultRowColConfig>(shape, x, group_offsets, rowwise, colwise, stream);
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
