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
// Below it, the 2 x 1 cluster variant and the ping-pong kernel (128 x 128 tiles, one per consumer
// warpgroup, for short reductions).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/bulk_copy.cuh"
#include "kernels/cuda/grouped_gemm/grouped_gemm_runner.h"
#include "kernels/cuda/grouped_gemm/sm90.cuh"

namespace dropless::kernels::grouped_gemm_internal {
namespace {

namespace bulk = cuda::bulk;

constexpr int kBM = 128;
constexpr int kBN = 256;
constexpr int kBK = 64;  // elements: 128 bytes of bf16 (one swizzle row)
constexpr int kStages = 4;
constexpr int kThreads = 384;
constexpr int kATileBytes = kBM * kBK * 2;  // 16 KiB
constexpr int kBTileBytes = kBN * kBK * 2;  // 32 KiB
constexpr int kEpilogueBytes = 2 * 64 * 128 * 2;  // per warpgroup 64 x 128 bf16 (half a tile row)
constexpr int kSmemBytes =
    1024 + kStages * (kATileBytes + kBTileBytes) + kEpilogueBytes + 2 * kStages * 8;

struct Params {
  const int32_t* offsets;  // [num_groups + 1], clamped to [0, max_rows]
  int num_groups;
  int n_out;  // output columns
  int k_red;  // reduction length
  int64_t max_rows;
  __nv_bfloat16* out;  // [rows][n_out]
  const int32_t* gate;  // when set, the launch does nothing unless *gate == gate_value
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
struct Walker {
  const Params& p;
  int g = -1, first = 0, count = 0, lo = 0, hi = 0, m_tiles = 0;
  int n_tiles;
  int pair;  // M tiles per unit: 1, or 2 for a 2 x 1 cluster

  __device__ Walker(const Params& params, int cluster)
      : p(params), n_tiles((params.n_out + kTileN - 1) / kTileN), pair(cluster) {}

