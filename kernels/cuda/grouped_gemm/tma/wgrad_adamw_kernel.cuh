// The bf16 weight gradient fused with AdamW (sm_90a): per expert e, G = X_e^T . dY_e in fp32
// registers, then in the epilogue AdamW of every element of W[e] (adamw_update.h's AdamWElement:
// the fp32 master, its moments and the bf16 working copy), so the gradient never reaches memory and
// the optimizer's traffic runs under the other warpgroup's tensor-core work. kAdamW = false
// stores G as fp32 instead (the same kernel's gradient, for tests and benchmarks). Launcher in
// wgrad_adamw.cu; contract in dropless/kernels/grouped_wgrad_adamw.h.
//
// Schedule: ping-pong as pingpong_kernel.cuh (each consumer warpgroup owns every other 128 x 128
// tile of the CTA's sequence; a turn barrier hands the tensor cores over once a warpgroup has
// waited on all of its stages), with operands as wgrad_kernel.cuh (X and dY read M- / N-major
// from fixed 2-D maps at the group's rows; a group's last stage has the rows past the group
// zeroed by its warpgroup). Empty groups have tiles too (G = 0: AdamW still decays the moments
// and the weight).
//
// The epilogue's master weights and moments come through shared memory: one thread of the
// producer warpgroup's warp 1 loads them with 2-D tensor maps, in the tile order, a piece ahead
// into a ring of kFPieceSlots pieces (a piece: the 32 rows one (accumulator half, row octet) of a
// warpgroup holds, 64 columns of each of m, v and the master; an fp32 array as 8 boxes of 8 rows x
// 32 columns in the 128-byte swizzle, so a warp's 8-byte reads take two wavefronts; bf16 moments
// (M = __nv_bfloat16) as 4 boxes of 8 rows x 64 columns, a warp's 4-byte reads one wavefront):
// 24 copies of 1 KiB per piece, 16 with bf16 moments. Loads from registers could not keep enough
// bytes in flight beside 128 accumulators. The new values are stored straight from registers, bf16
// moments stochastically rounded as adamw.h says (the draws keyed by the element's index plus
// AdamWMoments::first). The epilogue is a rolled loop over the pieces: unrolled, its IEEE
// arithmetic missed the instruction cache (docs/step_performance.md).
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_WGRAD_ADAMW_KERNEL_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_WGRAD_ADAMW_KERNEL_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "dropless/kernels/adamw_update.h"
#include "kernels/cuda/grouped_gemm/tma/tma_kernel_common.cuh"

namespace dropless::kernels::tmagemm {

inline constexpr int kFTile = 128;  // tile rows (k) and columns (n)
inline constexpr int kFStages = 4;
inline constexpr int kFStageBytes = 4 * 64 * 128;  // two X and two dY [64 rows][64] boxes
inline constexpr int kFPieceCols = 64;
inline constexpr int kFBoxBytes = 8 * 32 * 4;                 // 8 rows x 32 fp32, 128B-swizzled
inline constexpr int kFPieceArrayBytes = 4 * 2 * kFBoxBytes;  // box (warp w, column half c): 2 w + c
// A piece's moment array (m or v) with moments of type M: 32 rows x 64 columns.
template <typename M>
inline constexpr int kFMomentArrayBytes = 32 * kFPieceCols* static_cast<int>(sizeof(M));
template <typename M>  // param, m, v
inline constexpr int kFPieceBytes = kFPieceArrayBytes + 2 * kFMomentArrayBytes<M>;
inline constexpr int kFPiecesPerTile = 8;  // 2 accumulators x 2 row octets x 2 column halves
inline constexpr int kFPieceSlots = 3;
template <bool kAdamW, typename M>
inline constexpr int kFSmemBytes = 1024 + kFStages* kFStageBytes +
                                   (kAdamW ? kFPieceSlots * kFPieceBytes<M> : 0) +
                                   (2 * kFStages + 2 * kFPieceSlots + 4) * 8;

struct FParams {
  const int32_t* offsets;
  int num_groups;
  int m_out;             // k: rows of W[e]
  int n_out;             // n: columns of W[e]
  int64_t offset_limit;  // max_rows
  float* out;            // kAdamW = false: G [E][k][n]
  // kAdamW: [E][k][n] each
  float* param;
  AdamWMoments moments;  // of type M
  __nv_bfloat16* copy;
  const AdamWStep* step;
};

struct FTile {
  int g, m_tile, n_tile, lo, hi;
};

// Every group's tiles, empty groups included; within a group the k tiles of one n tile adjacent.
struct FWalker : hopper::GroupWalk<FWalker, FParams> {
  int m_tiles, n_tiles;

