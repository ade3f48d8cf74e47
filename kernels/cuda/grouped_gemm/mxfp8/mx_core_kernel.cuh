// The bf16-core MXFP8 m-grouped GEMM (sm_90a): the forward and the data gradient on the bf16 tensor
// cores, with no per-32 promotion. C[rows][n] = A . image[g]^T per group, where
//   A      is the MXFP8 activation operand (E4M3 [rows][k] + E8M0 scales [rows][k / 32]), turned
//          into exact bf16 values in registers (mx_bf16.cuh) and fed to wgmma as its register A
//          fragment;
//   image  is the weights' exact bf16 image [E][n][k], written once per weight update
//          (cuda::MxWeightImage, mxfp8.h), with k permuted within each 64 to match the order in
//          which the fragments read A (MxImagePhysicalColumn).
// Every product of two MXFP8 values is exact in bf16 x bf16 -> fp32, so the result is the exact
// product of the dequantized operands up to fp32 accumulation: the promotion kernels' semantics,
// without their two fp32 instructions per output element and 32 of K (whose issue rate bounds
// them at ~476 TFLOP/s on an H200, docs/mxfp8_gemm.md). The bf16 tensor cores run at half the
// fp8 rate; the activations still cross HBM as E4M3.
//
//   warpgroup 0, warp 0, lane 0   TMA: per stage A's box [128 rows][64 bytes] (no swizzle) and the
//                                 image's [256 n][64 k] box (128-byte swizzle), 4 stages of 40 KiB
//   warpgroups 1, 2               consumers: rows [64 h, 64 h + 64) x all 256 columns. Per stage a
//                                 thread loads 16 bytes of each of its two rows (one 16-byte shared
//                                 load each), converts them with the rows' scales into the 16
//                                 registers of four k16 A fragments, and issues four m64n256k16
//                                 wgmmas; the fragments are double buffered (stage parity), so the
//                                 next stage converts while this one multiplies. Epilogue as the
//                                 bf16 kernel's (tmagemm::StoreBlock).
// As a 2 x 1 cluster (kCluster 2) the two CTAs share the image tile (TMA multicast).
// The tile walk, parameters and epilogue are the bf16 fixed-map kernel's (tma_kernel_common.cuh).
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_MXFP8_MX_CORE_KERNEL_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_MXFP8_MX_CORE_KERNEL_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/grouped_gemm/tma/tma_kernel_common.cuh"
#include "kernels/cuda/mx_bf16.cuh"

namespace dropless::kernels::mxgemm::core {

using tmagemm::kBK;
using tmagemm::kBM;
using tmagemm::kBN;
using tmagemm::kEpilogueBytes;
using tmagemm::kStages;
using tmagemm::kThreads;

inline constexpr int kATileBytes = kBM * kBK;      // E4M3: 8 KiB
inline constexpr int kBTileBytes = kBN * kBK * 2;  // bf16: 32 KiB
inline constexpr int kSmemBytes =
    1024 + kStages * (kATileBytes + kBTileBytes) + kEpilogueBytes + 2 * kStages * 8;

struct Params {
  tmagemm::Params base;      // offsets, groups, n_out, k_red (a multiple of 64), max_rows, out
  const uint8_t* a_scales;   // [offset_limit][k_red / 32]
};

template <int N>
__device__ __forceinline__ void FenceFragments(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
  }
}