  __device__ int Clamp(int v) const {
    return static_cast<int>(min(max(static_cast<int64_t>(v), int64_t{0}), p.max_rows));
  }
  __device__ void Enter(int group) {
    g = group;
    lo = Clamp(__ldg(p.offsets + group));
    hi = max(lo, Clamp(__ldg(p.offsets + group + 1)));
    m_tiles = (hi - lo + kBM - 1) / kBM;
    count = (m_tiles + pair - 1) / pair * n_tiles;
  }
  // t counts (group, N tile, M tile pair) units when kPair (a 2 x 1 cluster: CTA `rank` takes the
  // pair's M tile 2 p + rank, which may lie past the group), else single tiles.
  __device__ bool Next(int t, Tile* tile, uint32_t rank) {
    if (g < 0) Enter(0);
    while (t >= first + count) {
      if (g + 1 >= p.num_groups) return false;
      first += count;
      Enter(g + 1);
    }
    const int local = t - first;
    const int m_units = (m_tiles + pair - 1) / pair;
    tile->g = g;
    tile->m_tile = pair * (local % m_units) + static_cast<int>(rank);
    tile->n_tile = local / m_units;
    tile->a_row0 = lo + tile->m_tile * kBM;
    tile->rows = hi - lo;
    return true;
  }
};

using sm90::SmemAddr;
using sm90::TmaLoad2d;
using sm90::TmaLoad3d;
using sm90::WgmmaCommit;
using sm90::WgmmaFence;
using sm90::WgmmaWait;

// Shared-memory matrix descriptor with 128-byte swizzle (layout type 1, bits 62-63); leading and
// stride byte offsets in 16-byte units. K-major tiles ([rows][128 bytes]): 8-row groups 1024 bytes
// apart (SBO), LBO unused. N-major tiles (the forward's B: [64 k][64 n] boxes 8 KiB apart): LBO =
// 8 KiB between 64-column chunks, SBO = 1024 bytes between 8-row K groups.
__device__ __forceinline__ uint64_t Descriptor(const void* tile, uint32_t lbo, uint32_t sbo) {
  const uint64_t addr = SmemAddr(tile);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t{lbo >> 4} << 16) | (uint64_t{sbo >> 4} << 32) |
         (uint64_t{1} << 62);
}

__device__ __forceinline__ void FenceRegs(float (&d)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64 x 256] (+)= A[64 x 16] . B[16 x 256], bf16 inputs, fp32 accumulators; A K-major
// (kTransA = 0) or M-major (1), B K-major (kTransB = 0) or N-major (1). scale-d = accumulate (0: D
// is not read).
template <int kTransB, int kTransA = 0>
__device__ __forceinline__ void WgmmaM64N256K16(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, %132, %131;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
        "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
        "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
        "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
        "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),
        "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
        "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]),
        "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
        "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]),
        "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),
        "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]),
        "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]),
        "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]),
        "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]),
        "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransB), "n"(kTransA));
}

// D[64 x 128] (+)= A[64 x 16] . B[16 x 128], as WgmmaM64N256K16.
template <int kTransB>
__device__ __forceinline__ void WgmmaM64N128K16(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, %67;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
        "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
        "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
        "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
        "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),
        "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
        "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransB));
}
__device__ __forceinline__ void FenceRegs64(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ uint32_t ClusterRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
}
// The same copy, written to the same shared-memory offset of every CTA in `mask` (and completing
// bytes on each one's barrier at the same offset).
__device__ __forceinline__ void TmaLoad3dMulticast(void* dst, const CUtensorMap* map, uint64_t* bar,
                                                   int c0, int c1, int c2, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster [%0], [%1, {%3, %4, %5}], [%2], %6;" ::"r"(SmemAddr(dst)),
      "l"(map), "r"(SmemAddr(bar)), "r"(c0), "r"(c1), "r"(c2), "h"(mask)
      : "memory");
}
// Arrives on the barrier at `bar`'s offset in CTA `rank` of the cluster. Default (CTA-scope
// release) semantics: the arrival only says this warp's wgmmas have finished reading the stage.
// A cluster-scope release (.release.cluster) also waits for the thread's earlier global stores to
// reach L2, and cost the 2 x 1 kernel 40% (measured on an H200).
__device__ __forceinline__ void ArriveCluster(uint64_t* bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(SmemAddr(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}
__device__ __forceinline__ void TmaStore2d(const CUtensorMap* map, const void* src, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(map),
      "r"(c0), "r"(c1), "r"(SmemAddr(src))
      : "memory");
}

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
                                           const CUtensorMap* map_c, OutT* out, int n_out,
                                           int row0, int col0, int valid, int barrier_id, int r0,
                                           int quad, bool leader) {
  constexpr int kBytes = sizeof(OutT);
  constexpr int kGroups = 256 / (8 * kBytes);
  constexpr int kBoxCols = 128 / kBytes;
  if (valid <= 0) return;
  if (leader) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  bulk::NamedBarrier(barrier_id, 128);
#pragma unroll
  for (int i = 0; i < kGroups; ++i) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = r0 + 8 * hh;
      const int byte = (8 * i + 2 * quad) * kBytes;  // within the block's 256-byte row
      const int c = (byte % 128) / 16;
      const uint32_t addr = SmemAddr(buf + (byte / 128) * (64 * 128) + r * 128) +
                            ((c ^ (r % 8)) << 4) + byte % 16;
      const float v0 = acc[4 * (kI0 + i) + 2 * hh], v1 = acc[4 * (kI0 + i) + 2 * hh + 1];
      if constexpr (kBytes == 2) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(v0, v1);
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr),
                     "r"(*reinterpret_cast<const uint32_t*>(&v))
                     : "memory");
      } else {
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(v0), "f"(v1) : "memory");
      }
    }
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  bulk::NamedBarrier(barrier_id, 128);
  if (valid == 64) {
    if (leader) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = col0 + kBoxCols * j;
        if (col < n_out) TmaStore2d(map_c, buf + j * (64 * 128), col, row0);
      }
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
    return;
  }
  const int tid = threadIdx.x % 128;
#pragma unroll 4
  for (int idx = tid; idx < 64 * 16; idx += 128) {
    const int r = idx / 16, chunk = idx % 16, c = chunk % 8;
    const int col = col0 + chunk * (16 / kBytes);
    if (r < valid && col < n_out) {
      uint4 v;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(SmemAddr(buf + (chunk / 8) * (64 * 128) + r * 128) + ((c ^ (r % 8)) << 4)));
      *reinterpret_cast<uint4*>(out + static_cast<int64_t>(row0 + r) * n_out + col) = v;
    }
  }
}