  __device__ explicit FWalker(const FParams& params)
      : GroupWalk(params),
        m_tiles((params.m_out + kFTile - 1) / kFTile),
        n_tiles((params.n_out + kFTile - 1) / kFTile) {}
  __device__ int GroupTiles() { return m_tiles * n_tiles; }
  __device__ bool Next(int t, FTile* tile) {
    if (!Seek(t)) return false;
    const int local = t - first;
    *tile = FTile{g, local % m_tiles, local / m_tiles, lo, hi};
    return true;
  }
};

// Piece q of a tile: accumulator a = q / 4 (tile rows 64 a ..), row octet hh = (q / 2) % 2, column
// half q % 2 (64 columns). Warp w of a warpgroup holds its rows 64 a + 16 w + 8 hh .. + 7.

// Shared-memory address of the two fp32 at (row j of warp w's 8, columns 8 i + 2 quad, + 1) of one
// array of a piece (i < 8): box 2 w + i / 4, its 16-byte chunk swizzled by the row.
__device__ __forceinline__ uint32_t PieceElements(uint32_t array, int w, int j, int i, int quad) {
  const int chunk = (2 * (i % 4) + quad / 2) ^ j;
  return array + (2 * w + i / 4) * kFBoxBytes + j * 128 + chunk * 16 + (quad % 2) * 8;
}
// The same for a bf16 moment array (4 boxes of 8 rows x 64, one per warp): the two bf16 at (row j,
// columns 8 i + 2 quad, + 1), in 16-byte chunk i swizzled by the row.
__device__ __forceinline__ uint32_t PieceBf16Elements(uint32_t array, int w, int j, int i,
                                                      int quad) {
  return array + w * 1024 + j * 128 + ((i ^ j) * 16) + quad * 4;
}
__device__ __forceinline__ float2 Bf16PairToFloat2(uint32_t bits) {
  return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
}
// Piece q's gradients of this thread: column pair ii (0..7) in g[2 ii], g[2 ii + 1].
template <int q>
__device__ __forceinline__ void PieceGradients(const float (&acc0)[64], const float (&acc1)[64],
                                               float (&g)[16]) {
  constexpr int hh = (q / 2) % 2, half = q % 2;
  const float(&acc)[64] = q / 4 == 0 ? acc0 : acc1;
#pragma unroll
  for (int ii = 0; ii < 8; ++ii) {
    g[2 * ii] = acc[4 * (8 * half + ii) + 2 * hh];
    g[2 * ii + 1] = acc[4 * (8 * half + ii) + 2 * hh + 1];
  }
}

template <bool kAdamW, typename M>
__global__ void __launch_bounds__(kThreads, 1)
    TmaWgradAdamWKernel(const __grid_constant__ CUtensorMap map_x,
                        const __grid_constant__ CUtensorMap map_dy,
                        const __grid_constant__ CUtensorMap map_param,
                        const __grid_constant__ CUtensorMap map_m,
                        const __grid_constant__ CUtensorMap map_v,
                        const __grid_constant__ FParams p) {
  uint8_t* smem = hopper::AlignedDynamicSmem();
  uint8_t* s_ab = smem;  // stage s: X boxes at s * kFStageBytes, dY boxes 16 KiB after
  uint8_t* s_piece = s_ab + kFStages * kFStageBytes;
  uint64_t* full =
      reinterpret_cast<uint64_t*>(s_piece + (kAdamW ? kFPieceSlots * kFPieceBytes<M> : 0));
  uint64_t* empty = full + kFStages;
  uint64_t* piece_full = empty + kFStages;
  uint64_t* piece_empty = piece_full + kFPieceSlots;
  uint64_t* turn = piece_empty + kFPieceSlots;
  // epilogue_turn[h]: warpgroup h may start its next epilogue (the other has waited on all the
  // pieces of its own, so that no piece wait is more than one phase ahead of its barrier).
  uint64_t* epilogue_turn = turn + 2;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    hopper::BarrierInitRing(full, empty, kFStages, 1, 4);
    hopper::BarrierInitRing(piece_full, piece_empty, kFPieceSlots, 1, 4);
    hopper::BarrierInit(&turn[0], 1);
    hopper::BarrierInit(&turn[1], 1);
    hopper::BarrierInit(&epilogue_turn[0], 1);
    hopper::BarrierInit(&epilogue_turn[1], 1);
    hopper::BarrierInitFence();
  }
  __syncthreads();

