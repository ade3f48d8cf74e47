// The bf16 m-grouped GEMM with fixed tensor maps, ping-pong variant (sm_90a): one 128 x 128 tile
// per consumer warpgroup, for the forward and the data gradient (operands, maps and tile walk as
// in the cooperative kernel, m_grouped_kernel.cuh; launcher in tma_grouped_gemm.cu).
//
// The cooperative kernel multiplies with both warpgroups on one tile, so the tensor cores
// idle while they store it (about 2.5 stage times per tile on an H200: 8% of a qwen3 tile with
// 32 stages, 18% at K = 768). Here each consumer warpgroup owns every other tile of the CTA's
// sequence (128 x 128, two m64n128k16 per k16 step); the producer fills the stage ring in tile
// order, and a turn barrier lets a warpgroup start its main loop only once the other has waited on
// all of its stages (so a stage's full-barrier phase is never more than one ahead of its waiter),
// which runs one warpgroup's epilogue under the other's main loop.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_PINGPONG_KERNEL_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_PINGPONG_KERNEL_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/grouped_gemm/tma/tma_kernel_common.cuh"

namespace dropless::kernels::tmagemm {

inline constexpr int kPBN = 128;
inline constexpr int kPStages = 6;
inline constexpr int kPBTileBytes = kPBN * kBK * 2;  // 16 KiB
inline constexpr int kPEpilogueBytes =
    2 * 64 * 128 * 2;  // per warpgroup 64 x 128 bf16 (half a tile)
inline constexpr int kPSmemBytes =
    1024 + kPStages * (kATileBytes + kPBTileBytes) + kPEpilogueBytes + (2 * kPStages + 2) * 8;

template <bool kNMajorB>
__global__ void __launch_bounds__(kThreads, 1)
    TmaPingpongKernel(const __grid_constant__ CUtensorMap map_a,
                      const __grid_constant__ CUtensorMap map_b,
                      const __grid_constant__ CUtensorMap map_c, const __grid_constant__ Params p) {
  if (p.gate != nullptr && *p.gate != p.gate_value) return;
  uint8_t* smem = hopper::AlignedDynamicSmem();
  uint8_t* s_a = smem;
  uint8_t* s_b = s_a + kPStages * kATileBytes;
  uint8_t* s_c = s_b + kPStages * kPBTileBytes;  // [2 warpgroups][2 boxes][64 rows][128 bytes]
  uint64_t* full = reinterpret_cast<uint64_t*>(s_c + kPEpilogueBytes);
  uint64_t* empty = full + kPStages;
  uint64_t* turn = empty + kPStages;  // turn[h]: warpgroup h may start its next main loop

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    hopper::BarrierInitRing(full, empty, kPStages, 1,
                            4);  // empty: the consuming warpgroup's four warps
    hopper::BarrierInit(&turn[0], 1);
    hopper::BarrierInit(&turn[1], 1);
    hopper::BarrierInitFence();
  }
  __syncthreads();

  Walker<kPBN> walk(p, 1);
  Tile tile;
  const int k_tiles = (p.k_red + kBK - 1) / kBK;

  if (warpgroup == 0) {
    hopper::WarpgroupRegDealloc<40>();
    if (warp == 0 && lane == 0) {
      int it = 0;
      for (int t = blockIdx.x; walk.Next(t, &tile, 0); t += gridDim.x) {
        const int n0 = tile.n_tile * kPBN;
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int slot = it % kPStages;
          hopper::BarrierWait(&empty[slot], ((it / kPStages) & 1) ^ 1);
          hopper::BarrierArriveExpectBytes(&full[slot], kATileBytes + kPBTileBytes);
          const int kc = kt * kBK;
          hopper::TmaLoad2d(s_a + slot * kATileBytes, &map_a, &full[slot], kc, tile.a_row0);
          uint8_t* b = s_b + slot * kPBTileBytes;
          if constexpr (kNMajorB) {
            hopper::TmaLoad3d(b, &map_b, &full[slot], n0, kc, tile.g);
            hopper::TmaLoad3d(b + kBK * 128, &map_b, &full[slot], n0 + 64, kc, tile.g);
          } else {
            hopper::TmaLoad3d(b, &map_b, &full[slot], kc, n0, tile.g);
          }
        }
      }
    }
    return;
  }

  hopper::WarpgroupRegAlloc<232>();
  const int h = warpgroup - 1;
  const int r0 = (warp % 4) * 16 + lane / 4;
  const int quad = lane % 4;
  const bool leader = threadIdx.x % 128 == 0;
  uint8_t* s_ch = s_c + h * (kPEpilogueBytes / 2);
  float acc0[64], acc1[64];  // rows [0, 64) and [64, 128) of the warpgroup's tile