// kNMajorB: the forward (B = W[e] as stored, [k][n]); else the data gradient (B = W[e] read as
// [k out][n red], K-major). kCluster 2: two CTAs (a 2 x 1 cluster) take the two M tiles of one
// (group, N tile) pair and share the B tile: each loads half of it into both (TMA multicast), so
// the weights cross from L2 once per pair; a group with an odd number of M tiles gives one CTA an
// empty tile (it multiplies rows it does not store).
template <bool kNMajorB, int kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    TmaGroupedGemmKernel(const __grid_constant__ CUtensorMap map_a,
                         const __grid_constant__ CUtensorMap map_b,
                         const __grid_constant__ CUtensorMap map_c, const __grid_constant__ Params p) {
  if (p.gate != nullptr && *p.gate != p.gate_value) return;  // uniform over the grid
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~static_cast<uintptr_t>(1023));
  uint8_t* s_a = smem;
  uint8_t* s_b = s_a + kStages * kATileBytes;
  uint8_t* s_c = s_b + kStages * kBTileBytes;  // [2 warpgroups][2 boxes][64 rows][128 bytes]
  uint64_t* full = reinterpret_cast<uint64_t*>(s_c + kEpilogueBytes);
  uint64_t* empty = full + kStages;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warpgroup = threadIdx.x / 128;
  const uint32_t rank = kCluster > 1 ? ClusterRank() : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      bulk::BarrierInit(&full[s], 1);              // the producer's expect-tx arrival
      bulk::BarrierInit(&empty[s], 8 * kCluster);  // every consumer warp of the cluster
    }
    bulk::BarrierInitFence();
  }
  if constexpr (kCluster > 1) {
    ClusterSync();
  } else {
    __syncthreads();
  }

  Walker<kBN> walk(p, kCluster);
  Tile tile;
  const int k_tiles = (p.k_red + kBK - 1) / kBK;
  const int cluster_id = blockIdx.x / kCluster, clusters = gridDim.x / kCluster;

  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (warp == 0 && lane == 0) {
      int it = 0;
      for (int t = cluster_id; walk.Next(t, &tile, rank); t += clusters) {
        const int n0 = tile.n_tile * kBN;
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int slot = it % kStages;
          bulk::BarrierWait(&empty[slot], ((it / kStages) & 1) ^ 1);
          bulk::BarrierArriveExpectBytes(&full[slot], kATileBytes + kBTileBytes);
          const int kc = kt * kBK;
          TmaLoad2d(s_a + slot * kATileBytes, &map_a, &full[slot], kc, tile.a_row0);
          uint8_t* b = s_b + slot * kBTileBytes;
          if constexpr (kCluster == 1) {
            if constexpr (kNMajorB) {
#pragma unroll
              for (int j = 0; j < kBN / 64; ++j) {
                TmaLoad3d(b + j * (kBK * 128), &map_b, &full[slot], n0 + 64 * j, kc, tile.g);
              }
            } else {
              TmaLoad3d(b, &map_b, &full[slot], kc, n0, tile.g);
            }
          } else {
            // This CTA's half of B, into both CTAs.
            if constexpr (kNMajorB) {
#pragma unroll
              for (int jj = 0; jj < 2; ++jj) {
                const int j = 2 * rank + jj;
                TmaLoad3dMulticast(b + j * (kBK * 128), &map_b, &full[slot], n0 + 64 * j, kc,
                                   tile.g, 0x3);
              }
            } else {
              TmaLoad3dMulticast(b + rank * (kBTileBytes / 2), &map_b, &full[slot], kc,
                                 n0 + 128 * rank, tile.g, 0x3);
            }
          }
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
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
          bulk::BarrierArrive(&empty[slot]);
        } else {
#pragma unroll
          for (int c = 0; c < kCluster; ++c) ArriveCluster(&empty[slot], c);
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
        bulk::BarrierWait(&full[slot], (it / kStages) & 1);
        const uint64_t da = Descriptor(s_a + slot * kATileBytes + h * 64 * 128, 16, 1024);
        const uint64_t db = kNMajorB ? Descriptor(s_b + slot * kBTileBytes, kBK * 128, 1024)
                                     : Descriptor(s_b + slot * kBTileBytes, 16, 1024);
        WgmmaFence();
        FenceRegs(acc);
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          WgmmaM64N256K16<kNMajorB ? 1 : 0>(acc, da + (32 * kk >> 4), db + (kBStep * kk >> 4),
                                            (kt > 0 || kk > 0) ? 1 : 0);
        }
        WgmmaCommit();
        FenceRegs(acc);
        if (kt > 0) {
          WgmmaWait<1>();  // the previous stage's wgmmas are done: hand its buffers back
          release((it - 1) % kStages);
        }
      }
      WgmmaWait<0>();
      FenceRegs(acc);
      release((it - 1) % kStages);

      // Epilogue: the warpgroup's 64 x 256 in two column halves through its 16 KiB buffer.
      const int valid = min(64, tile.rows - (tile.m_tile * kBM + 64 * h));
      const int row0 = tile.a_row0 + 64 * h, n0 = tile.n_tile * kBN;
      StoreBlock<__nv_bfloat16, 128, 0>(acc, s_ch, &map_c, p.out, p.n_out, row0, n0, valid, 1 + h, r0, quad,
                         leader);
      StoreBlock<__nv_bfloat16, 128, 16>(acc, s_ch, &map_c, p.out, p.n_out, row0, n0 + 128, valid, 1 + h, r0,
                          quad, leader);
    }
    if (leader) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  }
  // A CTA of a cluster leaves only when its peer no longer multicasts into it or arrives on its
  // barriers (every warp converged first: the barrier is .aligned).
  if constexpr (kCluster > 1) {
    __syncwarp();
    ClusterSync();
  }
}


