// What the bf16 fixed-map grouped GEMM kernels of tma/ share (sm_90a): the 128 x 256 x 64 tile and
// its shared-memory budget (the cooperative m-grouped kernel, m_grouped_kernel.cuh, and the weight
// gradient, wgrad_kernel.cuh), the m-grouped parameters and tile walk (the cooperative and the
// ping-pong kernel, pingpong_kernel.cuh), and the epilogue StoreBlock (all three). The launchers
// are in tma_grouped_gemm.cu; the PTX wrappers are the Hopper layer's (kernels/cuda/hopper/).
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_TMA_KERNEL_COMMON_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_TMA_KERNEL_COMMON_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/hopper/bulk_copy.cuh"
#include "kernels/cuda/hopper/cluster.cuh"
#include "kernels/cuda/hopper/group_walk.cuh"
#include "kernels/cuda/hopper/mbarrier.cuh"
#include "kernels/cuda/hopper/smem.cuh"
#include "kernels/cuda/hopper/tma.cuh"
#include "kernels/cuda/hopper/warpgroup.cuh"
#include "kernels/cuda/hopper/wgmma.cuh"

namespace dropless::kernels::tmagemm {

inline constexpr int kBM = 128;
inline constexpr int kBN = 256;
inline constexpr int kBK = 64;  // elements: 128 bytes of bf16 (one swizzle row)
inline constexpr int kStages = 4;
inline constexpr int kThreads = 384;
inline constexpr int kATileBytes = kBM * kBK * 2;  // 16 KiB
inline constexpr int kBTileBytes = kBN * kBK * 2;  // 32 KiB
inline constexpr int kEpilogueBytes =
    2 * 64 * 128 * 2;  // per warpgroup 64 x 128 bf16 (half a tile row)
inline constexpr int kSmemBytes =
    1024 + kStages * (kATileBytes + kBTileBytes) + kEpilogueBytes + 2 * kStages * 8;

struct Params {
  const int32_t* offsets;  // [num_groups + 1], clamped to [0, offset_limit]
  int num_groups;
  int n_out;             // output columns
  int k_red;             // reduction length
  int64_t offset_limit;  // max_rows
  __nv_bfloat16* out;    // [rows][n_out]
  const int32_t* gate;   // when set, the launch does nothing unless *gate == gate_value
  int32_t gate_value;
};

struct Tile {
  int g, m_tile, n_tile;
  int a_row0;  // first A row of the tile
  int rows;    // rows of the group
};

// Tiles in increasing linear order, group by group; within a group the M tiles of one N tile are
// adjacent (CTAs running side by side share the B tile in L2).
template <int kTileN>
struct Walker : hopper::GroupWalk<Walker<kTileN>, Params> {
  int m_tiles = 0;
  int n_tiles;
  int pair;  // M tiles per unit: 1, or 2 for a 2 x 1 cluster

  __device__ Walker(const Params& params, int cluster)
      : hopper::GroupWalk<Walker<kTileN>, Params>(params),
        n_tiles((params.n_out + kTileN - 1) / kTileN),
        pair(cluster) {}

  __device__ int GroupTiles() {
    m_tiles = (this->hi - this->lo + kBM - 1) / kBM;
    return (m_tiles + pair - 1) / pair * n_tiles;
  }
  // t counts (group, N tile, M tile pair) units when kPair (a 2 x 1 cluster: CTA `rank` takes the
  // pair's M tile 2 p + rank, which may lie past the group), else single tiles.
  __device__ bool Next(int t, Tile* tile, uint32_t rank) {
    if (!this->Seek(t)) return false;
    const int local = t - this->first;
    const int m_units = (m_tiles + pair - 1) / pair;
    tile->g = this->g;
    tile->m_tile = pair * (local % m_units) + static_cast<int>(rank);
    tile->n_tile = local / m_units;
    tile->a_row0 = this->lo + tile->m_tile * kBM;
    tile->rows = this->hi - this->lo;
    return true;
  }
};

// Stores a 64-row block of a warpgroup's accumulators, 256 bytes of output per row (128 bf16 or
// 64 fp32 columns: column groups i = kI0 .. kI0 + kGroups - 1 of 8, registers 4 i + 2 hh + b hold
// row r0 + 8 hh, column 8 i + 2 quad + b), to out rows [row0, row0 + valid) and columns [col0,
// col0 + 256 / sizeof(OutT)) (clipped to n_out). The values go into the warpgroup's 16 KiB of
// shared memory in the 128-byte-swizzled layout of two [64 rows][128 bytes] TMA boxes (16-byte
// chunk c of a row at c ^ (row % 8): a warp's writes spread over all banks), then one thread
// stores the boxes with TMA when all 64 rows are the group's, else every thread copies the valid
// rows in 16-byte pieces. The buffer is reused only after the previous TMA stores have read it.
template <typename OutT, int kRegs, int kI0>
__device__ __forceinline__ void StoreBlock(const float (&acc)[kRegs], uint8_t* buf,
                                           const CUtensorMap* map_c, OutT* out, int n_out, int row0,
                                           int col0, int valid, int barrier_id, int r0, int quad,
                                           bool leader) {
  constexpr int kBytes = sizeof(OutT);
  constexpr int kGroups = 256 / (8 * kBytes);
  constexpr int kBoxCols = 128 / kBytes;
  if (valid <= 0) return;
  if (leader) hopper::BulkWaitRead<0>();
  hopper::NamedBarrier(barrier_id, 128);
#pragma unroll
  for (int i = 0; i < kGroups; ++i) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = r0 + 8 * hh;
      const int byte = (8 * i + 2 * quad) * kBytes;  // within the block's 256-byte row
      const int c = (byte % 128) / 16;
      const uint32_t addr = hopper::SmemAddr(buf + (byte / 128) * (64 * 128) + r * 128) +
                            ((c ^ (r % 8)) << 4) + byte % 16;
      const float v0 = acc[4 * (kI0 + i) + 2 * hh], v1 = acc[4 * (kI0 + i) + 2 * hh + 1];
      if constexpr (kBytes == 2) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(v0, v1);
        hopper::StsB32(addr, *reinterpret_cast<const uint32_t*>(&v));
      } else {
        hopper::StsV2F32(addr, v0, v1);
      }
    }
  }
  hopper::FenceSharedForCopies();
  hopper::NamedBarrier(barrier_id, 128);
  if (valid == 64) {
    if (leader) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = col0 + kBoxCols * j;
        if (col < n_out) hopper::TmaStore2d(map_c, buf + j * (64 * 128), col, row0);
      }
      hopper::BulkCommit();
    }
    return;
  }
  const int tid = threadIdx.x % 128;
#pragma unroll 4
  for (int idx = tid; idx < 64 * 16; idx += 128) {
    const int r = idx / 16, chunk = idx % 16, c = chunk % 8;
    const int col = col0 + chunk * (16 / kBytes);
    if (r < valid && col < n_out) {
      const uint4 v = hopper::LdsV4U32(hopper::SmemAddr(buf + (chunk / 8) * (64 * 128) + r * 128) +
                                       ((c ^ (r % 8)) << 4));
      *reinterpret_cast<uint4*>(out + static_cast<int64_t>(row0 + r) * n_out + col) = v;
    }
  }
}

}  // namespace dropless::kernels::tmagemm

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_TMA_KERNEL_COMMON_CUH_
