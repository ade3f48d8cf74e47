// The MXFP8 grouped GEMM: what both kernels share (parameters, operand and scale helpers, the tile
// walk) and the 128 x 128 kernel (sm_90a): persistent, warp-specialized, one 128 x 128 output tile
// per CTA at a time, K in stages of 128 (four 32-element scale blocks). The 256 x 128 kernel, the
// default where the token buffers hold 256 rows, is in mx_gemm_wide_kernel.cuh. The PTX wrappers
// (TMA, mbarriers, wgmma) are the Hopper layer's (kernels/cuda/hopper/).
//
// Warp roles (384 threads = 3 warpgroups):
//   warpgroup 0, warp 0, lane 0   TMA: A tile [128 rows][128 k] and B tile [128 cols][128 k] per
//                                 stage (128-byte swizzle, K-major, the layout wgmma reads)
//   warpgroup 0, warps 1..3       scale loaders, round robin over stages: read the E8M0 bytes of
//                                 the stage's 128 A rows and 128 B columns x 4 K blocks, convert
//                                 them to fp32 once per CTA, store them where the consumers read
//   warpgroups 1, 2               consumers, 64 rows each: per 32-element K block one
//                                 m64n128k32 e4m3 wgmma into a fresh temporary (scale-d = 0), then
//                                 acc += tmp * (sa * sb) in fp32. The temporaries are double
//                                 buffered: block i's wgmma runs while block i-1 is promoted.
// Stages are guarded by full / empty mbarriers; every role walks the same tile sequence from the
// device offsets, so no role needs to tell another which tile comes next.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_MXFP8_MX_GEMM_KERNEL_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_MXFP8_MX_GEMM_KERNEL_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/hopper/group_walk.cuh"
#include "kernels/cuda/hopper/mbarrier.cuh"
#include "kernels/cuda/hopper/smem.cuh"
#include "kernels/cuda/hopper/tma.cuh"
#include "kernels/cuda/hopper/warpgroup.cuh"
#include "kernels/cuda/hopper/wgmma.cuh"