// ---- The ping-pong variant: one 128 x 128 tile per consumer warpgroup ----
//
// The cooperative kernel above multiplies with both warpgroups on one tile, so the tensor cores
// idle while they store it (about 2.5 stage times per tile on an H200: 8% of a qwen3 tile with
// 32 stages, 18% at K = 768). Here each consumer warpgroup owns every other tile of the CTA's
// sequence (128 x 128, two m64n128k16 per k16 step); the producer fills the stage ring in tile
// order, and a turn barrier lets a warpgroup start its main loop only once the other has waited on
// all of its stages (so a stage's full-barrier phase is never more than one ahead of its waiter),
// which runs one warpgroup's epilogue under the other's main loop.
constexpr int kPBN = 128;
constexpr int kPStages = 6;
constexpr int kPBTileBytes = kPBN * kBK * 2;       // 16 KiB
constexpr int kPEpilogueBytes = 2 * 64 * 128 * 2;  // per warpgroup 64 x 128 bf16 (half a tile)
constexpr int kPSmemBytes =
    1024 + kPStages * (kATileBytes + kPBTileBytes) + kPEpilogueBytes + (2 * kPStages + 2) * 8;

template <bool kNMajorB>
__global__ void __launch_bounds__(kThreads, 1)
    TmaPingpongKernel(const __grid_constant__ CUtensorMap map_a,
                      const __grid_constant__ CUtensorMap map_b,
                      const __grid_constant__ CUtensorMap map_c, const __grid_constant__ Params p) {
  if (p.gate != nullptr && *p.gate != p.gate_value) return;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~static_cast<uintptr_t>(1023));
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
    for (int s = 0; s < kPStages; ++s) {
      bulk::BarrierInit(&full[s], 1);
      bulk::BarrierInit(&empty[s], 4);  // the consuming warpgroup's four warps
    }
    bulk::BarrierInit(&turn[0], 1);
    bulk::BarrierInit(&turn[1], 1);
    bulk::BarrierInitFence();
  }
  __syncthreads();

  Walker<kPBN> walk(p, 1);
  Tile tile;
  const int k_tiles = (p.k_red + kBK - 1) / kBK;

  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (warp == 0 && lane == 0) {
      int it = 0;
      for (int t = blockIdx.x; walk.Next(t, &tile, 0); t += gridDim.x) {
        const int n0 = tile.n_tile * kPBN;
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int slot = it % kPStages;
          bulk::BarrierWait(&empty[slot], ((it / kPStages) & 1) ^ 1);
          bulk::BarrierArriveExpectBytes(&full[slot], kATileBytes + kPBTileBytes);
          const int kc = kt * kBK;
          TmaLoad2d(s_a + slot * kATileBytes, &map_a, &full[slot], kc, tile.a_row0);
          uint8_t* b = s_b + slot * kPBTileBytes;
          if constexpr (kNMajorB) {
            TmaLoad3d(b, &map_b, &full[slot], n0, kc, tile.g);
            TmaLoad3d(b + kBK * 128, &map_b, &full[slot], n0 + 64, kc, tile.g);
          } else {
            TmaLoad3d(b, &map_b, &full[slot], kc, n0, tile.g);
          }
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int h = warpgroup - 1;
  const int r0 = (warp % 4) * 16 + lane / 4;
  const int quad = lane % 4;
  const bool leader = threadIdx.x % 128 == 0;
  uint8_t* s_ch = s_c + h * (kPEpilogueBytes / 2);
  float acc0[64], acc1[64];  // rows [0, 64) and [64, 128) of the warpgroup's tile
#pragma unroll
  for (int i = 0; i < 64; ++i) acc0[i] = acc1[i] = 0.0f;
  auto release = [&](int slot) {
    if (lane == 0) bulk::BarrierArrive(&empty[slot]);
  };
  constexpr uint32_t kBStep = kNMajorB ? 16 * 128 : 32;

  int it = 0, own = 0;
  for (int t = blockIdx.x, j = 0; walk.Next(t, &tile, 0); t += gridDim.x, ++j) {
    if (j % 2 != h) {  // the other warpgroup's tile: its stages come first in the ring
      it += k_tiles;
      continue;
    }
    bulk::BarrierWait(&turn[h], (own & 1) ^ (h == 0 ? 1 : 0));
    ++own;
    for (int kt = 0; kt < k_tiles; ++kt, ++it) {
      const int slot = it % kPStages;
      bulk::BarrierWait(&full[slot], (it / kPStages) & 1);
      if (kt == k_tiles - 1 && leader) bulk::BarrierArrive(&turn[h ^ 1]);
      const uint64_t da = Descriptor(s_a + slot * kATileBytes, 16, 1024);
      const uint64_t db = kNMajorB ? Descriptor(s_b + slot * kPBTileBytes, kBK * 128, 1024)
                                   : Descriptor(s_b + slot * kPBTileBytes, 16, 1024);
      WgmmaFence();
      FenceRegs64(acc0);
      FenceRegs64(acc1);
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        const int accumulate = (kt > 0 || kk > 0) ? 1 : 0;
        WgmmaM64N128K16<kNMajorB ? 1 : 0>(acc0, da + (32 * kk >> 4), db + (kBStep * kk >> 4),
                                          accumulate);
        WgmmaM64N128K16<kNMajorB ? 1 : 0>(acc1, da + ((64 * 128 + 32 * kk) >> 4),
                                          db + (kBStep * kk >> 4), accumulate);
      }
      WgmmaCommit();
      FenceRegs64(acc0);
      FenceRegs64(acc1);
      if (kt > 0) {
        WgmmaWait<1>();
        release((it - 1) % kPStages);
      }
    }
    WgmmaWait<0>();
    FenceRegs64(acc0);
    FenceRegs64(acc1);
    release((it - 1) % kPStages);

    const int n0 = tile.n_tile * kPBN;
    const int rows_left = tile.rows - tile.m_tile * kBM;
    StoreBlock<__nv_bfloat16, 64, 0>(acc0, s_ch, &map_c, p.out, p.n_out, tile.a_row0, n0, min(64, rows_left),
                      1 + h, r0, quad, leader);
    StoreBlock<__nv_bfloat16, 64, 0>(acc1, s_ch, &map_c, p.out, p.n_out, tile.a_row0 + 64, n0,
                      min(64, rows_left - 64), 1 + h, r0, quad, leader);
  }
  if (leader) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}


