// The fp8-block grouped GEMM on the Hopper layer (sm_90a), one kernel for the three products
// (fp8_block_grouped_gemm.h): persistent, warp-specialized, one 128 x 128 output tile per CTA at a
// time, K in stages of 128 = one scale block. The operand tiles, the tile walk and the epilogue
// are the MXFP8 kernel's (mx_gemm_kernel.cuh); what differs is the promotion: once per stage,
// with fp32 scales, and overlapped with the tensor cores.
//
// Warp roles (384 threads = 3 warpgroups):
//   warpgroup 0, warp 0, lane 0   TMA: A tile [128 rows][128 k] and B tile [128 cols][128 k] per
//                                 stage (128-byte swizzle, K-major)
//   warpgroup 0, warps 1..3       scale loaders, round robin over stages: the stage's 128 A row
//                                 scales and 128 B column scales, where the consumers read them
//   warpgroups 1, 2               consumers, 64 rows each: per stage four m64n128k32 e4m3 wgmmas
//                                 into a temporary (the first with scale-d = 0), then
//                                 acc += tmp * (sa * sb). Two temporaries alternate by stage:
//                                 stage s + 1's wgmmas run while stage s is promoted.
// Scales (fp32): A's of (row, K block kb) at a_scales[row * a_row_stride + kb * a_kb_stride]; B's
// of (output column c, kb) in group g at b_scales[g * b_batch_stride + (c / b_cols_per_scale) *
// b_row_stride + kb * b_kb_stride] (128 columns share a weight block's scale; 1 for the weight
// gradient's column-wise operands). kb counts 128-element K blocks from the operand's start.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_FP8_BLOCK_TMA_KERNEL_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_FP8_BLOCK_TMA_KERNEL_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/grouped_gemm/mxfp8/mx_gemm_kernel.cuh"
#include "kernels/cuda/hopper/mbarrier.cuh"
#include "kernels/cuda/hopper/smem.cuh"
#include "kernels/cuda/hopper/warpgroup.cuh"
#include "kernels/cuda/hopper/wgmma.cuh"

namespace dropless::kernels::fp8_block_tma {

using mxgemm::kBlockK;
using mxgemm::kBlockM;
using mxgemm::kBlockN;
using mxgemm::kTileBytes;
inline constexpr int kStages = 6;
inline constexpr int kThreads = 384;
// B scales per stage: [quad 4][36 floats]; quad q holds the 32 columns a consumer thread with
// lane % 4 == q owns (8 i + 2 q + b), contiguous, padded to 36 so the four quads hit other banks.
inline constexpr int kSbQuadStride = 36;
inline constexpr int kSaStageFloats = kBlockM;
inline constexpr int kSbStageFloats = 4 * kSbQuadStride;
inline constexpr int kSmemBytes = 1024 /*alignment slack*/ + kStages * (2 * kTileBytes) +
                                  kStages * (kSaStageFloats + kSbStageFloats) * 4 + 2 * kStages * 8;

struct Params {
  const float* a_scales;
  const float* b_scales;
  int64_t a_row_stride, a_kb_stride;
  int64_t b_row_stride, b_kb_stride, b_batch_stride;
  int b_cols_per_scale;    // 128 (weight blocks) or 1 (column-wise operands)
  int64_t a_rows;          // rows of A (bound for the scale reads)
  const int32_t* offsets;  // [num_groups + 1]
  int num_groups;
  int m;                 // k-grouped: output rows per group (fixed); m-grouped: unused
  int n;                 // output columns
  int k;                 // m-grouped: reduction length (fixed)
  int64_t offset_limit;  // clamp for offsets: max_rows (m-grouped) or P (k-grouped)
  void* out;
  int64_t ldc;               // elements per output row
  int64_t out_group_stride;  // k-grouped: elements per group's output
};

// One stage's scales: lane owns A rows and B columns lane + 32 q (q < 4); the loads are all
// issued before the first store. Rows and columns past the operands read as 0.
template <bool kGroupedK>
__device__ __forceinline__ void LoadStageScales(const Params& p, const mxgemm::Tile& tile, int kb,
                                                int lane, float* sa_dst, float* sb_dst) {
  float a[4], b[4];
  const float* b_base =
      p.b_scales + (kGroupedK ? int64_t{0} : static_cast<int64_t>(tile.g) * p.b_batch_stride) +
      static_cast<int64_t>(kb) * p.b_kb_stride;
  const float* a_base = p.a_scales + static_cast<int64_t>(kb) * p.a_kb_stride;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int r = lane + 32 * q;
    const int64_t row = static_cast<int64_t>(tile.a_row0) + r;
    const int col = tile.n_tile * kBlockN + r;
    a[q] = row < p.a_rows ? __ldg(a_base + row * p.a_row_stride) : 0.0f;
    b[q] = col < p.n ? __ldg(b_base + static_cast<int64_t>(col / p.b_cols_per_scale) * p.b_row_stride)
                     : 0.0f;
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int r = lane + 32 * q;
    hopper::StsF32(hopper::SmemAddr(sa_dst + r), a[q]);
    const int pos = ((r % 8) / 2) * kSbQuadStride + (r / 8) * 2 + (r % 2);
    hopper::StsF32(hopper::SmemAddr(sb_dst + pos), b[q]);
  }
}

