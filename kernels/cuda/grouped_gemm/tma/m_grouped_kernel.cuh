// The bf16 m-grouped GEMM with fixed tensor maps (sm_90a), for the forward and the data gradient:
// persistent, warp-specialized, one 128 x 256 output tile per CTA at a time, K in stages of 64.
//
// CUTLASS's ptr-array grouped kernel keeps one TMA descriptor per operand and rewrites it on the
// device whenever a persistent CTA moves to another group; with tens of tiles per group and 132
// CTAs striding through them, that is nearly every tile, and the rewrite (global write, proxy
// fence, acquire) stalls the TMA producer each time. Here the operands need no per-group
// descriptor: A (the expert-contiguous token rows) is one 2-D map over all rows, and a tile's A
// box starts at its group's first row plus the tile's offset (rows past the group are loaded and
// not stored); B (the weights) is one 3-D map [E][.][.] whose outer coordinate is the expert.
// The tile walk is computed by every role from the device offsets (no host synchronization; the
// maps are encoded on the host from pointers alone, so a call is one launch and graph-capturable).
//
//   warpgroup 0, warp 0, lane 0   TMA: per stage the A box [128 rows][64 k] and the B tile
//                                 (forward: W[e] is [k][n], N-major: four [64 k][64 n] boxes;
//                                 data gradient: W[e] read as [k out][n red], K-major: one
//                                 [256][64] box), 128-byte swizzle, 4 stages of 48 KiB
//   warpgroups 1, 2               consumers: rows [64 h, 64 h + 64) x all 256 columns, four
//                                 m64n256k16 wgmmas per stage, one stage in flight; the tile's
//                                 epilogue (StoreBlock) goes through swizzled shared memory and
//                                 TMA stores (masked 16-byte stores for a group's partial tile)
//                                 while the producer already loads the next tile's stages.
//
// The same kernel as a 2 x 1 cluster (kCluster 2) shares the B tile between the CTAs of the
// cluster. The ping-pong variant (128 x 128 tiles, one per consumer warpgroup, for short
// reductions) is in pingpong_kernel.cuh, the weight gradient in wgrad_kernel.cuh, the launchers in
// tma_grouped_gemm.cu.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_M_GROUPED_KERNEL_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_M_GROUPED_KERNEL_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/grouped_gemm/tma/tma_kernel_common.cuh"

