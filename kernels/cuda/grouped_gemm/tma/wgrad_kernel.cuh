// The bf16 weight gradient with fixed tensor maps (sm_90a): dW[e] = X_e^T . dY_e, reducing over
// each group's rows (launcher in tma_grouped_gemm.cu).
//
// The same cooperative 128 x 256 tile as the m-grouped kernel (m_grouped_kernel.cuh), over (k, n)
// of one expert's gradient, with both operands read M- / N-major from fixed 2-D maps: per stage two
// [64 rows][64 k] boxes of X and four [64 rows][64 n] boxes of dY at the group's rows. The last
// stage of a group usually holds rows of the next group (or of the unused buffer past offsets[E],
// whose bytes may be anything): the consumers zero those rows of all six boxes before its wgmmas,
// so they add exactly nothing. An empty group's gradient is zeroed by ZeroEmptyGroups before the
// launch.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_WGRAD_KERNEL_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_WGRAD_KERNEL_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/grouped_gemm/tma/tma_kernel_common.cuh"

namespace dropless::kernels::tmagemm {

struct WParams {
  const int32_t* offsets;
  int num_groups;
  int m_out;             // k: rows of dW[e]
  int n_out;             // n: columns of dW[e]
  int64_t offset_limit;  // max_rows
  void* out;             // [E * k][n]
};

struct WTile {
  int g, m_tile, n_tile, lo, hi;
};

struct WWalker : hopper::GroupWalk<WWalker, WParams> {
  int m_tiles, n_tiles;

  __device__ explicit WWalker(const WParams& params)
      : GroupWalk(params),
        m_tiles((params.m_out + kBM - 1) / kBM),
        n_tiles((params.n_out + kBN - 1) / kBN) {}
  __device__ int GroupTiles() { return hi > lo ? m_tiles * n_tiles : 0; }
  __device__ bool Next(int t, WTile* tile) {
    if (!Seek(t)) return false;
    const int local = t - first;
    *tile = WTile{g, local % m_tiles, local / m_tiles, lo, hi};
    return true;
  }
};

template <typename OutT>
__global__ void __launch_bounds__(kThreads, 1)
    TmaWgradKernel(const __grid_constant__ CUtensorMap map_x,
                   const __grid_constant__ CUtensorMap map_dy,
                   const __grid_constant__ CUtensorMap map_c, const __grid_constant__ WParams p) {
  uint8_t* smem = hopper::AlignedDynamicSmem();
  uint8_t* s_a = smem;
  uint8_t* s_b = s_a + kStages * kATileBytes;
  uint8_t* s_c = s_b + kStages * kBTileBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(s_c + kEpilogueBytes);
  uint64_t* empty = full + kStages;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    hopper::BarrierInitRing(full, empty, kStages, 1, 8);
    hopper::BarrierInitFence();
  }
  __syncthreads();

  WWalker walk(p);
  WTile tile;