  FWalker walk(p);
  FTile tile;

  if (warpgroup == 0) {
    hopper::WarpgroupRegDealloc<40>();
    if (warp == 0 && lane == 0) {
      int it = 0;
      for (int t = blockIdx.x; walk.Next(t, &tile); t += gridDim.x) {
        const int m0 = tile.m_tile * kFTile, n0 = tile.n_tile * kFTile;
        const int k_tiles = (tile.hi - tile.lo + kBK - 1) / kBK;
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int slot = it % kFStages;
          hopper::BarrierWait(&empty[slot], ((it / kFStages) & 1) ^ 1);
          hopper::BarrierArriveExpectBytes(&full[slot], kFStageBytes);
          const int r = tile.lo + kt * kBK;
          uint8_t* stage = s_ab + slot * kFStageBytes;
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            hopper::TmaLoad2d(stage + j * (kBK * 128), &map_x, &full[slot], m0 + 64 * j, r);
            hopper::TmaLoad2d(stage + (2 + j) * (kBK * 128), &map_dy, &full[slot], n0 + 64 * j, r);
          }
        }
      }
    } else if (kAdamW && warp == 1 && lane == 0) {
      // The epilogue's pieces. Rows past k are another group's (or outside the tensor: zeros) and
      // never used; a box is always counted whole.
      const CUtensorMap* maps[3] = {&map_param, &map_m, &map_v};
      int piece = 0;
      for (int t = blockIdx.x; walk.Next(t, &tile); t += gridDim.x) {
        const int row_base = tile.g * p.m_out + tile.m_tile * kFTile;
        for (int q = 0; q < kFPiecesPerTile; ++q, ++piece) {
          const int slot = piece % kFPieceSlots;
          const int row0 = row_base + 64 * (q / 4) + 8 * ((q / 2) % 2);
          const int col0 = tile.n_tile * kFTile + kFPieceCols * (q % 2);
          hopper::BarrierWait(&piece_empty[slot], ((piece / kFPieceSlots) & 1) ^ 1);
          hopper::BarrierArriveExpectBytes(&piece_full[slot], kFPieceBytes<M>);
          uint8_t* dst = s_piece + slot * kFPieceBytes<M>;
          for (int arr = 0; arr < 3; ++arr) {
            uint8_t* array =
                dst + (arr == 0 ? 0 : kFPieceArrayBytes + (arr - 1) * kFMomentArrayBytes<M>);
            if (arr == 0 || sizeof(M) == 4) {
              for (int box = 0; box < 8; ++box) {
                hopper::TmaLoad2d(array + box * kFBoxBytes, maps[arr], &piece_full[slot],
                                  col0 + 32 * (box % 2), row0 + 16 * (box / 2));
              }
            } else {
              for (int box = 0; box < 4; ++box) {
                hopper::TmaLoad2d(array + box * 1024, maps[arr], &piece_full[slot], col0,
                                  row0 + 16 * box);
              }
            }
          }
        }
      }
    }
    return;
  }

  hopper::WarpgroupRegAlloc<232>();
  const int h = warpgroup - 1;
  const int wq = warp % 4;
  const int r0 = wq * 16 + lane / 4;
  const int quad = lane % 4;
  const bool leader = threadIdx.x % 128 == 0;
  float acc0[64], acc1[64];  // tile rows [0, 64) and [64, 128): X box 0 and 1
  auto release = [&](int slot) {
    if (lane == 0) hopper::BarrierArrive(&empty[slot]);
  };
  AdamWStep step{};
  if constexpr (kAdamW) step = *p.step;

  int it = 0, own = 0, piece = 0;
  for (int t = blockIdx.x, j = 0; walk.Next(t, &tile); t += gridDim.x, ++j) {
    const int k_tiles = (tile.hi - tile.lo + kBK - 1) / kBK;
    if (j % 2 != h) {  // the other warpgroup's tile: its stages and pieces come first
      it += k_tiles;
      piece += kFPiecesPerTile;
      continue;
    }
    hopper::BarrierWait(&turn[h], (own & 1) ^ (h == 0 ? 1 : 0));
    ++own;
    if (k_tiles == 0 && leader) hopper::BarrierArrive(&turn[h ^ 1]);
    // (An empty group's tile keeps these zeros; conditional code around the accumulators would
    // make ptxas serialize the wgmmas, C7518.)
#pragma unroll
    for (int i = 0; i < 64; ++i) acc0[i] = acc1[i] = 0.0f;
    for (int kt = 0; kt < k_tiles; ++kt, ++it) {
      const int slot = it % kFStages;
      uint8_t* stage = s_ab + slot * kFStageBytes;
      hopper::BarrierWait(&full[slot], (it / kFStages) & 1);
      if (kt == k_tiles - 1 && leader) hopper::BarrierArrive(&turn[h ^ 1]);
      const int valid_rows = tile.hi - (tile.lo + kt * kBK);
      if (valid_rows < kBK) {
        // Rows [valid_rows, 64) of the four boxes belong to no row of this group: zero them
        // (whole 128-byte rows, so the swizzle does not matter).
        const int per_box = (kBK - valid_rows) * 8;  // 16-byte chunks
        for (int idx = threadIdx.x % 128; idx < 4 * per_box; idx += 128) {
          const int box = idx / per_box, rem = idx % per_box;
          hopper::StsZero16(hopper::SmemAddr(stage + box * (kBK * 128) +
                                             (valid_rows + rem / 8) * 128 + (rem % 8) * 16));
        }
        hopper::FenceSharedForCopies();
        hopper::NamedBarrier(1 + h, 128);
      }
      const uint64_t da0 = hopper::SmemDescriptor(stage, kBK * 128, 1024);
      const uint64_t da1 = hopper::SmemDescriptor(stage + kBK * 128, kBK * 128, 1024);
      const uint64_t db = hopper::SmemDescriptor(stage + 2 * (kBK * 128), kBK * 128, 1024);
      hopper::WgmmaFence();
      hopper::FenceRegs(acc0);
      hopper::FenceRegs(acc1);
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        const int accumulate = (kt > 0 || kk > 0) ? 1 : 0;
        const uint64_t step_k = (16 * 128 * kk) >> 4;
        hopper::WgmmaM64N128K16<1, 1>(acc0, da0 + step_k, db + step_k, accumulate);
        hopper::WgmmaM64N128K16<1, 1>(acc1, da1 + step_k, db + step_k, accumulate);
      }
      hopper::WgmmaCommit();
      hopper::FenceRegs(acc0);
      hopper::FenceRegs(acc1);
      if (kt > 0) {
        hopper::WgmmaWait<1>();
        release((it - 1) % kFStages);
      }
    }
    hopper::WgmmaWait<0>();
    hopper::FenceRegs(acc0);
    hopper::FenceRegs(acc1);
    if (k_tiles > 0) release((it - 1) % kFStages);

    const int m0 = tile.m_tile * kFTile, n0 = tile.n_tile * kFTile;
    const int64_t row_base = static_cast<int64_t>(tile.g) * p.m_out + m0;
    if constexpr (kAdamW) {
      hopper::BarrierWait(&epilogue_turn[h], ((own - 1) & 1) ^ (h == 0 ? 1 : 0));
      // A rolled loop over the pieces (one piece's code: the unrolled epilogue missed the
      // instruction cache), each gathering its 16 gradients by a switch of constant indices.
#pragma unroll 1
      for (int q = 0; q < kFPiecesPerTile; ++q, ++piece) {
        float g[16];
        switch (q) {
          case 0: PieceGradients<0>(acc0, acc1, g); break;
          case 1: PieceGradients<1>(acc0, acc1, g); break;
          case 2: PieceGradients<2>(acc0, acc1, g); break;
          case 3: PieceGradients<3>(acc0, acc1, g); break;
          case 4: PieceGradients<4>(acc0, acc1, g); break;
          case 5: PieceGradients<5>(acc0, acc1, g); break;
          case 6: PieceGradients<6>(acc0, acc1, g); break;
          default: PieceGradients<7>(acc0, acc1, g); break;
        }
        const int tile_row = 64 * (q / 4) + r0 + 8 * ((q / 2) % 2);
        const bool row_ok = m0 + tile_row < p.m_out;
        const int64_t row_off = (row_base + tile_row) * p.n_out;
        const int col0 = n0 + kFPieceCols * (q % 2) + 2 * quad;
        const int slot = piece % kFPieceSlots;
        hopper::BarrierWait(&piece_full[slot], (piece / kFPieceSlots) & 1);
        const uint32_t base = hopper::SmemAddr(s_piece + slot * kFPieceBytes<M>);
        const uint32_t m_base = base + kFPieceArrayBytes;
        const uint32_t v_base = m_base + kFMomentArrayBytes<M>;
        // bf16 moments: this thread's elements of the piece are p.moments.first + row_off + col0
        // + 8 ii + {0, 1}.
        const MomentDraws draws(p.moments.stream,
                                static_cast<uint64_t>(p.moments.first + row_off + col0), step.step,
                                8 * 7 + 1);
#pragma unroll
        for (int ii = 0; ii < 8; ++ii) {
          const int col = col0 + 8 * ii;
          if (!row_ok || col >= p.n_out) continue;
          const uint32_t at = PieceElements(base, wq, lane / 4, ii, quad);
          float2 w = hopper::LdsV2F32(at);
          float2 m, v;
          if constexpr (sizeof(M) == 4) {
            m = hopper::LdsV2F32(m_base + (at - base));
            v = hopper::LdsV2F32(v_base + (at - base));
          } else {
            const uint32_t mv_at = PieceBf16Elements(0, wq, lane / 4, ii, quad);
            m = Bf16PairToFloat2(__float_as_uint(hopper::LdsF32(m_base + mv_at)));
            v = Bf16PairToFloat2(__float_as_uint(hopper::LdsF32(v_base + mv_at)));
          }
          w.x = AdamWElement(step, g[2 * ii], m.x, v.x, w.x);
          w.y = AdamWElement(step, g[2 * ii + 1], m.y, v.y, w.y);
          const int64_t at_g = row_off + col;
          *reinterpret_cast<float2*>(p.param + at_g) = w;
          if constexpr (sizeof(M) == 4) {
            *reinterpret_cast<float2*>(static_cast<float*>(p.moments.m) + at_g) = m;
            *reinterpret_cast<float2*>(static_cast<float*>(p.moments.v) + at_g) = v;
          } else {
            const uint2 packed =
                StochasticMomentPairs(m.x, m.y, v.x, v.y, draws(8 * ii), draws(8 * ii + 1));
            *reinterpret_cast<uint32_t*>(static_cast<M*>(p.moments.m) + at_g) = packed.x;
            *reinterpret_cast<uint32_t*>(static_cast<M*>(p.moments.v) + at_g) = packed.y;
          }
          *reinterpret_cast<__nv_bfloat162*>(p.copy + at_g) = __floats2bfloat162_rn(w.x, w.y);
        }
        __syncwarp();
        if (lane == 0) hopper::BarrierArrive(&piece_empty[slot]);
        if (q == kFPiecesPerTile - 1 && leader) hopper::BarrierArrive(&epilogue_turn[h ^ 1]);
      }
    } else {
#pragma unroll
      for (int q = 0; q < kFPiecesPerTile; ++q) {
        const int a = q / 4, hh = (q / 2) % 2, half = q % 2;
        const int tile_row = 64 * a + r0 + 8 * hh;
        const bool row_ok = m0 + tile_row < p.m_out;
        const int64_t row_off = (row_base + tile_row) * p.n_out;
#pragma unroll
        for (int ii = 0; ii < 8; ++ii) {
          const int i = 8 * half + ii;
          const int col = n0 + 8 * i + 2 * quad;
          if (row_ok && col < p.n_out) {
            *reinterpret_cast<float2*>(p.out + row_off + col) =
                a == 0 ? make_float2(acc0[4 * i + 2 * hh], acc0[4 * i + 2 * hh + 1])
                       : make_float2(acc1[4 * i + 2 * hh], acc1[4 * i + 2 * hh + 1]);
          }
        }
      }
    }
  }
}

}  // namespace dropless::kernels::tmagemm

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_WGRAD_ADAMW_KERNEL_CUH_