namespace dropless::kernels::mxgemm {

inline constexpr int kBlockM = 128;
inline constexpr int kBlockN = 128;
inline constexpr int kBlockK = 128;  // bytes = elements (E4M3)
inline constexpr int kStages = 6;
inline constexpr int kThreads = 384;
inline constexpr int kTileBytes = kBlockM * kBlockK;  // 16 KiB, same for B
// B scales per stage: [kb 4][quad 4][36 floats]; quad q holds the 32 columns a consumer thread with
// lane % 4 == q owns (8 i + 2 q + b), contiguous, padded to 36 so the four quads hit other banks.
inline constexpr int kSbQuadStride = 36;
inline constexpr int kSbKbStride = 4 * kSbQuadStride;
inline constexpr int kSaStageFloats = kBlockM * 4;
inline constexpr int kSbStageFloats = 4 * kSbKbStride;
inline constexpr int kSmemBytes = 1024 /*alignment slack*/ + kStages * (2 * kTileBytes) +
                                  kStages * (kSaStageFloats + kSbStageFloats) * 4 + 2 * kStages * 8;

// Variant bit: pairs of full stages run as one straight-line pipeline of 8 K blocks (the wgmma
// pipeline drains every 8 blocks instead of every 4).
inline constexpr int kXStage = 1;

struct Params {
  // A: 2-D [a_rows][k_extent] uint8; B: 3-D [b_batches][n][k_extent] uint8 (K-major).
  const uint8_t* a_scales;  // [a_rows][a_scale_stride]
  const uint8_t* b_scales;  // [b_batches][n][b_scale_stride]
  // Scale of (row, K block kb) at row * *_scale_stride + kb * *_scale_kb_stride: row-major
  // operands (forward, data gradient) have kb stride 1; the weight gradient's block-major
  // column-wise operands (mxfp8.h) have row stride 1 and kb stride = rows.
  int64_t a_scale_stride;
  int64_t b_scale_stride;
  int64_t a_scale_kb_stride;
  int64_t b_scale_kb_stride;
  int64_t b_scale_batch_stride;
  int64_t a_rows;          // rows of A (bound for the scale reads)
  const int32_t* offsets;  // [num_groups + 1]
  int num_groups;
  int m;                 // k-grouped: output rows per group (fixed); m-grouped: unused
  int n;                 // output columns
  int k;                 // m-grouped: reduction length (fixed)
  int64_t offset_limit;  // clamp for offsets: max_rows (m-grouped) or P (k-grouped)
  void* out;
  int64_t ldc;                  // elements per output row
  int64_t out_group_stride;     // k-grouped: elements per group's output
  const uint8_t* a_scales_end;  // one past the last byte of each scale buffer
  const uint8_t* b_scales_end;
  // When set (device int32), the launch does nothing unless *gate == gate_value: the weight
  // gradient launches both tile shapes and a choice kernel picks one (mx_grouped_gemm.cu).
  const int32_t* gate;
  int32_t gate_value;
};

// ---- Operands ----

template <bool kBlockedK>
__device__ __forceinline__ void LoadStageOperands(uint8_t* a_dst, uint8_t* b_dst,
                                                  const CUtensorMap* map_a,
                                                  const CUtensorMap* map_b, uint64_t* bar, int kc,
                                                  int a_row0, int n0, int batch) {
  if constexpr (kBlockedK) {
    hopper::TmaLoad3d(a_dst, map_a, bar, 0, a_row0, kc / 32);
    hopper::TmaLoad3d(b_dst, map_b, bar, 0, n0, kc / 32);
  } else {
    hopper::TmaLoad2d(a_dst, map_a, bar, kc, a_row0);
    hopper::TmaLoad3d(b_dst, map_b, bar, kc, n0, batch);
  }
}

// Operand tiles of one stage. Row-major operands: [rows][128 bytes], 128-byte swizzle, K block j at
// +32 bytes (2 descriptor units). Block-major (kBlockedK): [4 K blocks][rows][32 bytes], 32-byte
// swizzle, K block j at + rows * 32 bytes.
template <bool kBlockedK>
__device__ __forceinline__ uint64_t OperandDescriptor(const uint8_t* tile, int row) {
  return kBlockedK ? hopper::SmemDescriptor(tile + row * 32, 16, 256, hopper::SmemSwizzle::k32B)
                   : hopper::SmemDescriptor(tile + row * 128, 16, 1024);
}
template <bool kBlockedK>
constexpr uint64_t KBlockUnits(int rows) {
  return kBlockedK ? static_cast<uint64_t>(rows) * 32 / 16 : 2;
}

// The stage's A and B boxes: row-major operands are K-major 2-D / 3-D maps at (k, row[, batch]);
// block-major operands 3-D maps {32, rows, P / 32} at (0, row, k / 32).
template <bool kBlockedK>
__device__ __forceinline__ void LoadStageOperands(uint8_t* a_dst, uint8_t* b_dst,
                                                  const CUtensorMap* map_a,
                                                  const CUtensorMap* map_b, uint64_t* bar, int kc,
                                                  int a_row0, int n0, int batch);

// 2^(b - 127) for an E8M0 byte; 0xFF is NaN, 0x00 the subnormal 2^-127.
__device__ __forceinline__ float E8M0ToFloat(uint32_t b) {
  if (b == 0xFFu) return __int_as_float(0x7fc00000);
  return b == 0 ? __int_as_float(0x00400000) : __int_as_float(static_cast<int>(b << 23));
}

// ---- Tile walk ----

// One tile: group g, tile (m_tile, n_tile) of that group's output.
struct Tile {
  int g;
  int m_tile, n_tile;
  int a_row0;  // A row coordinate of the tile's first row
  int rows;    // valid rows of this group (m-grouped) / output rows (k-grouped)
  int k0;      // first K element of the group (k-grouped: its padded offset)
  int nk32;    // 32-element K blocks to reduce
};

// Walks tiles in increasing linear order; every role of a CTA calls Next with the same sequence.
// Within a group the M tiles of one N tile are adjacent, so CTAs running side by side share B.
template <bool kGroupedK, int kTileM = kBlockM>
struct TileWalker : hopper::GroupWalk<TileWalker<kGroupedK, kTileM>, Params> {
  int m_tiles = 0;
  int n_tiles;