  if (warpgroup == 0) {
    hopper::WarpgroupRegDealloc<40>();
    if (warp == 0 && lane == 0) {
      int it = 0;
      for (int t = blockIdx.x; walk.Next(t, &tile); t += gridDim.x) {
        const int m0 = tile.m_tile * kBM, n0 = tile.n_tile * kBN;
        const int k_tiles = (tile.hi - tile.lo + kBK - 1) / kBK;
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int slot = it % kStages;
          hopper::BarrierWait(&empty[slot], ((it / kStages) & 1) ^ 1);
          hopper::BarrierArriveExpectBytes(&full[slot], kATileBytes + kBTileBytes);
          const int r = tile.lo + kt * kBK;
#pragma unroll
          for (int j = 0; j < kBM / 64; ++j) {
            hopper::TmaLoad2d(s_a + slot * kATileBytes + j * (kBK * 128), &map_x, &full[slot],
                              m0 + 64 * j, r);
          }
#pragma unroll
          for (int j = 0; j < kBN / 64; ++j) {
            hopper::TmaLoad2d(s_b + slot * kBTileBytes + j * (kBK * 128), &map_dy, &full[slot],
                              n0 + 64 * j, r);
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
  uint8_t* s_ch = s_c + h * (kEpilogueBytes / 2);
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  auto release = [&](int slot) {
    if (lane == 0) hopper::BarrierArrive(&empty[slot]);
  };

  int it = 0;
  for (int t = blockIdx.x; walk.Next(t, &tile); t += gridDim.x) {
    const int k_tiles = (tile.hi - tile.lo + kBK - 1) / kBK;
    for (int kt = 0; kt < k_tiles; ++kt, ++it) {
      const int slot = it % kStages;
      hopper::BarrierWait(&full[slot], (it / kStages) & 1);
      const int valid_rows = tile.hi - (tile.lo + kt * kBK);
      if (valid_rows < kBK) {
        // Rows [valid_rows, 64) of the six boxes (two of X, four of dY) belong to no row of this
        // group: zero them (whole 128-byte rows, so the swizzle does not matter).
        const int per_box = (kBK - valid_rows) * 8;  // 16-byte chunks
        for (int idx = threadIdx.x - 128; idx < 6 * per_box; idx += 256) {
          const int box = idx / per_box, rem = idx % per_box;
          uint8_t* base = box < 2 ? s_a + slot * kATileBytes + box * (kBK * 128)
                                  : s_b + slot * kBTileBytes + (box - 2) * (kBK * 128);
          const uint32_t addr =
              hopper::SmemAddr(base + (valid_rows + rem / 8) * 128 + (rem % 8) * 16);
          hopper::StsZero16(addr);
        }
        hopper::FenceSharedForCopies();
        hopper::NamedBarrier(3, 256);  // both consumer warpgroups read every box of the stage
      }
      // M-major X boxes: warpgroup h's 64 k rows are box h; N-major dY: 64-column boxes 8 KiB
      // apart. A k16 step is 16 rows of 128 bytes in both.
      const uint64_t da =
          hopper::SmemDescriptor(s_a + slot * kATileBytes + h * (kBK * 128), kBK * 128, 1024);
      const uint64_t db = hopper::SmemDescriptor(s_b + slot * kBTileBytes, kBK * 128, 1024);
      hopper::WgmmaFence();
      hopper::FenceRegs(acc);
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        hopper::WgmmaM64N256K16<1, 1>(acc, da + (16 * 128 * kk >> 4), db + (16 * 128 * kk >> 4),
                                      (kt > 0 || kk > 0) ? 1 : 0);
      }
      hopper::WgmmaCommit();
      hopper::FenceRegs(acc);
      if (kt > 0) {
        hopper::WgmmaWait<1>();
        release((it - 1) % kStages);
      }
    }
    hopper::WgmmaWait<0>();
    hopper::FenceRegs(acc);
    release((it - 1) % kStages);

    // dW[e] rows are rows g * k + ... of the [E * k][n] output.
    const int valid = min(64, p.m_out - (tile.m_tile * kBM + 64 * h));
    const int row0 = tile.g * p.m_out + tile.m_tile * kBM + 64 * h, n0 = tile.n_tile * kBN;
    OutT* out = static_cast<OutT*>(p.out);
    if constexpr (sizeof(OutT) == 2) {
      StoreBlock<OutT, 128, 0>(acc, s_ch, &map_c, out, p.n_out, row0, n0, valid, 1 + h, r0, quad,
                               leader);
      StoreBlock<OutT, 128, 16>(acc, s_ch, &map_c, out, p.n_out, row0, n0 + 128, valid, 1 + h, r0,
                                quad, leader);
    } else {
      StoreBlock<OutT, 128, 0>(acc, s_ch, &map_c, out, p.n_out, row0, n0, valid, 1 + h, r0, quad,
                               leader);
      StoreBlock<OutT, 128, 8>(acc, s_ch, &map_c, out, p.n_out, row0, n0 + 64, valid, 1 + h, r0,
                               quad, leader);
      StoreBlock<OutT, 128, 16>(acc, s_ch, &map_c, out, p.n_out, row0, n0 + 128, valid, 1 + h, r0,
                                quad, leader);
      StoreBlock<OutT, 128, 24>(acc, s_ch, &map_c, out, p.n_out, row0, n0 + 192, valid, 1 + h, r0,
                                quad, leader);
    }
  }
  if (leader) hopper::BulkWaitRead<0>();
}

}  // namespace dropless::kernels::tmagemm

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_WGRAD_KERNEL_CUH_