namespace dropless::kernels::tmagemm {

// kNMajorB: the forward (B = W[e] as stored, [k][n]); else the data gradient (B = W[e] read as
// [k out][n red], K-major). kCluster 2: two CTAs (a 2 x 1 cluster) take the two M tiles of one
// (group, N tile) pair and share the B tile: each loads half of it into both (TMA multicast), so
// the weights cross from L2 once per pair; a group with an odd number of M tiles gives one CTA an
// empty tile (it multiplies rows it does not store).
template <bool kNMajorB, int kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    TmaGroupedGemmKernel(const __grid_constant__ CUtensorMap map_a,
                         const __grid_constant__ CUtensorMap map_b,
                         const __grid_constant__ CUtensorMap map_c,
                         const __grid_constant__ Params p) {
  if (p.gate != nullptr && *p.gate != p.gate_value) return;  // uniform over the grid
  uint8_t* smem = hopper::AlignedDynamicSmem();
  uint8_t* s_a = smem;
  uint8_t* s_b = s_a + kStages * kATileBytes;
  uint8_t* s_c = s_b + kStages * kBTileBytes;  // [2 warpgroups][2 boxes][64 rows][128 bytes]
  uint64_t* full = reinterpret_cast<uint64_t*>(s_c + kEpilogueBytes);
  uint64_t* empty = full + kStages;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warpgroup = threadIdx.x / 128;
  const uint32_t rank = kCluster > 1 ? hopper::ClusterRank() : 0;
  // full: the producer's expect-tx arrival; empty: every consumer warp of the cluster
  hopper::InitRingForCluster<kCluster>(full, empty, kStages, 1, 8 * kCluster);

  Walker<kBN> walk(p, kCluster);
  Tile tile;
  const int k_tiles = (p.k_red + kBK - 1) / kBK;
  const int cluster_id = blockIdx.x / kCluster, clusters = gridDim.x / kCluster;

  if (warpgroup == 0) {
    hopper::WarpgroupRegDealloc<40>();
    if (warp == 0 && lane == 0) {
      int it = 0;
      for (int t = cluster_id; walk.Next(t, &tile, rank); t += clusters) {
        const int n0 = tile.n_tile * kBN;
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int slot = it % kStages;
          hopper::BarrierWait(&empty[slot], ((it / kStages) & 1) ^ 1);
          hopper::BarrierArriveExpectBytes(&full[slot], kATileBytes + kBTileBytes);
          const int kc = kt * kBK;
          hopper::TmaLoad2d(s_a + slot * kATileBytes, &map_a, &full[slot], kc, tile.a_row0);
          uint8_t* b = s_b + slot * kBTileBytes;
          if constexpr (kCluster == 1) {
            if constexpr (kNMajorB) {
#pragma unroll
              for (int j = 0; j < kBN / 64; ++j) {
                hopper::TmaLoad3d(b + j * (kBK * 128), &map_b, &full[slot], n0 + 64 * j, kc,
                                  tile.g);
              }
            } else {
              hopper::TmaLoad3d(b, &map_b, &full[slot], kc, n0, tile.g);
            }
          } else {
            // This CTA's half of B, into both CTAs.
            if constexpr (kNMajorB) {
#pragma unroll
              for (int jj = 0; jj < 2; ++jj) {
                const int j = 2 * rank + jj;
                hopper::TmaLoad3dMulticast(b + j * (kBK * 128), &map_b, &full[slot], n0 + 64 * j,
                                           kc, tile.g, 0x3);
              }
            } else {
              hopper::TmaLoad3dMulticast(b + rank * (kBTileBytes / 2), &map_b, &full[slot], kc,
                                         n0 + 128 * rank, tile.g, 0x3);
            }
          }
        }
      }
    }
  } else {
    hopper::WarpgroupRegAlloc<232>();
    const int h = warpgroup - 1;
    const int r0 = (warp % 4) * 16 + lane / 4;  // rows r0 and r0 + 8 of the warpgroup's 64
    const int quad = lane % 4;
    const bool leader = threadIdx.x % 128 == 0;
    uint8_t* s_ch = s_c + h * (kEpilogueBytes / 2);
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
    auto release = [&](int slot) {
      if (lane == 0) {
        if constexpr (kCluster == 1) {
          hopper::BarrierArrive(&empty[slot]);
        } else {
#pragma unroll
          for (int c = 0; c < kCluster; ++c) hopper::BarrierArriveCluster(&empty[slot], c);
        }
      }
    };
    // Per k16 step: A moves 32 bytes along its swizzled rows; B 32 bytes (K-major) or 16 rows of
    // 128 bytes (N-major).
    constexpr uint32_t kBStep = kNMajorB ? 16 * 128 : 32;

    int it = 0;
    for (int t = cluster_id; walk.Next(t, &tile, rank); t += clusters) {
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const int slot = it % kStages;
        hopper::BarrierWait(&full[slot], (it / kStages) & 1);
        const uint64_t da =
            hopper::SmemDescriptor(s_a + slot * kATileBytes + h * 64 * 128, 16, 1024);
        const uint64_t db = kNMajorB
                                ? hopper::SmemDescriptor(s_b + slot * kBTileBytes, kBK * 128, 1024)
                                : hopper::SmemDescriptor(s_b + slot * kBTileBytes, 16, 1024);
        hopper::WgmmaFence();
        hopper::FenceRegs(acc);
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          hopper::WgmmaM64N256K16<kNMajorB ? 1 : 0>(
              acc, da + (32 * kk >> 4), db + (kBStep * kk >> 4), (kt > 0 || kk > 0) ? 1 : 0);
        }
        hopper::WgmmaCommit();
        hopper::FenceRegs(acc);
        if (kt > 0) {
          hopper::WgmmaWait<1>();  // the previous stage's wgmmas are done: hand its buffers back
          release((it - 1) % kStages);
        }
      }
      hopper::WgmmaWait<0>();
      hopper::FenceRegs(acc);
      release((it - 1) % kStages);

      // Epilogue: the warpgroup's 64 x 256 in two column halves through its 16 KiB buffer.
      const int valid = min(64, tile.rows - (tile.m_tile * kBM + 64 * h));
      const int row0 = tile.a_row0 + 64 * h, n0 = tile.n_tile * kBN;
      StoreBlock<__nv_bfloat16, 128, 0>(acc, s_ch, &map_c, p.out, p.n_out, row0, n0, valid, 1 + h,
                                        r0, quad, leader);
      StoreBlock<__nv_bfloat16, 128, 16>(acc, s_ch, &map_c, p.out, p.n_out, row0, n0 + 128, valid,
                                         1 + h, r0, quad, leader);
    }
    if (leader) hopper::BulkWaitRead<0>();
  }
  // A CTA of a cluster leaves only when its peer no longer multicasts into it or arrives on its
  // barriers (every warp converged first: the barrier is .aligned).
  if constexpr (kCluster > 1) {
    __syncwarp();
    hopper::ClusterSync();
  }
}

}  // namespace dropless::kernels::tmagemm

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_M_GROUPED_KERNEL_CUH_