  __device__ explicit TileWalker(const Params& params)
      : hopper::GroupWalk<TileWalker<kGroupedK, kTileM>, Params>(params),
        n_tiles((params.n + kBlockN - 1) / kBlockN) {}

  __device__ int GroupTiles() {
    m_tiles =
        kGroupedK ? (this->p.m + kTileM - 1) / kTileM : (this->hi - this->lo + kTileM - 1) / kTileM;
    return m_tiles * n_tiles;
  }

  // False once t is past the last group's tiles.
  __device__ bool Next(int t, Tile* tile) {
    if (!this->Seek(t)) return false;
    const int local = t - this->first;
    tile->g = this->g;
    tile->m_tile = local % m_tiles;
    tile->n_tile = local / m_tiles;
    if (kGroupedK) {
      tile->a_row0 = tile->m_tile * kTileM;
      tile->rows = this->p.m;
      tile->k0 = this->lo;
      tile->nk32 = (this->hi - this->lo) / 32;
    } else {
      tile->a_row0 = this->lo + tile->m_tile * kTileM;
      tile->rows = this->hi - this->lo;
      tile->k0 = 0;
      tile->nk32 = this->p.k / 32;
    }
    return true;
  }
};

// ---- Roles ----

// Scale bytes of one stage (4 K blocks starting at kb0) for the tile's 128 A rows and 128 B
// columns, converted to fp32. Blocks at or past kb_end and rows / columns outside the operands read
// as 0. Each lane owns 4 rows and 4 columns; all 16 loads are issued before the first is used (the
// loads miss in L2 more often than not, so their latency, not their number, sets this warp's pace).
// The 4 bytes of a row need not be 4-byte aligned: the two aligned words around them are loaded and
// funnel-shifted. A word is loaded only if it holds a byte before `end` (an aligned word never
// crosses a page, so the bytes after `end` in it cannot fault); those bytes belong to K blocks past
// kb_end and are dropped.
__device__ __forceinline__ void LoadScaleWords(const uint8_t* src, const uint8_t* end, bool valid,
                                               uint32_t (&w)[2], uint32_t* shift) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(src);
  const uint32_t* aligned = reinterpret_cast<const uint32_t*>(a & ~uintptr_t{3});
  *shift = static_cast<uint32_t>(a & 3) * 8;
  w[0] = valid ? __ldg(aligned) : 0u;
  w[1] = valid && *shift != 0 && reinterpret_cast<const uint8_t*>(aligned + 1) < end
             ? __ldg(aligned + 1)
             : 0u;
}

// 16 scale bytes of one K block of a block-major scale buffer ([P / 32][rows], mxfp8.h): rows
// row0 .. row0 + 15 of K block kb, one 16-byte load (row0 is a multiple of 16, rows a multiple of
// 32, the buffer 16-byte aligned: checked by the launcher); zeros when the K block is past the
// reduction or the rows past the operand.
__device__ __forceinline__ uint4 LoadBlockScales16(const uint8_t* scales, int64_t rows, int kb,
                                                   int kb_end, int64_t row0) {
  if (kb >= kb_end || row0 >= rows) return make_uint4(0, 0, 0, 0);
  return __ldg(reinterpret_cast<const uint4*>(scales + static_cast<int64_t>(kb) * rows + row0));
}