// The scales one consumer thread needs for a stage: rows r0 and r0 + 8, the 32 columns of `quad`;
// the first kPrefetch float4s of the columns' read ahead of the wait for the stage's wgmmas (all 8
// would not fit in registers beside the accumulators), the rest during the promotion.
inline constexpr int kPrefetch = 2;
struct StageScales {
  float sa0, sa1;
  float4 b[kPrefetch];
  uint32_t rest;  // shared address of the remaining column scales
};

__device__ __forceinline__ StageScales ReadStageScales(const float* sa, const float* sb, int r0,
                                                       int quad) {
  StageScales sc;
  sc.sa0 = hopper::LdsF32(hopper::SmemAddr(sa + r0));
  sc.sa1 = hopper::LdsF32(hopper::SmemAddr(sa + r0 + 8));
  const uint32_t b4 = hopper::SmemAddr(sb + quad * kSbQuadStride);
#pragma unroll
  for (int v = 0; v < kPrefetch; ++v) sc.b[v] = hopper::LdsV4F32(b4 + 16 * v);
  sc.rest = b4 + 16 * kPrefetch;
  return sc;
}

// acc += tmp * (sa * sb). Register d = 4 i + 2 h + b holds row r0 + 8 h, column 8 i + 2 quad + b.
__device__ __forceinline__ void Promote(float (&acc)[64], const float (&tmp)[64],
                                        const StageScales& sc) {
#pragma unroll
  for (int v = 0; v < 8; ++v) {
    const float4 b4 = v < kPrefetch ? sc.b[v] : hopper::LdsV4F32(sc.rest + 16 * (v - kPrefetch));
    const float bs[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int d = 4 * (2 * v + half);
      const float b0 = bs[2 * half], b1 = bs[2 * half + 1];
      acc[d + 0] = fmaf(tmp[d + 0], sc.sa0 * b0, acc[d + 0]);
      acc[d + 1] = fmaf(tmp[d + 1], sc.sa0 * b1, acc[d + 1]);
      acc[d + 2] = fmaf(tmp[d + 2], sc.sa1 * b0, acc[d + 2]);
      acc[d + 3] = fmaf(tmp[d + 3], sc.sa1 * b1, acc[d + 3]);
    }
  }
}