// The consumer warpgroups' part of MxCoreGemmKernel (below).
template <int kCluster>
__device__ __forceinline__ void Consume(const tmagemm::Params& p, const Params& cp,
                                        const CUtensorMap& map_c, uint8_t* s_a, uint8_t* s_b,
                                        uint8_t* s_c, uint64_t* full, uint64_t* empty,
                                        tmagemm::Walker<kBN>& walk, int k_tiles, int cluster_id,
                                        int clusters, uint32_t rank) {
  hopper::WarpgroupRegAlloc<232>();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = threadIdx.x / 128 - 1;
  const int r0 = (warp % 4) * 16 + lane / 4;  // rows r0 and r0 + 8 of the warpgroup's 64
  const int quad = lane % 4;
  const bool leader = threadIdx.x % 128 == 0;
  uint8_t* s_ch = s_c + h * (kEpilogueBytes / 2);
  const int scale_stride = p.k_red / 32;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  uint32_t frag_even[4][4], frag_odd[4][4];  // A fragments of even / odd stages
  // A stage's buffers go back to the producer of every CTA of the cluster (each loaded into both).
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

  int it = 0;
  tmagemm::Tile tile;
  for (int t = cluster_id; walk.Next(t, &tile, rank); t += clusters) {
    // The scale bytes of this thread's two rows (rows past the buffer read its last row: their
    // products are never stored) and of its 16-byte quarter of each 64: block 2 kt + quad / 2.
    const int64_t last = p.offset_limit - 1;
    const int64_t row_lo = min(static_cast<int64_t>(tile.a_row0 + 64 * h + r0), last);
    const int64_t row_hi = min(static_cast<int64_t>(tile.a_row0 + 64 * h + r0 + 8), last);
    const uint8_t* sc_lo = cp.a_scales + row_lo * scale_stride + quad / 2;
    const uint8_t* sc_hi = cp.a_scales + row_hi * scale_stride + quad / 2;
    uint32_t e_lo = __ldg(sc_lo), e_hi = __ldg(sc_hi);
    const uint32_t a_offset = (64 * h + r0) * kBK + 16 * quad;

    auto stage = [&](int kt, uint32_t(&frag)[4][4]) {
      const int slot = it % kStages;
      // The next stage's scales, a stage ahead of their use.
      uint32_t next_lo = 0, next_hi = 0;
      if (kt + 1 < k_tiles) {
        next_lo = __ldg(sc_lo + 2 * (kt + 1));
        next_hi = __ldg(sc_hi + 2 * (kt + 1));
      }
      const mxbf16::Factors f_lo = mxbf16::FactorsOf(e_lo), f_hi = mxbf16::FactorsOf(e_hi);
      hopper::BarrierWait(&full[slot], (it / kStages) & 1);
      const uint32_t a_tile = hopper::SmemAddr(s_a + slot * kATileBytes) + a_offset;
      const uint4 x_lo = hopper::LdsV4U32(a_tile);
      const uint4 x_hi = hopper::LdsV4U32(a_tile + 8 * kBK);
      const uint32_t w_lo[4] = {x_lo.x, x_lo.y, x_lo.z, x_lo.w};
      const uint32_t w_hi[4] = {x_hi.x, x_hi.y, x_hi.z, x_hi.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        frag[j][0] = mxbf16::E4m3PairToBf16<false>(w_lo[j], f_lo);
        frag[j][1] = mxbf16::E4m3PairToBf16<false>(w_hi[j], f_hi);
        frag[j][2] = mxbf16::E4m3PairToBf16<true>(w_lo[j], f_lo);
        frag[j][3] = mxbf16::E4m3PairToBf16<true>(w_hi[j], f_hi);
      }
      e_lo = next_lo;
      e_hi = next_hi;
      const uint64_t db = hopper::SmemDescriptor(s_b + slot * kBTileBytes, 16, 1024);
      hopper::WgmmaFence();
      hopper::FenceRegs(acc);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        hopper::WgmmaM64N256K16RegA<0>(acc, frag[j], db + (32 * j >> 4), (kt > 0 || j > 0) ? 1 : 0);
      }
      hopper::WgmmaCommit();
      hopper::FenceRegs(acc);
      if (kt > 0) {
        // The previous stage's wgmmas are done: its buffers go back to the producer and its
        // fragments (the other parity) may be rewritten.
        hopper::WgmmaWait<1>();
        if (kt % 2 == 1) {
          FenceFragments(frag_even);
        } else {
          FenceFragments(frag_odd);
        }
        release((it - 1) % kStages);
      }
      ++it;
    };
    for (int kt = 0; kt < k_tiles; kt += 2) {
      stage(kt, frag_even);
      if (kt + 1 < k_tiles) stage(kt + 1, frag_odd);
    }
    hopper::WgmmaWait<0>();
    hopper::FenceRegs(acc);
    FenceFragments(frag_even);
    FenceFragments(frag_odd);
    release((it - 1) % kStages);

    // Epilogue: the warpgroup's 64 x 256 in two column halves through its 16 KiB buffer.
    const int valid = min(64, tile.rows - (tile.m_tile * kBM + 64 * h));
    const int row0 = tile.a_row0 + 64 * h, n0 = tile.n_tile * kBN;
    tmagemm::StoreBlock<__nv_bfloat16, 128, 0>(acc, s_ch, &map_c, p.out, p.n_out, row0, n0, valid,
                                               1 + h, r0, quad, leader);
    tmagemm::StoreBlock<__nv_bfloat16, 128, 16>(acc, s_ch, &map_c, p.out, p.n_out, row0, n0 + 128,
                                                valid, 1 + h, r0, quad, leader);
  }
  if (leader) hopper::BulkWaitRead<0>();
}