__device__ __forceinline__ float ScaleByte(const uint4& v, int i) {
  const uint32_t w = i < 4 ? v.x : i < 8 ? v.y : i < 12 ? v.z : v.w;
  return E8M0ToFloat((w >> (8 * (i % 4))) & 0xFFu);
}

__device__ __forceinline__ void ScaleFloats(const uint32_t (&w)[2], uint32_t shift, int kb0,
                                            int kb_end, float (&v)[4]) {
  const uint32_t bytes = __funnelshift_r(w[0], w[1], shift);
#pragma unroll
  for (int j = 0; j < 4; ++j)
    v[j] = kb0 + j < kb_end ? E8M0ToFloat((bytes >> (8 * j)) & 0xFFu) : 0.0f;
}

// The weight gradient's block-major scales for one stage: 4 K blocks x (128 A rows + 128 B
// columns) = 64 vectors of 16 rows, two per lane; one 16-byte load each (a K block's rows are
// contiguous), 16 fp32 stores in the layouts LoadStageScales writes.
__device__ __forceinline__ void LoadStageBlockScales(const Params& p, const Tile& tile, int kb0,
                                                     int kb_end, int lane, float* sa_dst,
                                                     float* sb_dst) {
  uint4 v[2];
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const int j = lane % 4, r16 = 16 * (lane / 4);  // K block, first row of the vector
    v[q] = q == 0 ? LoadBlockScales16(p.a_scales, p.a_rows, kb0 + j, kb_end, tile.a_row0 + r16)
                  : LoadBlockScales16(p.b_scales, p.n, kb0 + j, kb_end,
                                      int64_t{tile.n_tile} * kBlockN + r16);
  }
  const int j = lane % 4, r16 = 16 * (lane / 4);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int r = r16 + i;
    hopper::StsF32(hopper::SmemAddr(sa_dst + r * 4 + j), ScaleByte(v[0], i));
    const int pos = ((r % 8) / 2) * kSbQuadStride + (r / 8) * 2 + (r % 2);
    hopper::StsF32(hopper::SmemAddr(sb_dst + j * kSbKbStride + pos), ScaleByte(v[1], i));
  }
}

template <bool kGroupedK>
__device__ __forceinline__ void LoadStageScales(const Params& p, const Tile& tile, int kb0,
                                                int kb_end, int lane, float* sa_dst,
                                                float* sb_dst) {
  uint32_t wa[4][2], wb[4][2], sha[4], shb[4];
  const uint8_t* b_base =
      p.b_scales + (kGroupedK ? int64_t{0} : static_cast<int64_t>(tile.g) * p.b_scale_batch_stride);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int r = lane + 32 * q;
    const int64_t row = static_cast<int64_t>(tile.a_row0) + r;
    const int col = tile.n_tile * kBlockN + r;
    {
      LoadScaleWords(p.a_scales + row * p.a_scale_stride + kb0, p.a_scales_end, row < p.a_rows,
                     wa[q], &sha[q]);
      LoadScaleWords(b_base + static_cast<int64_t>(col) * p.b_scale_stride + kb0, p.b_scales_end,
                     col < p.n, wb[q], &shb[q]);
    }
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int r = lane + 32 * q;
    float v[4];
    ScaleFloats(wa[q], sha[q], kb0, kb_end, v);
    hopper::StsV4F32(hopper::SmemAddr(sa_dst + r * 4), v[0], v[1], v[2], v[3]);
    ScaleFloats(wb[q], shb[q], kb0, kb_end, v);
    const int pos = ((r % 8) / 2) * kSbQuadStride + (r / 8) * 2 + (r % 2);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      hopper::StsF32(hopper::SmemAddr(sb_dst + j * kSbKbStride + pos), v[j]);
  }
}

// fp32 scales read ahead of the wait (float4s of 8): all 8 would not fit in registers beside the
// two temporaries.
inline constexpr int kPrefetchF32 = 4;