// ---- The weight gradient: dW[e] = X_e^T . dY_e, reducing over each group's rows ----
//
// The same cooperative 128 x 256 tile, over (k, n) of one expert's gradient, with both operands
// read M- / N-major from fixed 2-D maps: per stage two [64 rows][64 k] boxes of X and four
// [64 rows][64 n] boxes of dY at the group's rows. The last stage of a group usually holds rows of
// the next group (or of the unused buffer past offsets[E], whose bytes may be anything): the
// consumers zero those rows of all six boxes before its wgmmas, so they add exactly nothing. An
// empty group's gradient is zeroed by ZeroEmptyGroups before the launch.
struct WParams {
  const int32_t* offsets;
  int num_groups;
  int m_out;  // k: rows of dW[e]
  int n_out;  // n: columns of dW[e]
  int64_t max_rows;
  void* out;  // [E * k][n]
};

struct WTile {
  int g, m_tile, n_tile, lo, hi;
};

struct WWalker {
  const WParams& p;
  int g = -1, first = 0, count = 0, lo = 0, hi = 0;
  int m_tiles, n_tiles;

  __device__ explicit WWalker(const WParams& params)
      : p(params), m_tiles((params.m_out + kBM - 1) / kBM), n_tiles((params.n_out + kBN - 1) / kBN) {}
  __device__ int Clamp(int v) const {
    return static_cast<int>(min(max(static_cast<int64_t>(v), int64_t{0}), p.max_rows));
  }
  __device__ void Enter(int group) {
    g = group;
    lo = Clamp(__ldg(p.offsets + group));
    hi = max(lo, Clamp(__ldg(p.offsets + group + 1)));
    count = hi > lo ? m_tiles * n_tiles : 0;
  }
  __device__ bool Next(int t, WTile* tile) {
    if (g < 0) Enter(0);
    while (t >= first + count) {
      if (g + 1 >= p.num_groups) return false;
      first += count;
      Enter(g + 1);
    }
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
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~static_cast<uintptr_t>(1023));
  uint8_t* s_a = smem;
  uint8_t* s_b = s_a + kStages * kATileBytes;
  uint8_t* s_c = s_b + kStages * kBTileBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(s_c + kEpilogueBytes);
  uint64_t* empty = full + kStages;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      bulk::BarrierInit(&full[s], 1);
      bulk::BarrierInit(&empty[s], 8);
    }
    bulk::BarrierInitFence();
  }
  __syncthreads();

  WWalker walk(p);
  WTile tile;

  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (warp == 0 && lane == 0) {
      int it = 0;
      for (int t = blockIdx.x; walk.Next(t, &tile); t += gridDim.x) {
        const int m0 = tile.m_tile * kBM, n0 = tile.n_tile * kBN;
        const int k_tiles = (tile.hi - tile.lo + kBK - 1) / kBK;
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int slot = it % kStages;
          bulk::BarrierWait(&empty[slot], ((it / kStages) & 1) ^ 1);
          bulk::BarrierArriveExpectBytes(&full[slot], kATileBytes + kBTileBytes);
          const int r = tile.lo + kt * kBK;
#pragma unroll
          for (int j = 0; j < kBM / 64; ++j) {
            TmaLoad2d(s_a + slot * kATileBytes + j * (kBK * 128), &map_x, &full[slot], m0 + 64 * j,
                      r);
          }
#pragma unroll
          for (int j = 0; j < kBN / 64; ++j) {
            TmaLoad2d(s_b + slot * kBTileBytes + j * (kBK * 128), &map_dy, &full[slot],
                      n0 + 64 * j, r);
          }
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int h = warpgroup - 1;
  const int r0 = (warp % 4) * 16 + lane / 4;
  const int quad = lane % 4;
  const bool leader = threadIdx.x % 128 == 0;
  uint8_t* s_ch = s_c + h * (kEpilogueBytes / 2);
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  auto release = [&](int slot) {
    if (lane == 0) bulk::BarrierArrive(&empty[slot]);
  };

  int it = 0;
  for (int t = blockIdx.x; walk.Next(t, &tile); t += gridDim.x) {
    const int k_tiles = (tile.hi - tile.lo + kBK - 1) / kBK;
    for (int kt = 0; kt < k_tiles; ++kt, ++it) {
      const int slot = it % kStages;
      bulk::BarrierWait(&full[slot], (it / kStages) & 1);
      const int valid_rows = tile.hi - (tile.lo + kt * kBK);
      if (valid_rows < kBK) {
        // Rows [valid_rows, 64) of the six boxes (two of X, four of dY) belong to no row of this
        // group: zero them (whole 128-byte rows, so the swizzle does not matter).
        const int per_box = (kBK - valid_rows) * 8;  // 16-byte chunks
        for (int idx = threadIdx.x - 128; idx < 6 * per_box; idx += 256) {
          const int box = idx / per_box, rem = idx % per_box;
          uint8_t* base = box < 2 ? s_a + slot * kATileBytes + box * (kBK * 128)
                                  : s_b + slot * kBTileBytes + (box - 2) * (kBK * 128);
          const uint32_t addr = SmemAddr(base + (valid_rows + rem / 8) * 128 + (rem % 8) * 16);
          asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(addr), "r"(0) : "memory");
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        bulk::NamedBarrier(3, 256);  // both consumer warpgroups read every box of the stage
      }
      // M-major X boxes: warpgroup h's 64 k rows are box h; N-major dY: 64-column boxes 8 KiB
      // apart. A k16 step is 16 rows of 128 bytes in both.
      const uint64_t da = Descriptor(s_a + slot * kATileBytes + h * (kBK * 128), kBK * 128, 1024);
      const uint64_t db = Descriptor(s_b + slot * kBTileBytes, kBK * 128, 1024);
      WgmmaFence();
      FenceRegs(acc);
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        WgmmaM64N256K16<1, 1>(acc, da + (16 * 128 * kk >> 4), db + (16 * 128 * kk >> 4),
                              (kt > 0 || kk > 0) ? 1 : 0);
      }
      WgmmaCommit();
      FenceRegs(acc);
      if (kt > 0) {
        WgmmaWait<1>();
        release((it - 1) % kStages);
      }
    }
    WgmmaWait<0>();
    FenceRegs(acc);
    release((it - 1) % kStages);

    // dW[e] rows are rows g * k + ... of the [E * k][n] output.
    const int valid = min(64, p.m_out - (tile.m_tile * kBM + 64 * h));
    const int row0 = tile.g * p.m_out + tile.m_tile * kBM + 64 * h, n0 = tile.n_tile * kBN;
    OutT* out = static_cast<OutT*>(p.out);
    if constexpr (sizeof(OutT) == 2) {
      StoreBlock<OutT, 128, 0>(acc, s_ch, &map_c, out, p.n_out, row0, n0, valid, 1 + h, r0, quad,
                               leader);
      StoreBlock<OutT, 128, 16>(acc, s_ch, &map_c, out, p.n_out, row0, n0 + 128, valid, 1 + h,
                                r0, quad, leader);
    } else {
      StoreBlock<OutT, 128, 0>(acc, s_ch, &map_c, out, p.n_out, row0, n0, valid, 1 + h, r0, quad,
                               leader);
      StoreBlock<OutT, 128, 8>(acc, s_ch, &map_c, out, p.n_out, row0, n0 + 64, valid, 1 + h, r0,
                               quad, leader);
      StoreBlock<OutT, 128, 16>(acc, s_ch, &map_c, out, p.n_out, row0, n0 + 128, valid, 1 + h,
                                r0, quad, leader);
      StoreBlock<OutT, 128, 24>(acc, s_ch, &map_c, out, p.n_out, row0, n0 + 192, valid, 1 + h,
                                r0, quad, leader);
    }
  }
  if (leader) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("grouped gemm (tma): ", what, ": ", cudaGetErrorString(e)));
}


