// The wide MXFP8 grouped GEMM kernel (sm_90a): persistent, warp-specialized, one 256 x 128 output
// tile per CTA at a time. Same semantics, tile walk, operand maps and epilogue masking as the
// 128 x 128 kernel in mx_gemm_kernel.cuh; it differs in how the work is cut so that the shared
// memory traffic of the promotion stays under the fp32 issue rate:
//
//   warpgroup 0, warp 0, lane 0   TMA: A [256 rows][128 k] and B [128 cols][128 k] per stage,
//                                 3 stages (48 KiB each)
//   warpgroup 0, warps 1..3       scale loaders: per chunk of 16 K blocks (4 stages), the 256
//                                 A rows and 128 B columns, 16 scale bytes each (one 16-byte load
//                                 per row where aligned), converted to fp32 into a 2-slot ring
//   warpgroups 1, 2               consumers; warpgroup h owns columns [64 h, 64 h + 64) of all 256
//                                 rows, as four m64n64 pieces (rows 64 m ..). Per K block and piece
//                                 one m64n64k32 wgmma into a 32-register temporary (double
//                                 buffered: piece i + 1 runs while piece i is promoted), then
//                                 acc += tmp * (sa * sb) in fp32. A thread's 16 B-column scales of
//                                 a K block are read once (4 x 16 bytes) and used for its 8 rows.
//
// Per 256 x 128 x 32 block and SM this reads 8 x 24 shared-memory wavefronts of scales (the 128 x
// 128 kernel: 8 x 34 for half the work) and issues 512 fp32 instructions per scheduler.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_MXFP8_MX_GEMM_WIDE_KERNEL_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_MXFP8_MX_GEMM_WIDE_KERNEL_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/cuda/grouped_gemm/mxfp8/mx_gemm_kernel.cuh"

namespace dropless::kernels::mxgemm::wide {

inline constexpr int kBM = 256;
inline constexpr int kBN = 128;
inline constexpr int kBK = 128;  // bytes = elements per stage
inline constexpr int kStages = 3;
inline constexpr int kChunkKb = 16;  // K blocks per scale chunk (4 stages)
inline constexpr int kChunks = 2;
inline constexpr int kATileBytes = kBM * kBK;  // 32 KiB
inline constexpr int kBTileBytes = kBN * kBK;  // 16 KiB
// B scales of one K block: [half 2][quad 4][20 floats]; quad q of half h holds the 16 columns a
// consumer thread of warpgroup h with lane % 4 == q owns (64 h + 8 i + 2 q + b), padded to 20 so
// that a quarter warp's four 16-byte reads land in banks 0, 20, 8, 28.
inline constexpr int kSbQuad = 20;
inline constexpr int kSbHalf = 4 * kSbQuad;
inline constexpr int kSbKb = 2 * kSbHalf;
inline constexpr int kSaChunkFloats = kChunkKb * kBM;  // [kb][row]
inline constexpr int kSbChunkFloats = kChunkKb * kSbKb;
inline constexpr int kSmemBytes = 1024 + kStages * (kATileBytes + kBTileBytes) +
                                  kChunks * (kSaChunkFloats + kSbChunkFloats) * 4 +
                                  (2 * kStages + 2 * kChunks) * 8;
// Variant bits.
inline constexpr int kWidePieceSkip = 4;  // no wgmma / promotion for m64 pieces past the group

// f(integral_constant<int, U>) for U = 0, 1, ...: a loop whose index is a compile-time constant
// (register arrays indexed by it stay in registers).
template <class F, int... U>
__device__ __forceinline__ void Unrolled(F&& f, std::integer_sequence<int, U...>) {
  (f(std::integral_constant<int, U>{}), ...);
}

// Up to 16 scale bytes of one row starting at src (K blocks kb0 .. kb0 + 15; `count` of them are
// in the reduction). One 16-byte load where src is 16-byte aligned and the row holds all 16;
// otherwise the aligned words around them, funnel-shifted (a word is loaded only if it holds a
// byte before `end`: an aligned word never crosses a page).
__device__ __forceinline__ uint4 LoadScaleRow(const uint8_t* src, const uint8_t* end, bool valid,
                                              int count) {
  uint4 r = make_uint4(0, 0, 0, 0);
  if (!valid) return r;
  const uintptr_t a = reinterpret_cast<uintptr_t>(src);
  if ((a & 15) == 0 && count == kChunkKb && src + 16 <= end) {
    return __ldg(reinterpret_cast<const uint4*>(src));
  }
  const uint32_t* aligned = reinterpret_cast<const uint32_t*>(a & ~uintptr_t{3});
  const uint32_t shift = static_cast<uint32_t>(a & 3) * 8;
  const int words = (static_cast<int>(a & 3) + count + 3) / 4;  // words holding wanted bytes
  uint32_t w[5];
#pragma unroll
  for (int i = 0; i < 5; ++i) {
    w[i] =
        i < words && reinterpret_cast<const uint8_t*>(aligned + i) < end ? __ldg(aligned + i) : 0u;
  }
  r.x = __funnelshift_r(w[0], w[1], shift);
  r.y = __funnelshift_r(w[1], w[2], shift);
  r.z = __funnelshift_r(w[2], w[3], shift);
  r.w = __funnelshift_r(w[3], w[4], shift);
  return r;
}

// One m64n64 piece's promotion: a += t * (sa * sb). Register d = 4 i + 2 hh + b: row r0 + 8 hh
// (scale sa0 / sa1), column 8 i + 2 quad + b (scale b[i / 2], component 2 (i % 2) + b).
__device__ __forceinline__ void PromotePiece(float (&a)[32], const float (&t)[32], float sa0,
                                             float sa1, const float4 (&b)[4]) {
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    const float bb[4] = {b[v].x, b[v].y, b[v].z, b[v].w};
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int d = 4 * (2 * v + u);
      a[d + 0] = fmaf(t[d + 0], sa0 * bb[2 * u], a[d + 0]);
      a[d + 1] = fmaf(t[d + 1], sa0 * bb[2 * u + 1], a[d + 1]);
      a[d + 2] = fmaf(t[d + 2], sa1 * bb[2 * u], a[d + 2]);
      a[d + 3] = fmaf(t[d + 3], sa1 * bb[2 * u + 1], a[d + 3]);
    }
  }
}