// The scales one thread needs for K block j of a stage: rows r0 and r0 + 8, the 32 columns of
// `quad`. Loaded before the wait for the block's wgmma, so the shared-memory latency hides under
// it. (bf16 bit patterns instead of fp32 halve the shared-memory bytes but cost one integer
// operation per scale: 8-12% slower, 2026-11-30.)
struct BlockScales {
  float sa0, sa1;
  float4 b[kPrefetchF32];  // the first columns' scales; the rest are read during the promotion
  uint32_t rest;           // shared address of the remaining ones
};

__device__ __forceinline__ BlockScales LoadBlockScales(const float* sa, const float* sb, int j,
                                                       int r0, int quad) {
  BlockScales sc;
  sc.sa0 = hopper::LdsF32(hopper::SmemAddr(sa + r0 * 4 + j));
  sc.sa1 = hopper::LdsF32(hopper::SmemAddr(sa + (r0 + 8) * 4 + j));
  const uint32_t b4 = hopper::SmemAddr(sb + j * kSbKbStride + quad * kSbQuadStride);
#pragma unroll
  for (int v = 0; v < kPrefetchF32; ++v) sc.b[v] = hopper::LdsV4F32(b4 + 16 * v);
  sc.rest = b4 + 16 * kPrefetchF32;
  return sc;
}

// acc += tmp * (sa * sb): one multiply and one fused multiply-add per element.
// Register d = 4 i + 2 h + b holds row r0 + 8 h, column 8 i + 2 quad + b (wgmma's D layout).
__device__ __forceinline__ void Promote(float (&acc)[64], const float (&tmp)[64],
                                        const BlockScales& sc) {
  auto apply = [&](int i, float b0, float b1) {
    const int d = 4 * i;
    acc[d + 0] = fmaf(tmp[d + 0], sc.sa0 * b0, acc[d + 0]);
    acc[d + 1] = fmaf(tmp[d + 1], sc.sa0 * b1, acc[d + 1]);
    acc[d + 2] = fmaf(tmp[d + 2], sc.sa1 * b0, acc[d + 2]);
    acc[d + 3] = fmaf(tmp[d + 3], sc.sa1 * b1, acc[d + 3]);
  };
#pragma unroll
  for (int v = 0; v < 8; ++v) {
    const float4 b =
        v < kPrefetchF32 ? sc.b[v] : hopper::LdsV4F32(sc.rest + 16 * (v - kPrefetchF32));
    apply(2 * v, b.x, b.y);
    apply(2 * v + 1, b.z, b.w);
  }
}