// A bf16 tensor of `rank` dims (innermost first, row-major strides), 128-byte-swizzled boxes;
// elements outside read as zero.
absl::Status Encode(CUtensorMap* map, const void* data, int rank, const uint64_t* dims,
                    const uint32_t* box, const char* what, bool fp32 = false) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = sm90::TensorMapEncoder();
  if (encode == nullptr) {
    return absl::InternalError("grouped gemm (tma): cuTensorMapEncodeTiled not found in the driver");
  }
  cuuint64_t d[3], strides[2];
  cuuint32_t b[3], element_strides[3] = {1, 1, 1};
  uint64_t stride = fp32 ? 4 : 2;
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    if (i > 0) strides[i - 1] = stride;
    stride *= dims[i];
  }
  const CUresult r = encode(map, fp32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                            rank, const_cast<void*>(data), d,
                            strides, b, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(
        absl::StrCat("grouped gemm (tma): cuTensorMapEncodeTiled failed for ", what, " (CUresult ",
                     r, ")"));
  }
  return absl::OkStatus();
}

// kForward: a = X [max_rows][k], b = W [E][k][n], d = Y [rows][n].
// kBackwardData: a = dY [max_rows][n], b = W [E][k][n] (reduction over n), d = dX [rows][k].
// kPingpong: TmaPingpongKernel (128 x 128 tiles per warpgroup), else TmaGroupedGemmKernel.
template <bool kNMajorB, int kCluster, bool kPingpong = false>
class TmaRunner final : public GroupedGemmRunner {
 public:
  explicit TmaRunner(const RunnerShape& shape) : shape_(shape) {}