// kDoubleBuffer: two temporaries alternate by stage (stage s + 1's wgmmas run beside stage s's
// promotion within the warpgroup; 192 accumulator registers, past the 168 a 384-thread CTA gets,
// so some spill); else one temporary, and the promotion of one consumer warpgroup runs beside the
// other's wgmmas.
template <typename OutT, bool kGroupedK, bool kDoubleBuffer>
__global__ void __launch_bounds__(kThreads, 1)
    Fp8BlockGroupedGemmKernel(const __grid_constant__ CUtensorMap map_a,
                              const __grid_constant__ CUtensorMap map_b,
                              const __grid_constant__ Params p) {
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

  mxgemm::TileWalker<kGroupedK, kBlockM, Params> walk(p);
  mxgemm::Tile tile;
  int it = 0;  // stages walked so far (slot = it % kStages, phase = (it / kStages) & 1)

  if (warpgroup == 0) {
    hopper::WarpgroupRegDealloc<40>();
    if (warp == 0) {
      if (lane != 0) return;
      for (int t = blockIdx.x; walk.Next(t, &tile); t += gridDim.x) {
        const int stages = tile.nk32 / 4;
        for (int s = 0; s < stages; ++s, ++it) {
          const int slot = it % kStages;
          hopper::BarrierWait(&empty[slot], ((it / kStages) & 1) ^ 1);
          hopper::BarrierArriveExpectBytes(&full[slot], 2 * kTileBytes);
          mxgemm::LoadStageOperands<false>(s_a + slot * kTileBytes, s_b + slot * kTileBytes,
                                           &map_a, &map_b, &full[slot], tile.k0 + s * kBlockK,
                                           tile.a_row0, tile.n_tile * kBlockN,
                                           kGroupedK ? 0 : tile.g);
        }
      }
    } else {
      const int loader = warp - 1;  // stages it with it % 3 == loader
      for (int t = blockIdx.x; walk.Next(t, &tile); t += gridDim.x) {
        const int stages = tile.nk32 / 4;
        for (int s = 0; s < stages; ++s, ++it) {
          if (it % 3 != loader) continue;
          const int slot = it % kStages;
          hopper::BarrierWait(&empty[slot], ((it / kStages) & 1) ^ 1);
          LoadStageScales<kGroupedK>(p, tile, tile.k0 / kBlockK + s, lane,
                                     s_sa + slot * kSaStageFloats, s_sb + slot * kSbStageFloats);
          hopper::BarrierArrive(&full[slot]);
        }
      }
    }
    return;
  }

  hopper::WarpgroupRegAlloc<232>();
  constexpr uint64_t kKb = mxgemm::KBlockUnits<false>(kBlockM);  // one 32-byte K block
  const int consumer = warpgroup - 1;
  const int r0 = consumer * 64 + (warp % 4) * 16 + lane / 4;  // rows r0, r0 + 8 of the tile
  const int quad = lane % 4;
  float acc[64], t0[64], t1[kDoubleBuffer ? 64 : 1];
#pragma unroll
  for (int i = 0; i < 64; ++i) t0[i] = 0.0f;
  if constexpr (kDoubleBuffer) {
#pragma unroll
    for (int i = 0; i < 64; ++i) t1[i] = 0.0f;
  }

  // Stage `stage`'s four wgmmas into tmp, one commit group (full[slot] waited for first).
  auto issue = [&](float(&tmp)[64], int stage) {
    const int slot = stage % kStages;
    hopper::BarrierWait(&full[slot], (stage / kStages) & 1);
    const uint64_t da = mxgemm::OperandDescriptor<false>(s_a + slot * kTileBytes, consumer * 64);
    const uint64_t db = mxgemm::OperandDescriptor<false>(s_b + slot * kTileBytes, 0);
    hopper::WgmmaFence();
    hopper::FenceRegs(tmp);
#pragma unroll
    for (int j = 0; j < 4; ++j) hopper::WgmmaM64N128K32(tmp, da + kKb * j, db + kKb * j, j);
    hopper::WgmmaCommit();
  };
  // Waits for stage `stage`'s wgmmas (kPending groups may stay in flight), promotes tmp, frees
  // the slot (lane 0's arrival through a predicate: C7518, hopper::BarrierArriveLane0).
  auto finish = [&](float(&tmp)[64], int stage, auto pending) {
    const int slot = stage % kStages;
    const StageScales sc = ReadStageScales(s_sa + slot * kSaStageFloats,
                                           s_sb + slot * kSbStageFloats, r0, quad);
    hopper::WgmmaWait<decltype(pending)::value>();
    hopper::FenceRegs(tmp);
    Promote(acc, tmp, sc);
    hopper::BarrierArriveLane0(&empty[slot], lane);
  };
  using OneInFlight = std::integral_constant<int, 1>;
  using NoneInFlight = std::integral_constant<int, 0>;

  for (int t = blockIdx.x; walk.Next(t, &tile); t += gridDim.x) {
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    const int stages = tile.nk32 / 4;
    const int base = it;
    if constexpr (kDoubleBuffer) {
      if (stages > 0) issue(t0, base);
      // t0 holds even stages, t1 odd ones; stage s + 1 is issued before stage s is promoted.
      for (int s = 0; s < stages; s += 2) {
        if (s + 1 < stages) {
          issue(t1, base + s + 1);
          finish(t0, base + s, OneInFlight{});
        } else {
          finish(t0, base + s, NoneInFlight{});
          break;
        }
        if (s + 2 < stages) {
          issue(t0, base + s + 2);
          finish(t1, base + s + 1, OneInFlight{});
        } else {
          finish(t1, base + s + 1, NoneInFlight{});
        }
      }
    } else {
      for (int s = 0; s < stages; ++s) {
        issue(t0, base + s);
        finish(t0, base + s, NoneInFlight{});
      }
    }
    it = base + stages;

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
        if (col < p.n) mxgemm::StorePair(row_ptr + col, acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
      }
    }
  }
}

}  // namespace dropless::kernels::fp8_block_tma

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_FP8_BLOCK_TMA_KERNEL_CUH_