__device__ __forceinline__ void StorePair(__nv_bfloat16* dst, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void StorePair(float* dst, float a, float b) {
  *reinterpret_cast<float2*>(dst) = make_float2(a, b);
}

template <typename OutT, bool kGroupedK, int kVariant = 0>
__global__ void __launch_bounds__(kThreads, 1)
    MxGroupedGemmKernel(const __grid_constant__ CUtensorMap map_a,
                        const __grid_constant__ CUtensorMap map_b,
                        const __grid_constant__ Params p) {
  if (p.gate != nullptr && *p.gate != p.gate_value) return;  // the other kernel was chosen
  uint8_t* smem = hopper::AlignedDynamicSmem();
  uint8_t* s_a = smem;
  uint8_t* s_b = s_a + kStages * kTileBytes;
  float* s_sa = reinterpret_cast<float*>(s_b + kStages * kTileBytes);
  float* s_sb = s_sa + kStages * kSaStageFloats;
  uint64_t* full = reinterpret_cast<uint64_t*>(s_sb + kStages * kSbStageFloats);
  uint64_t* empty = full + kStages;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    // full: TMA's expect-tx arrival + the 32 lanes of a scale loader; empty: one arrival per
    // consumer warp
    hopper::BarrierInitRing(full, empty, kStages, 1 + 32, 8);
    hopper::BarrierInitFence();
  }
  __syncthreads();

  TileWalker<kGroupedK> walk(p);
  Tile tile;
  int it = 0;  // stages walked so far (slot = it % kStages, phase = (it / kStages) & 1)

  if (warpgroup == 0) {
    hopper::WarpgroupRegDealloc<40>();
    if (warp == 0) {
      if (lane != 0) return;
      for (int t = blockIdx.x; walk.Next(t, &tile); t += gridDim.x) {
        const int stages = (tile.nk32 + 3) / 4;
        for (int s = 0; s < stages; ++s, ++it) {
          const int slot = it % kStages;
          hopper::BarrierWait(&empty[slot], ((it / kStages) & 1) ^ 1);
          hopper::BarrierArriveExpectBytes(&full[slot], 2 * kTileBytes);
          const int kc = tile.k0 + s * kBlockK;
          LoadStageOperands<kGroupedK>(s_a + slot * kTileBytes, s_b + slot * kTileBytes, &map_a,
                                       &map_b, &full[slot], kc, tile.a_row0, tile.n_tile * kBlockN,
                                       kGroupedK ? 0 : tile.g);
        }
      }
    } else {
      const int loader = warp - 1;  // stages it with it % 3 == loader
      for (int t = blockIdx.x; walk.Next(t, &tile); t += gridDim.x) {
        const int stages = (tile.nk32 + 3) / 4;
        const int kb_end = tile.k0 / 32 + tile.nk32;
        for (int s = 0; s < stages; ++s, ++it) {
          if (it % 3 != loader) continue;
          const int slot = it % kStages;
          hopper::BarrierWait(&empty[slot], ((it / kStages) & 1) ^ 1);
          if constexpr (kGroupedK) {
            LoadStageBlockScales(p, tile, tile.k0 / 32 + 4 * s, kb_end, lane,
                                 s_sa + slot * kSaStageFloats, s_sb + slot * kSbStageFloats);
          } else {
            LoadStageScales<false>(p, tile, tile.k0 / 32 + 4 * s, kb_end, lane,
                                   s_sa + slot * kSaStageFloats, s_sb + slot * kSbStageFloats);
          }
          hopper::BarrierArrive(&full[slot]);
        }
      }
    }
    return;
  }

  hopper::WarpgroupRegAlloc<232>();
  // Descriptor units from one K block to the next in a stage's A and B tiles (both 128 rows).
  constexpr uint64_t kKb = KBlockUnits<kGroupedK>(kBlockM);
  const int consumer = warpgroup - 1;
  const int r0 = consumer * 64 + (warp % 4) * 16 + lane / 4;  // rows r0, r0 + 8 of the tile
  const int quad = lane % 4;
  float acc[64], t0[64], t1[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) t0[i] = t1[i] = 0.0f;

  // Lane 0's arrival through a predicate rather than a branch (C7518: BarrierArriveLane0). The
  // scale values and the wgmma reads of the slot have all been consumed by the time a warp gets
  // here.
  auto release = [&](int slot) { hopper::BarrierArriveLane0(&empty[slot], lane); };

  auto promote = [&](float(&tmp)[64], const BlockScales& sc) { Promote(acc, tmp, sc); };
  auto scales = [&](int slot, int j) {
    return LoadBlockScales(s_sa + slot * kSaStageFloats, s_sb + slot * kSbStageFloats, j, r0, quad);
  };

  for (int t = blockIdx.x; walk.Next(t, &tile); t += gridDim.x) {
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    const int stages = (tile.nk32 + 3) / 4;
    if constexpr ((kVariant & kXStage) != 0) {
      int s = 0;
      // Pairs of full stages: 8 blocks, block j + 1's wgmma issued before block j is promoted,
      // across the stage boundary; both stages are waited for before the first wgmma (no barrier
      // spin while a wgmma is in flight).
      for (; 4 * (s + 2) <= tile.nk32; s += 2, it += 2) {
        const int slot0 = it % kStages, slot1 = (it + 1) % kStages;
        hopper::BarrierWait(&full[slot0], (it / kStages) & 1);
        hopper::BarrierWait(&full[slot1], ((it + 1) / kStages) & 1);
        const uint64_t da0 = OperandDescriptor<kGroupedK>(s_a + slot0 * kTileBytes, consumer * 64);
        const uint64_t db0 = OperandDescriptor<kGroupedK>(s_b + slot0 * kTileBytes, 0);
        const uint64_t da1 = OperandDescriptor<kGroupedK>(s_a + slot1 * kTileBytes, consumer * 64);
        const uint64_t db1 = OperandDescriptor<kGroupedK>(s_b + slot1 * kTileBytes, 0);
        hopper::WgmmaFence();
        hopper::FenceRegs(t0);
        hopper::WgmmaM64N128K32(t0, da0, db0);
        hopper::WgmmaCommit();
        hopper::FenceRegs(t1);
        hopper::WgmmaM64N128K32(t1, da0 + kKb, db0 + kKb);
        hopper::WgmmaCommit();
        // clang-format off
        // Promote block J of SLOT from TD, then issue block JN (descriptors DA, DB) into TD.
#define MXGEMM_STEP(TD, J, DA, DB, SLOT, JN)                           \
        {                                                              \
          const auto sc = scales(SLOT, J);                             \
          hopper::WgmmaWait<1>();                                      \
          hopper::FenceRegs(TD);                                       \
          promote(TD, sc);                                             \
        }                                                              \
        hopper::WgmmaFence();                                          \
        hopper::FenceRegs(TD);                                         \
        hopper::WgmmaM64N128K32(TD, DA + kKb * (JN), DB + kKb * (JN)); \
        hopper::WgmmaCommit();
        MXGEMM_STEP(t0, 0, da0, db0, slot0, 2)
        MXGEMM_STEP(t1, 1, da0, db0, slot0, 3)
        MXGEMM_STEP(t0, 2, da1, db1, slot0, 0)
        // clang-format on
        {
          const auto sc = scales(slot0, 3);
          hopper::WgmmaWait<1>();
          hopper::FenceRegs(t1);
          promote(t1, sc);
        }
        release(slot0);
        hopper::WgmmaFence();
        hopper::FenceRegs(t1);
        hopper::WgmmaM64N128K32(t1, da1 + kKb, db1 + kKb);
        hopper::WgmmaCommit();
        MXGEMM_STEP(t0, 0, da1, db1, slot1, 2)
        MXGEMM_STEP(t1, 1, da1, db1, slot1, 3)
#undef MXGEMM_STEP
        {
          const auto sc = scales(slot1, 2);
          hopper::WgmmaWait<1>();
          hopper::FenceRegs(t0);
          promote(t0, sc);
        }
        {
          const auto sc = scales(slot1, 3);
          hopper::WgmmaWait<0>();
          hopper::FenceRegs(t1);
          promote(t1, sc);
        }
        release(slot1);
      }
      // The rest (at most one full stage and a partial one) block by block.
      for (; s < stages; ++s, ++it) {
        const int slot = it % kStages;
        hopper::BarrierWait(&full[slot], (it / kStages) & 1);
        const uint64_t desc_a =
            OperandDescriptor<kGroupedK>(s_a + slot * kTileBytes, consumer * 64);
        const uint64_t desc_b = OperandDescriptor<kGroupedK>(s_b + slot * kTileBytes, 0);
        for (int j = 0; 4 * s + j < tile.nk32 && j < 4; ++j) {
          hopper::WgmmaFence();
          hopper::FenceRegs(t0);
          hopper::WgmmaM64N128K32(t0, desc_a + kKb * j, desc_b + kKb * j);
          hopper::WgmmaCommit();
          const auto sc = scales(slot, j);
          hopper::WgmmaWait<0>();
          hopper::FenceRegs(t0);
          promote(t0, sc);
        }
        release(slot);
      }
    } else {
      for (int s = 0; s < stages; ++s, ++it) {
        const int slot = it % kStages;
        hopper::BarrierWait(&full[slot], (it / kStages) & 1);
        // K block j starts kKb descriptor units further: 32 bytes into each 128-byte row, or
        // (block- major operands) one K block slice of the tile further.
        const uint64_t desc_a =
            OperandDescriptor<kGroupedK>(s_a + slot * kTileBytes, consumer * 64);
        const uint64_t desc_b = OperandDescriptor<kGroupedK>(s_b + slot * kTileBytes, 0);
        if (4 * s + 4 <= tile.nk32) {
          // Full stage, straight-line so that the compiler sees each temporary's wgmma complete
          // before its promotion: block j + 1 runs on the tensor cores while block j is promoted.
          hopper::WgmmaFence();
          hopper::FenceRegs(t0);
          hopper::WgmmaM64N128K32(t0, desc_a, desc_b);
          hopper::WgmmaCommit();
          hopper::FenceRegs(t1);
          hopper::WgmmaM64N128K32(t1, desc_a + kKb, desc_b + kKb);
          hopper::WgmmaCommit();
          {
            const auto sc = scales(slot, 0);
            hopper::WgmmaWait<1>();
            hopper::FenceRegs(t0);
            promote(t0, sc);
          }
          hopper::WgmmaFence();
          hopper::FenceRegs(t0);
          hopper::WgmmaM64N128K32(t0, desc_a + 2 * kKb, desc_b + 2 * kKb);
          hopper::WgmmaCommit();
          {
            const auto sc = scales(slot, 1);
            hopper::WgmmaWait<1>();
            hopper::FenceRegs(t1);
            promote(t1, sc);
          }
          hopper::WgmmaFence();
          hopper::FenceRegs(t1);
          hopper::WgmmaM64N128K32(t1, desc_a + 3 * kKb, desc_b + 3 * kKb);
          hopper::WgmmaCommit();
          {
            const auto sc = scales(slot, 2);
            hopper::WgmmaWait<1>();
            hopper::FenceRegs(t0);
            promote(t0, sc);
          }
          {
            const auto sc = scales(slot, 3);
            hopper::WgmmaWait<0>();
            hopper::FenceRegs(t1);
            promote(t1, sc);
          }
        } else {
          // Last, partial stage of a group whose reduction is not a multiple of 128.
          for (int j = 0; 4 * s + j < tile.nk32; ++j) {
            hopper::WgmmaFence();
            hopper::FenceRegs(t0);
            hopper::WgmmaM64N128K32(t0, desc_a + kKb * j, desc_b + kKb * j);
            hopper::WgmmaCommit();
            const auto sc = scales(slot, j);
            hopper::WgmmaWait<0>();
            hopper::FenceRegs(t0);
            promote(t0, sc);
          }
        }
        release(slot);
      }
    }

    // Direct stores: two adjacent columns per register pair; rows past the group are not written.
    OutT* out = static_cast<OutT*>(p.out) +
                (kGroupedK ? static_cast<int64_t>(tile.g) * p.out_group_stride : int64_t{0});
    const int local_row = tile.m_tile * kBlockM + r0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (local_row + 8 * h >= tile.rows) continue;
      OutT* row_ptr = out + (static_cast<int64_t>(tile.a_row0) + r0 + 8 * h) * p.ldc;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int col = tile.n_tile * kBlockN + 8 * i + 2 * quad;
        if (col < p.n) StorePair(row_ptr + col, acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
      }
    }
  }
}

}  // namespace dropless::kernels::mxgemm

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_MXFP8_MX_GEMM_KERNEL_CUH_