  static constexpr auto Kernel() {
    if constexpr (kPingpong) {
      return TmaPingpongKernel<kNMajorB>;
    } else {
      return TmaGroupedGemmKernel<kNMajorB, kCluster>;
    }
  }
  static constexpr int kSmem = kPingpong ? kPSmemBytes : kSmemBytes;
  static constexpr int kTileN = kPingpong ? kPBN : kBN;

  absl::Status Init() {
    static_assert(!kPingpong || kCluster == 1, "the ping-pong kernel has no cluster variant");
    // The tile walk counts tiles in int32: at most (max_rows / 128 + one partial tile per group)
    // M tiles times the N tiles.
    const int64_t out = kNMajorB ? shape_.n : shape_.k;
    // Row coordinates (up to max_rows plus a cluster's padding tile) are int32 too.
    const int64_t m_tiles = shape_.max_rows / kBM + shape_.num_groups;
    if (m_tiles * ((out + kTileN - 1) / kTileN) >= (int64_t{1} << 31) - (int64_t{1} << 20) ||
        shape_.max_rows >= (int64_t{1} << 31) - 2 * kBM) {
      return absl::InvalidArgumentError(absl::StrCat(
          "grouped gemm (tma): max_rows ", shape_.max_rows, " with ", out,
          " output columns: tile or row indices past the int32 range"));
    }
    auto kernel = Kernel();
    absl::Status s = CudaStatus(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
        "cudaFuncSetAttribute");
    if (!s.ok()) return s;
    grid_ = shape_.sm_count;
    if constexpr (kCluster > 1) {
      // As many clusters as can be resident at once (a GPC's SM count need not be even): a
      // persistent cluster that had to wait for another to exit would run its tiles last.
      cudaLaunchConfig_t config = Config(nullptr);
      cudaLaunchAttribute attr = ClusterAttr();
      config.attrs = &attr;
      config.numAttrs = 1;
      int clusters = 0;
      if (absl::Status st = CudaStatus(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config),
                                       "cudaOccupancyMaxActiveClusters");
          !st.ok()) {
        return st;
      }
      if (clusters <= 0) return absl::InternalError("grouped gemm (tma): no 2x1 cluster fits");
      grid_ = std::min(clusters, shape_.sm_count / kCluster) * kCluster;
    }
    return absl::OkStatus();
  }

  absl::Status Run(const RunnerCall& call, cudaStream_t stream) override {
    if (shape_.max_rows == 0) return absl::OkStatus();
    const uint64_t k = shape_.k, n = shape_.n, e = shape_.num_groups;
    const uint64_t rows = shape_.max_rows;
    const uint64_t red = kNMajorB ? k : n, out = kNMajorB ? n : k;
    CUtensorMap map_a, map_b, map_c;
    const uint64_t a_dims[2] = {red, rows};
    const uint32_t a_box[2] = {kBK, kBM};
    // B = W [E][k][n]: the forward reads [64 k][64 n] boxes of it, the data gradient [256 or 128
    // k][64 n] (the 2 x 1 cluster's CTAs load half each).
    const uint64_t b_dims[3] = {n, k, e};
    const uint32_t b_box[3] = {64, kNMajorB ? static_cast<uint32_t>(kBK) : kTileN / kCluster, 1};
    const uint64_t c_dims[2] = {out, rows};
    const uint32_t c_box[2] = {64, 64};
    if (absl::Status s = Encode(&map_a, call.a, 2, a_dims, a_box, "A"); !s.ok()) return s;
    if (absl::Status s = Encode(&map_b, call.b, 3, b_dims, b_box, "B"); !s.ok()) return s;
    if (absl::Status s = Encode(&map_c, call.d, 2, c_dims, c_box, "D"); !s.ok()) return s;
    Params p{call.offsets,
             shape_.num_groups,
             static_cast<int>(out),
             static_cast<int>(red),
             shape_.max_rows,
             static_cast<__nv_bfloat16*>(call.d),
             call.gate,
             call.gate_value};
    cudaLaunchConfig_t config = Config(stream);
    cudaLaunchAttribute attr = ClusterAttr();
    if (kCluster > 1) {
      config.attrs = &attr;
      config.numAttrs = 1;
    }
    return CudaStatus(
        cudaLaunchKernelEx(&config, Kernel(), map_a, map_b, map_c, p),
        "launch");
  }

 private:
  cudaLaunchConfig_t Config(cudaStream_t stream) const {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(grid_ > 0 ? grid_ : shape_.sm_count);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kSmem;
    config.stream = stream;
    return config;
  }
  static cudaLaunchAttribute ClusterAttr() {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = kCluster;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    return attr;
  }

  RunnerShape shape_;
  int grid_ = 0;
};