#pragma unroll
  for (int i = 0; i < 64; ++i) acc0[i] = acc1[i] = 0.0f;
  auto release = [&](int slot) {
    if (lane == 0) hopper::BarrierArrive(&empty[slot]);
  };
  constexpr uint32_t kBStep = kNMajorB ? 16 * 128 : 32;

  int it = 0, own = 0;
  for (int t = blockIdx.x, j = 0; walk.Next(t, &tile, 0); t += gridDim.x, ++j) {
    if (j % 2 != h) {  // the other warpgroup's tile: its stages come first in the ring
      it += k_tiles;
      continue;
    }
    hopper::BarrierWait(&turn[h], (own & 1) ^ (h == 0 ? 1 : 0));
    ++own;
    for (int kt = 0; kt < k_tiles; ++kt, ++it) {
      const int slot = it % kPStages;
      hopper::BarrierWait(&full[slot], (it / kPStages) & 1);
      if (kt == k_tiles - 1 && leader) hopper::BarrierArrive(&turn[h ^ 1]);
      const uint64_t da = hopper::SmemDescriptor(s_a + slot * kATileBytes, 16, 1024);
      const uint64_t db = kNMajorB
                              ? hopper::SmemDescriptor(s_b + slot * kPBTileBytes, kBK * 128, 1024)
                              : hopper::SmemDescriptor(s_b + slot * kPBTileBytes, 16, 1024);
      hopper::WgmmaFence();
      hopper::FenceRegs(acc0);
      hopper::FenceRegs(acc1);
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        const int accumulate = (kt > 0 || kk > 0) ? 1 : 0;
        hopper::WgmmaM64N128K16<kNMajorB ? 1 : 0>(acc0, da + (32 * kk >> 4),
                                                  db + (kBStep * kk >> 4), accumulate);
        hopper::WgmmaM64N128K16<kNMajorB ? 1 : 0>(acc1, da + ((64 * 128 + 32 * kk) >> 4),
                                                  db + (kBStep * kk >> 4), accumulate);
      }
      hopper::WgmmaCommit();
      hopper::FenceRegs(acc0);
      hopper::FenceRegs(acc1);
      if (kt > 0) {
        hopper::WgmmaWait<1>();
        release((it - 1) % kPStages);
      }
    }
    hopper::WgmmaWait<0>();
    hopper::FenceRegs(acc0);
    hopper::FenceRegs(acc1);
    release((it - 1) % kPStages);

    const int n0 = tile.n_tile * kPBN;
    const int rows_left = tile.rows - tile.m_tile * kBM;
    StoreBlock<__nv_bfloat16, 64, 0>(acc0, s_ch, &map_c, p.out, p.n_out, tile.a_row0, n0,
                                     min(64, rows_left), 1 + h, r0, quad, leader);
    StoreBlock<__nv_bfloat16, 64, 0>(acc1, s_ch, &map_c, p.out, p.n_out, tile.a_row0 + 64, n0,
                                     min(64, rows_left - 64), 1 + h, r0, quad, leader);
  }
  if (leader) hopper::BulkWaitRead<0>();
}

}  // namespace dropless::kernels::tmagemm

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_PINGPONG_KERNEL_CUH_