// kCluster 2: two CTAs (a 2 x 1 cluster) take the two M tiles of one (group, N tile) pair and
// share the image tile: each loads half of it into both (TMA multicast), as the bf16 kernel's
// cluster variant; a group with an odd number of M tiles gives one CTA an empty tile.
template <int kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    MxCoreGemmKernel(const __grid_constant__ CUtensorMap map_a,
                     const __grid_constant__ CUtensorMap map_b,
                     const __grid_constant__ CUtensorMap map_c, const __grid_constant__ Params cp) {
  const tmagemm::Params& p = cp.base;
  uint8_t* smem = hopper::AlignedDynamicSmem();
  uint8_t* s_b = smem;  // 1024-byte aligned for the 128-byte swizzle
  uint8_t* s_a = s_b + kStages * kBTileBytes;
  uint8_t* s_c = s_a + kStages * kATileBytes;  // [2 warpgroups][2 boxes][64 rows][128 bytes]
  uint64_t* full = reinterpret_cast<uint64_t*>(s_c + kEpilogueBytes);
  uint64_t* empty = full + kStages;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warpgroup = threadIdx.x / 128;
  const uint32_t rank = kCluster > 1 ? hopper::ClusterRank() : 0;
  // full: the producer's expect-tx arrival; empty: every consumer warp of the cluster
  hopper::InitRingForCluster<kCluster>(full, empty, kStages, 1, 8 * kCluster);

  tmagemm::Walker<kBN> walk(p, kCluster);
  tmagemm::Tile tile;
  const int k_tiles = p.k_red / kBK;
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
            hopper::TmaLoad3d(b, &map_b, &full[slot], kc, n0, tile.g);
          } else {  // this CTA's half of the image tile, into both CTAs
            hopper::TmaLoad3dMulticast(b + rank * (kBTileBytes / 2), &map_b, &full[slot], kc,
                                       n0 + (kBN / 2) * static_cast<int>(rank), tile.g, 0x3);
          }
        }
      }
    }
  } else {
    Consume<kCluster>(p, cp, map_c, s_a, s_b, s_c, full, empty, walk, k_tiles, cluster_id,
                      clusters, rank);
  }
  // A CTA of a cluster leaves only when its peer no longer multicasts into it or arrives on its
  // barriers (every warp converged first: the barrier is .aligned).
  if constexpr (kCluster > 1) {
    __syncwarp();
    hopper::ClusterSync();
  }
}


}  // namespace dropless::kernels::mxgemm::core

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_MXFP8_MX_CORE_KERNEL_CUH_