template <bool kNMajorB, int kCluster, bool kPingpong = false>
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeTma(const RunnerShape& shape) {
  auto runner = std::make_unique<TmaRunner<kNMajorB, kCluster, kPingpong>>(shape);
  absl::Status s = runner->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<GroupedGemmRunner>(std::move(runner));
}


// kBackwardWeight: a = X [max_rows][k], b = dY [max_rows][n], d = dW [E][k][n] (OutT).
template <typename OutT>
class TmaWgradRunner final : public GroupedGemmRunner {
 public:
  explicit TmaWgradRunner(const RunnerShape& shape) : shape_(shape) {}

  absl::Status Init() {
    const int64_t tiles = int64_t{shape_.num_groups} * ((shape_.k + kBM - 1) / kBM) *
                          ((shape_.n + kBN - 1) / kBN);
    if (tiles >= (int64_t{1} << 31) - (int64_t{1} << 20) ||
        int64_t{shape_.num_groups} * shape_.k >= (int64_t{1} << 31)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "grouped gemm (tma): ", shape_.num_groups, " groups of ", shape_.k, " x ", shape_.n,
          " weight gradients: tile or row indices past the int32 range"));
    }
    return CudaStatus(cudaFuncSetAttribute(TmaWgradKernel<OutT>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
                      "cudaFuncSetAttribute");
  }

  absl::Status Run(const RunnerCall& call, cudaStream_t stream) override {
    const uint64_t k = shape_.k, n = shape_.n, e = shape_.num_groups;
    // Every group is empty when there are no rows: only the zeroing runs.
    if (absl::Status s = ZeroEmptyGroups(call.offsets, shape_.num_groups, shape_.max_rows,
                                         static_cast<int64_t>(k * n), sizeof(OutT), call.d, stream);
        !s.ok()) {
      return s;
    }
    if (shape_.max_rows == 0) return absl::OkStatus();
    const uint64_t rows = shape_.max_rows;
    CUtensorMap map_x, map_dy, map_c;
    const uint64_t x_dims[2] = {k, rows}, dy_dims[2] = {n, rows}, c_dims[2] = {n, e * k};
    const uint32_t box[2] = {64, kBK};
    const uint32_t c_box[2] = {static_cast<uint32_t>(128 / sizeof(OutT)), 64};
    constexpr bool kF32 = sizeof(OutT) == 4;
    if (absl::Status s = Encode(&map_x, call.a, 2, x_dims, box, "X"); !s.ok()) return s;
    if (absl::Status s = Encode(&map_dy, call.b, 2, dy_dims, box, "dY"); !s.ok()) return s;
    if (absl::Status s = Encode(&map_c, call.d, 2, c_dims, c_box, "dW", kF32); !s.ok()) return s;
    WParams p{call.offsets, shape_.num_groups, shape_.k, shape_.n, shape_.max_rows, call.d};
    TmaWgradKernel<OutT><<<shape_.sm_count, kThreads, kSmemBytes, stream>>>(map_x, map_dy, map_c,
                                                                            p);
    return CudaStatus(cudaGetLastError(), "launch");
  }

 private:
  RunnerShape shape_;
};

template <typename OutT>
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeTmaWgrad(const RunnerShape& shape) {
  auto runner = std::make_unique<TmaWgradRunner<OutT>>(shape);
  absl::Status s = runner->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<GroupedGemmRunner>(std::move(runner));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeFwdTma128x256(const RunnerShape& shape) {
  return MakeTma<true, 1>(shape);
}
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeDgradTma128x256(const RunnerShape& shape) {
  return MakeTma<false, 1>(shape);
}
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeFwdTmaPingpong128x128(
    const RunnerShape& shape) {
  return MakeTma<true, 1, true>(shape);
}
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeDgradTmaPingpong128x128(
    const RunnerShape& shape) {
  return MakeTma<false, 1, true>(shape);
}
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeFwdTma128x256C2x1(const RunnerShape& shape) {
  return MakeTma<true, 2>(shape);
}
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeDgradTma128x256C2x1(
    const RunnerShape& shape) {
  return MakeTma<false, 2>(shape);
}

absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeWgradF32Tma128x256(
    const RunnerShape& shape) {
  return MakeTmaWgrad<float>(shape);
}
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeWgradBf16Tma128x256(
    const RunnerShape& shape) {
  return MakeTmaWgrad<__nv_bfloat16>(shape);
}

}  // namespace dropless::kernels::grouped_gemm_internal