template <typename OutT, bool kGroupedK, int kVariant = 0>
__global__ void __launch_bounds__(kThreads, 1)
    MxGroupedGemmWideKernel(const __grid_constant__ CUtensorMap map_a,
                            const __grid_constant__ CUtensorMap map_b,
                            const __grid_constant__ Params p) {
  if (p.gate != nullptr && *p.gate != p.gate_value) return;  // the other kernel was chosen
  uint8_t* smem = hopper::AlignedDynamicSmem();
  uint8_t* s_a = smem;
  uint8_t* s_b = s_a + kStages * kATileBytes;
  float* s_sa = reinterpret_cast<float*>(s_b + kStages * kBTileBytes);
  float* s_sb = s_sa + kChunks * kSaChunkFloats;
  uint64_t* full = reinterpret_cast<uint64_t*>(s_sb + kChunks * kSbChunkFloats);
  uint64_t* empty = full + kStages;
  uint64_t* sfull = empty + kStages;
  uint64_t* sempty = sfull + kChunks;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    // full: TMA's expect-tx arrival; sfull: every scale-loader lane; empty, sempty: one arrival
    // per consumer warp
    hopper::BarrierInitRing(full, empty, kStages, 1, 8);
    hopper::BarrierInitRing(sfull, sempty, kChunks, 3 * 32, 8);
    hopper::BarrierInitFence();
  }
  __syncthreads();

  TileWalker<kGroupedK, kBM> walk(p);
  Tile tile;

  if (warpgroup == 0) {
    hopper::WarpgroupRegDealloc<40>();
    if (warp == 0) {
      if (lane != 0) return;
      int it = 0;
      for (int t = blockIdx.x; walk.Next(t, &tile); t += gridDim.x) {
        const int stages = (tile.nk32 + 3) / 4;
        for (int s = 0; s < stages; ++s, ++it) {
          const int slot = it % kStages;
          hopper::BarrierWait(&empty[slot], ((it / kStages) & 1) ^ 1);
          hopper::BarrierArriveExpectBytes(&full[slot], kATileBytes + kBTileBytes);
          const int kc = tile.k0 + s * kBK;
          LoadStageOperands<kGroupedK>(s_a + slot * kATileBytes, s_b + slot * kBTileBytes, &map_a,
                                       &map_b, &full[slot], kc, tile.a_row0, tile.n_tile * kBN,
                                       kGroupedK ? 0 : tile.g);
        }
      }
    } else {
      // 96 lanes, 384 rows per chunk (256 A rows, then 128 B columns): lane l takes rows
      // l + 96 q, so every row of a warp is of one kind.
      const int l = threadIdx.x - 32;
      int ci = 0;
      for (int t = blockIdx.x; walk.Next(t, &tile); t += gridDim.x) {
        const int kb_begin = tile.k0 / 32;
        const int kb_end = kb_begin + tile.nk32;
        const uint8_t* b_base =
            p.b_scales +
            (kGroupedK ? int64_t{0} : static_cast<int64_t>(tile.g) * p.b_scale_batch_stride);
        for (int kb0 = kb_begin; kb0 < kb_end; kb0 += kChunkKb, ++ci) {
          const int slot = ci % kChunks;
          const int count = min(kChunkKb, kb_end - kb0);
          hopper::BarrierWait(&sempty[slot], ((ci / kChunks) & 1) ^ 1);
          float* sa = s_sa + slot * kSaChunkFloats;
          float* sb = s_sb + slot * kSbChunkFloats;
          if constexpr (kGroupedK) {
            // Block-major scales: per K block the tile's rows are contiguous. 16 K blocks x (256
            // A rows + 128 B columns) = 384 vectors of 16 rows, 4 per lane, one 16-byte load each.
            // Vector q of lane l: A rows (256 per K block) first, then B columns (128 per K block).
            struct Vec {
              bool is_a;
              int j, r16;  // K block within the chunk, first row of the 16
            };
            auto locate = [&](int q) {
              const int idx = l + 96 * q;
              const bool is_a = idx < 16 * (kBM / 16);
              const int rel = is_a ? idx : idx - 16 * (kBM / 16);
              const int per_kb = is_a ? kBM / 16 : kBN / 16;
              return Vec{is_a, rel / per_kb, 16 * (rel % per_kb)};
            };
            // All four loads are issued before the first is used.
            uint4 v[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const Vec w = locate(q);
              v[q] = w.is_a ? LoadBlockScales16(p.a_scales, p.a_rows, kb0 + w.j, kb_end,
                                                int64_t{tile.a_row0} + w.r16)
                            : LoadBlockScales16(p.b_scales, p.n, kb0 + w.j, kb_end,
                                                int64_t{tile.n_tile} * kBN + w.r16);
            }
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const auto [is_a, j, r16] = locate(q);
              if (is_a) {
                const uint32_t dst = hopper::SmemAddr(sa + j * kBM + r16);
#pragma unroll
                for (int i = 0; i < 16; i += 4) {
                  hopper::StsV4F32(dst + 4 * i, ScaleByte(v[q], i), ScaleByte(v[q], i + 1),
                                   ScaleByte(v[q], i + 2), ScaleByte(v[q], i + 3));
                }
              } else {
#pragma unroll
                for (int i = 0; i < 16; ++i) {
                  const int c = r16 + i, half = c / 64, cc = c % 64;
                  hopper::StsF32(
                      hopper::SmemAddr(sb + j * kSbKb + half * kSbHalf + ((cc % 8) / 2) * kSbQuad +
                                       (cc / 8) * 2 + (cc % 2)),
                      ScaleByte(v[q], i));
                }
              }
            }
          } else {
            // Two rows' loads in flight at a time (the producers run on 40 registers).
#pragma unroll
            for (int q0 = 0; q0 < 4; q0 += 2) {
              uint4 raw[2];
#pragma unroll
              for (int qq = 0; qq < 2; ++qq) {
                const int row = l + 96 * (q0 + qq);
                if (row < kBM) {
                  const int64_t r = static_cast<int64_t>(tile.a_row0) + row;
                  raw[qq] = LoadScaleRow(p.a_scales + r * p.a_scale_stride + kb0, p.a_scales_end,
                                         r < p.a_rows, count);
                } else {
                  const int col = tile.n_tile * kBN + (row - kBM);
                  raw[qq] =
                      LoadScaleRow(b_base + static_cast<int64_t>(col) * p.b_scale_stride + kb0,
                                   p.b_scales_end, col < p.n, count);
                }
              }
#pragma unroll
              for (int qq = 0; qq < 2; ++qq) {
                const int row = l + 96 * (q0 + qq);
                uint32_t dst, kb_stride;
                if (row < kBM) {
                  dst = hopper::SmemAddr(sa + row);
                  kb_stride = kBM * 4;
                } else {
                  const int c = row - kBM;
                  const int half = c / 64, cc = c % 64;
                  dst = hopper::SmemAddr(sb + half * kSbHalf + ((cc % 8) / 2) * kSbQuad +
                                         (cc / 8) * 2 + (cc % 2));
                  kb_stride = kSbKb * 4;
                }
                const uint32_t words[4] = {raw[qq].x, raw[qq].y, raw[qq].z, raw[qq].w};
#pragma unroll
                for (int j = 0; j < kChunkKb; ++j) {
                  const float v =
                      j < count ? E8M0ToFloat((words[j / 4] >> (8 * (j % 4))) & 0xFFu) : 0.0f;
                  hopper::StsF32(dst + j * kb_stride, v);
                }
              }
            }
          }
          hopper::BarrierArrive(&sfull[slot]);
        }
      }
    }
    return;
  }

  hopper::WarpgroupRegAlloc<232>();
  // Descriptor units: from one m64 piece of A to the next, and from one K block to the next in the
  // A and B tiles (row-major tiles: 64 rows x 128 bytes and 32 bytes; block-major tiles: 64 rows x
  // 32 bytes and a whole K block of the tile).
  constexpr uint64_t kPiece = kGroupedK ? 64 * 32 / 16 : 64 * kBK / 16;
  constexpr uint64_t kAKb = KBlockUnits<kGroupedK>(kBM);
  constexpr uint64_t kBKb = KBlockUnits<kGroupedK>(kBN);
  const int h = warpgroup - 1;                // column half of the tile
  const int r0 = (warp % 4) * 16 + lane / 4;  // rows r0, r0 + 8 of each m64 piece
  const int quad = lane % 4;
  float acc[4][32], t0[32], t1[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) t0[i] = t1[i] = 0.0f;

  auto release = [&](uint64_t* bar) { hopper::BarrierArriveLane0(bar, lane); };
  auto load_sb = [&](const float* sb_chunk, int j, float4(&b)[4]) {
    const uint32_t base = hopper::SmemAddr(sb_chunk + j * kSbKb + h * kSbHalf + quad * kSbQuad);
#pragma unroll
    for (int v = 0; v < 4; ++v) b[v] = hopper::LdsV4F32(base + 16 * v);
  };

  int it = 0, ci = 0;
  for (int t = blockIdx.x; walk.Next(t, &tile); t += gridDim.x) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[m][i] = 0.0f;
    }
    const int stages = (tile.nk32 + 3) / 4;
    // m64 pieces holding rows of the group (the rest are neither multiplied nor stored).
    const int pieces =
        (kVariant & kWidePieceSkip) != 0 ? min(4, (tile.rows - tile.m_tile * kBM + 63) / 64) : 4;
    int cslot = 0;
    for (int s = 0; s < stages; ++s, ++it) {
      if (s % 4 == 0) {
        cslot = ci % kChunks;
        hopper::BarrierWait(&sfull[cslot], (ci / kChunks) & 1);
      }
      const int slot = it % kStages;
      hopper::BarrierWait(&full[slot], (it / kStages) & 1);
      // Piece m of K block j: A rows 64 m (kPiece units per piece), B columns 64 h; kAKb / kBKb
      // units per K block.
      const uint64_t da = OperandDescriptor<kGroupedK>(s_a + slot * kATileBytes, 0);
      const uint64_t db = OperandDescriptor<kGroupedK>(s_b + slot * kBTileBytes, 64 * h);
      const float* sa_c = s_sa + cslot * kSaChunkFloats + r0;
      const float* sb_c = s_sb + cslot * kSbChunkFloats;
      const int jb = (s % 4) * 4;  // the stage's first K block within the chunk
      // 16 pieces (4 K blocks x 4 m), straight-line: piece i + 1's wgmma runs while piece i is
      // promoted; each K block's B scales are read before its first piece.
      if (4 * s + 4 <= tile.nk32 && pieces == 4) {
        float4 sb[4];
        hopper::WgmmaFence();
        hopper::FenceRegs(t0);
        hopper::WgmmaM64N64K32(t0, da, db);
        hopper::WgmmaCommit();
        hopper::FenceRegs(t1);
        hopper::WgmmaM64N64K32(t1, da + kPiece, db);
        hopper::WgmmaCommit();
        auto step = [&](auto ic) {
          constexpr int u = decltype(ic)::value;
          constexpr int j = u / 4, m = u % 4;
          if constexpr (m == 0) load_sb(sb_c, jb + j, sb);
          const float sa0 = hopper::LdsF32(hopper::SmemAddr(sa_c + (jb + j) * kBM + 64 * m));
          const float sa1 = hopper::LdsF32(hopper::SmemAddr(sa_c + (jb + j) * kBM + 64 * m + 8));
          if constexpr (u < 15) {
            hopper::WgmmaWait<1>();
          } else {
            hopper::WgmmaWait<0>();
          }
          auto body = [&](float(&tt)[32]) {
            hopper::FenceRegs(tt);
            PromotePiece(acc[m], tt, sa0, sa1, sb);
            if constexpr (u + 2 < 16) {
              constexpr int j2 = (u + 2) / 4, m2 = (u + 2) % 4;
              hopper::WgmmaFence();
              hopper::FenceRegs(tt);
              hopper::WgmmaM64N64K32(tt, da + kPiece * m2 + kAKb * j2, db + kBKb * j2);
              hopper::WgmmaCommit();
            }
          };
          if constexpr (u % 2 == 0) {
            body(t0);
          } else {
            body(t1);
          }
        };
        Unrolled(step, std::make_integer_sequence<int, 16>{});
      } else {
        // The last, partial stage of a reduction that is not a multiple of 128, or a tile whose
        // group ends before its last piece: block by block, piece by piece.
        for (int j = 0; j < 4 && 4 * s + j < tile.nk32; ++j) {
          float4 sb[4];
          load_sb(sb_c, jb + j, sb);
#pragma unroll
          for (int m = 0; m < 4; ++m) {
            if (m >= pieces) continue;
            hopper::WgmmaFence();
            hopper::FenceRegs(t0);
            hopper::WgmmaM64N64K32(t0, da + kPiece * m + kAKb * j, db + kBKb * j);
            hopper::WgmmaCommit();
            const float sa0 = hopper::LdsF32(hopper::SmemAddr(sa_c + (jb + j) * kBM + 64 * m));
            const float sa1 = hopper::LdsF32(hopper::SmemAddr(sa_c + (jb + j) * kBM + 64 * m + 8));
            hopper::WgmmaWait<0>();
            hopper::FenceRegs(t0);
            PromotePiece(acc[m], t0, sa0, sa1, sb);
          }
        }
      }
      release(&empty[slot]);
      if (s % 4 == 3 || s == stages - 1) {
        release(&sempty[cslot]);
        ++ci;
      }
    }

    // Direct stores: two adjacent columns per register pair; rows past the group are not written.
    OutT* out = static_cast<OutT*>(p.out) +
                (kGroupedK ? static_cast<int64_t>(tile.g) * p.out_group_stride : int64_t{0});
#pragma unroll
    for (int m = 0; m < 4; ++m) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int local = tile.m_tile * kBM + 64 * m + r0 + 8 * hh;
        if (local >= tile.rows) continue;
        OutT* row_ptr = out + (static_cast<int64_t>(tile.a_row0) + 64 * m + r0 + 8 * hh) * p.ldc;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int col = tile.n_tile * kBN + 64 * h + 8 * i + 2 * quad;
          if (col < p.n)
            StorePair(row_ptr + col, acc[m][4 * i + 2 * hh], acc[m][4 * i + 2 * hh + 1]);
        }
      }
    }
  }
}

}  // namespace dropless::kernels::mxgemm::wide

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_MXFP8_MX_GEMM_WIDE_KERNEL_CUH_
