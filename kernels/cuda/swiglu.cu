// SwiGLU forward (bf16 and/or row-wise MXFP8 output; bf16 and/or row-wise fp8-block output; or
// fp8-block row- and column-wise output, out never stored) and backward (bf16 output; or fp8-block
// row- and column-wise output, d_h never stored) (contracts: swiglu.h).
// Memory-bound: the rows stream through shared memory in chunks moved by bulk copies
// (stream_chunks.cuh). Fast exp and division keep the arithmetic under the memory time.
#include <cuda_runtime.h>

#include <algorithm>

#include "absl/status/status.h"
#include "dropless/kernels/swiglu.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/fp8_block_math.cuh"
#include "kernels/cuda/fp8_block_tile.cuh"
#include "kernels/cuda/hopper/bulk_copy.cuh"
#include "kernels/cuda/hopper/mbarrier.cuh"
#include "kernels/cuda/stream_chunks.cuh"

namespace dropless::kernels::cuda {
namespace {

using streaming::Chunk;
using streaming::Plan;

// Compute threads per block (plus one producer warp): 128, or 256 for the MXFP8-only output.
// Measured on an H200 (docs/kernels.md).
constexpr int kConsumers = 128;
constexpr int kMxConsumers = 256;
constexpr uint32_t kBlockBudget =
    56 * 1024;  // shared memory per block: about four per multiprocessor
constexpr uint32_t kBothBlockBudget = 96 * 1024;  // forward with bf16 and MXFP8 outputs

__device__ __forceinline__ int64_t LiveRows(int64_t rows, const int32_t* num_rows) {
  return num_rows == nullptr ? rows : min(rows, static_cast<int64_t>(max(0, *num_rows)));
}

// silu(g) * u with the fast exp and division (a few fp32 ulps from the CPU reference's exact
// formula g / (1 + exp(-g)); the tests bound the difference at one bf16 ulp).
__device__ __forceinline__ float Sigmoid(float g) { return __fdividef(1.0f, 1.0f + __expf(-g)); }

// d_gate and d_up of one element (swiglu.h's formulas) in explicit IEEE operations, so that the
// two backward kernels (bf16 output; fp8-block output) round every step the same way: the
// operations nvcc's default contraction made of dy * u * s * (1 + g * (1 - s)) and dy * g * s
// (one fused multiply-add), so the bf16 output keeps its bits.
__device__ __forceinline__ void SwigluGrad(float g, float u, float dy, float* dg, float* du) {
  const float s = Sigmoid(g);
  *dg = __fmul_rn(__fmul_rn(__fmul_rn(dy, u), s), __fmaf_rn(g, __fsub_rn(1.0f, s), 1.0f));
  *du = __fmul_rn(__fmul_rn(dy, g), s);
}

__device__ __forceinline__ uint4 SwigluVec(uint4 gate, uint4 up) {
  float g[8], u[8], o[8];
  detail::Unpack8(gate, g);
  detail::Unpack8(up, u);
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = __fdividef(g[e], 1.0f + __expf(-g[e])) * u[e];
  return detail::Pack8(o);
}

// The chunk's gate and up segments of h [M][2F] into the stage as [nr][2 * width] (each row's gate
// segment, then its up segment): one copy for whole rows, where gate and up are one contiguous run.
__device__ __forceinline__ void LoadGateUp(uint8_t* stage, const Bf16* h, int64_t F, const Chunk& k,
                                           bool whole, uint64_t* full) {
  const uint32_t bytes = static_cast<uint32_t>(k.width) * 2;
  if (whole) {
    hopper::BulkLoad(stage, h + k.r0 * 2 * F, 2 * bytes * k.nr, full);
    return;
  }
  for (int r = 0; r < k.nr; ++r) {
    const Bf16* row = h + (k.r0 + r) * 2 * F + k.c0;
    hopper::BulkLoad(stage + 2 * r * bytes, row, bytes, full);
    hopper::BulkLoad(stage + (2 * r + 1) * bytes, row + F, bytes, full);
  }
}

// Forward stage: [nr][2 * width] bf16 (each row's gate segment, then its up segment); output
// buffer: [nr][width] bf16 then [nr][width] E4M3 (either may be absent).
template <bool kBf16Out, bool kMxOut, int kConsumers = kMxOut && !kBf16Out ? kMxConsumers : 128>
__global__ void __launch_bounds__(kConsumers + 32)
    SwigluForwardKernel(Plan p, const Bf16* __restrict__ h, const int32_t* __restrict__ num_rows,
                        Bf16* __restrict__ out, uint8_t* __restrict__ mx_data,
                        uint8_t* __restrict__ mx_scales) {
  const int64_t live = LiveRows(p.rows, num_rows);
  const bool whole = p.segs == 1;
  const int64_t F = p.cols;
  streaming::StreamChunks<kConsumers>(
      p, live,
      [&](const Chunk& k, uint8_t* stage, uint64_t* full) {
        const uint32_t half = static_cast<uint32_t>(k.width) * 2 * k.nr;
        hopper::BarrierArriveExpectBytes(full, 2 * half);
        LoadGateUp(stage, h, F, k, whole, full);
      },
      [&](const Chunk& k, const uint8_t* stage, uint8_t* buf) {
        const uint32_t vpr = static_cast<uint32_t>(k.width) / 8;  // vectors per row segment
        const uint32_t n = vpr * k.nr;
        const uint4* in = reinterpret_cast<const uint4*>(stage);
        uint4* bf = reinterpret_cast<uint4*>(buf);
        if constexpr (!kMxOut) {
          for (uint32_t v = threadIdx.x; v < n; v += kConsumers) {
            const uint32_t r = v / vpr, cv = v - r * vpr;
            bf[v] = SwigluVec(in[2 * r * vpr + cv], in[(2 * r + 1) * vpr + cv]);
          }
        } else {
          // A thread takes a pair of vectors (16 values), two lanes an MX block. Uniform trip
          // count: every lane reaches the pair shuffle (n / 2 and the block are even, so a lane
          // pair is live or dead together).
          uint4* q = reinterpret_cast<uint4*>(
              buf + (kBf16Out ? 2 * static_cast<size_t>(p.rows_per_chunk) * p.seg_width : 0));
          const uint32_t pairs = n / 2, ppr = vpr / 2;
          for (uint32_t base = 0; base < pairs; base += kConsumers) {
            const uint32_t pv = base + threadIdx.x;
            const bool ok = pv < pairs;
            const uint32_t r = ok ? pv / ppr : 0, cp = pv - r * ppr;
            uint4 a = make_uint4(0, 0, 0, 0), b = a;
            if (ok) {
              const uint4* gate = in + 2 * r * vpr + 2 * cp;
              a = SwigluVec(gate[0], gate[vpr]);
              b = SwigluVec(gate[1], gate[vpr + 1]);
            }
            const detail::MxPair mq = detail::QuantizeMxPair(a, b);
            if (ok) {
              if constexpr (kBf16Out) {
                bf[2 * pv] = a;
                bf[2 * pv + 1] = b;
              }
              q[pv] = mq.data;
              if ((threadIdx.x & 1) == 0) {
                mx_scales[((k.r0 + r) * F + k.c0 + 16 * cp) / kMxBlock] =
                    static_cast<uint8_t>(mq.scale);
              }
            }
          }
        }
      },
      [&](const Chunk& k, const uint8_t* buf, int lane) {
        if (lane != 0) return;
        if constexpr (kBf16Out) streaming::StoreRows(out, buf, F, k, k.c0, whole);
        if constexpr (kMxOut) {
          streaming::StoreRows(
              mx_data,
              buf + (kBf16Out ? 2 * static_cast<size_t>(p.rows_per_chunk) * p.seg_width : 0), F, k,
              k.c0, whole);
        }
      });
}

// Backward stage: [nr][2 * width] bf16 of h (gate, up segments) then [nr][width] of d_out; output
// buffer: [nr][2 * width] (d_gate, d_up segments).
__global__ void __launch_bounds__(kConsumers + 32)
    SwigluBackwardKernel(Plan p, const Bf16* __restrict__ h, const Bf16* __restrict__ d_out,
                         const int32_t* __restrict__ num_rows, Bf16* __restrict__ d_h) {
  const int64_t live = LiveRows(p.rows, num_rows);
  const bool whole = p.segs == 1;
  const int64_t F = p.cols;
  const size_t dy_at =
      4 * static_cast<size_t>(p.rows_per_chunk) * p.seg_width;  // d_out's place in the stage
  streaming::StreamChunks<kConsumers>(
      p, live,
      [&](const Chunk& k, uint8_t* stage, uint64_t* full) {
        const uint32_t seg = static_cast<uint32_t>(k.width) * 2 * k.nr;
        hopper::BarrierArriveExpectBytes(full, 3 * seg);
        LoadGateUp(stage, h, F, k, whole, full);
        streaming::LoadRows(stage + dy_at, d_out, F, k, k.c0, whole, full);
      },
      [&](const Chunk& k, const uint8_t* stage, uint8_t* buf) {
        const uint32_t vpr = static_cast<uint32_t>(k.width) / 8;
        const uint32_t n = vpr * k.nr;
        const uint4* in = reinterpret_cast<const uint4*>(stage);
        const uint4* dy_in = reinterpret_cast<const uint4*>(stage + dy_at);
        uint4* o = reinterpret_cast<uint4*>(buf);
        for (uint32_t v = threadIdx.x; v < n; v += kConsumers) {
          const uint32_t r = v / vpr, cv = v - r * vpr;
          float g[8], u[8], dy[8], dg[8], du[8];
          detail::Unpack8(in[2 * r * vpr + cv], g);
          detail::Unpack8(in[(2 * r + 1) * vpr + cv], u);
          detail::Unpack8(dy_in[v], dy);
#pragma unroll
          for (int e = 0; e < 8; ++e) SwigluGrad(g[e], u[e], dy[e], &dg[e], &du[e]);
          o[2 * r * vpr + cv] = detail::Pack8(dg);
          o[(2 * r + 1) * vpr + cv] = detail::Pack8(du);
        }
      },
      [&](const Chunk& k, const uint8_t* buf, int lane) {
        if (lane != 0) return;
        if (whole) {
          hopper::BulkStore(d_h + k.r0 * 2 * F, buf, static_cast<uint32_t>(k.width) * 4 * k.nr);
        } else {
          const uint32_t bytes = static_cast<uint32_t>(k.width) * 2;
          for (int r = 0; r < k.nr; ++r) {
            Bf16* row = d_h + (k.r0 + r) * 2 * F + k.c0;
            hopper::BulkStore(row, buf + 2 * r * bytes, bytes);
            hopper::BulkStore(row + F, buf + (2 * r + 1) * bytes, bytes);
          }
        }
      });
}

// Forward with the fp8-block output: one warp per 1 x 128 tile of the output (a row's 128 gate and
// 128 up values in, four per lane), the tile's amax over the bf16-rounded results, then E4M3 with
// the tile's scale: the same arithmetic as SwigluVec and fp8_block.cu's row-wise quantizer, so
// the output equals QuantizeFp8Block of the bf16 output bit for bit.
constexpr int kFp8BlockThreads = 256;

__global__ void __launch_bounds__(kFp8BlockThreads)
    SwigluFp8BlockKernel(const uint2* __restrict__ h, int64_t rows, int64_t F,
                         const int32_t* __restrict__ num_rows, bool pow2, uint2* __restrict__ out,
                         uint32_t* __restrict__ data, float* __restrict__ scales) {
  namespace fb = fp8_block_math;
  const int lane = threadIdx.x & 31;
  const int64_t tiles_per_row = F / kFp8Block;
  const int64_t tiles = LiveRows(rows, num_rows) * tiles_per_row;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kFp8BlockThreads / 32);
  for (int64_t t = (static_cast<int64_t>(blockIdx.x) * kFp8BlockThreads + threadIdx.x) / 32;
       t < tiles; t += warps) {
    const int64_t row = t / tiles_per_row, tile = t - row * tiles_per_row;
    const int64_t at = row * (F / 2) + tile * 32 + lane;  // uint2 index of the gate values
    const uint2 g = h[at], u = h[at + F / 4];
    const float gf[4] = {detail::BfLo(g.x), detail::BfHi(g.x), detail::BfLo(g.y), detail::BfHi(g.y)};
    const float uf[4] = {detail::BfLo(u.x), detail::BfHi(u.x), detail::BfLo(u.y), detail::BfHi(u.y)};
    float o[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) o[e] = __fdividef(gf[e], 1.0f + __expf(-gf[e])) * uf[e];
    const uint32_t w0 = detail::PackBf16x2(o[0], o[1]), w1 = detail::PackBf16x2(o[2], o[3]);
    if (out != nullptr) out[t * 32 + lane] = make_uint2(w0, w1);
    uint32_t m = fb::MagnitudeMax(fb::MagnitudeMax(0, w0), w1);
    m = fb::WarpMaxBits(max(m & 0xffffu, m >> 16));
    const fb::DeviceScale sc = fb::ScaleForAmax(fb::AmaxFromBits(m), pow2);
    data[t * 32 + lane] = fb::QuantizeFour(w0, w1, sc.inverse);
    if (lane == 0) scales[t] = sc.scale;
  }
}

// The backward with the fp8-block output: fp8_block_tile.cuh's tile quantizer over d_h [M][2F]
// whose 16-byte pieces are computed here from h and d_out instead of read (d_h is never stored).
// A 128-column tile is all gate or all up columns (F % 128 == 0); the gate and up tiles of a row
// block read the same h and d_out pieces, through L2 for the second.
// The forward with the fp8-block output in both forms: the tile quantizer over out [M][F] whose
// pieces are SwigluVec of h's gate and up pieces (out is never stored).
struct SwigluTiles {
  const Bf16* h;
  int64_t F;
  __device__ __forceinline__ uint4 Load(int64_t row, int64_t col) const {
    const Bf16* hr = h + row * 2 * F + col;
    return SwigluVec(*reinterpret_cast<const uint4*>(hr), *reinterpret_cast<const uint4*>(hr + F));
  }
};

struct SwigluGradTiles {
  const Bf16* h;
  const Bf16* d_out;
  int64_t F;
  __device__ __forceinline__ uint4 Load(int64_t row, int64_t col) const {
    const bool up = col >= F;
    const int64_t c = up ? col - F : col;
    const Bf16* hr = h + row * 2 * F + c;
    float g[8], u[8], dy[8], o[8];
    detail::Unpack8(*reinterpret_cast<const uint4*>(hr), g);
    detail::Unpack8(*reinterpret_cast<const uint4*>(hr + F), u);
    detail::Unpack8(*reinterpret_cast<const uint4*>(d_out + row * F + c), dy);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float dg, du;
      SwigluGrad(g[e], u[e], dy[e], &dg, &du);
      o[e] = up ? du : dg;
    }
    return detail::Pack8(o);
  }
};

// Bulk copies need 16-byte aligned addresses: every row and segment is (F % 8 == 0), so only the
// base pointers can break it.
bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

absl::Status SwigluForward(const SwigluShape& shape, const int32_t* num_rows, const Bf16* h,
                           Bf16* out, const MxRowwise* out_mx, Stream stream) {
  if (absl::Status s = ValidateSwigluShape(shape, out_mx != nullptr); !s.ok()) return s;
  if (out == nullptr && out_mx == nullptr) {
    return absl::InvalidArgumentError("out: and out_mx are both null: nothing to produce");
  }
  if (out_mx != nullptr && (out_mx->data == nullptr || out_mx->scales == nullptr)) {
    return absl::InvalidArgumentError("out_mx: data and scales must be set");
  }
  if (shape.rows == 0) return absl::OkStatus();
  if (h == nullptr) return absl::InvalidArgumentError("h: is null");
  if (shape.ffn > (1 << 28)) return absl::InvalidArgumentError("ffn: too large");
  if (!Aligned16(h) || !Aligned16(out) || (out_mx != nullptr && !Aligned16(out_mx->data))) {
    return absl::InvalidArgumentError("h, out, out_mx->data: must be 16-byte aligned");
  }
  uint8_t* mx_data = out_mx == nullptr ? nullptr : out_mx->data;
  uint8_t* mx_scales = out_mx == nullptr ? nullptr : out_mx->scales;
  const uint32_t out_per_col = (out != nullptr ? 2 : 0) + (out_mx != nullptr ? 1 : 0);
  // Both outputs write 3 bytes per 4 read: deeper rings (about two blocks per multiprocessor)
  // measured 2-7 points faster than the 56 KB blocks the other variants prefer (docs/kernels.md).
  const uint32_t budget = out != nullptr && out_mx != nullptr ? kBothBlockBudget : kBlockBudget;
  const Plan plan = streaming::MakePlan(shape.rows, shape.ffn, 4, out_per_col, budget, 32);
  if (out != nullptr && out_mx != nullptr) {
    return streaming::Launch<SwigluForwardKernel<true, true>, kConsumers + 32>(
        "SwigluForwardKernel", plan, stream, h, num_rows, out, mx_data, mx_scales);
  }
  if (out != nullptr) {
    return streaming::Launch<SwigluForwardKernel<true, false>, kConsumers + 32>(
        "SwigluForwardKernel", plan, stream, h, num_rows, out, mx_data, mx_scales);
  }
  return streaming::Launch<SwigluForwardKernel<false, true>, kMxConsumers + 32>(
      "SwigluForwardKernel", plan, stream, h, num_rows, out, mx_data, mx_scales);
}

absl::Status SwigluForwardFp8Block(const SwigluShape& shape, const int32_t* num_rows,
                                   const Bf16* h, Bf16* out, const Fp8BlockRowwise& out_fb,
                                   Fp8ScaleMode mode, Stream stream) {
  if (absl::Status s = ValidateSwigluShape(shape, false); !s.ok()) return s;
  if (shape.ffn % kFp8Block != 0) {
    return absl::InvalidArgumentError("ffn: must be a multiple of 128 for the fp8-block output");
  }
  if (out_fb.data == nullptr || out_fb.scales == nullptr) {
    return absl::InvalidArgumentError("out_fb: data and scales must be set");
  }
  if (shape.rows == 0) return absl::OkStatus();
  if (h == nullptr) return absl::InvalidArgumentError("h: is null");
  if (shape.ffn > (1 << 28)) return absl::InvalidArgumentError("ffn: too large");
  if (!Aligned16(h) || !Aligned16(out) || !Aligned16(out_fb.data)) {
    return absl::InvalidArgumentError("h, out, out_fb.data: must be 16-byte aligned");
  }
  const int blocks =
      GridStrideBlocks(shape.rows * (shape.ffn / kFp8Block), kFp8BlockThreads / 32);
  SwigluFp8BlockKernel<<<blocks, kFp8BlockThreads, 0, stream>>>(
      reinterpret_cast<const uint2*>(h), shape.rows, shape.ffn, num_rows,
      mode == Fp8ScaleMode::kPowerOfTwo, reinterpret_cast<uint2*>(out),
      reinterpret_cast<uint32_t*>(out_fb.data), out_fb.scales);
  return LaunchStatus("SwigluFp8BlockKernel");
}

absl::Status SwigluBackward(const SwigluShape& shape, const int32_t* num_rows, const Bf16* h,
                            const Bf16* d_out, Bf16* d_h, Stream stream) {
  if (absl::Status s = ValidateSwigluShape(shape, false); !s.ok()) return s;
  if (shape.rows == 0) return absl::OkStatus();
  if (h == nullptr || d_out == nullptr || d_h == nullptr) {
    return absl::InvalidArgumentError("h, d_out and d_h must be set");
  }
  if (shape.ffn > (1 << 28)) return absl::InvalidArgumentError("ffn: too large");
  if (!Aligned16(h) || !Aligned16(d_out) || !Aligned16(d_h)) {
    return absl::InvalidArgumentError("h, d_out, d_h: must be 16-byte aligned");
  }
  return streaming::Launch<SwigluBackwardKernel, kConsumers + 32>(
      "SwigluBackwardKernel", streaming::MakePlan(shape.rows, shape.ffn, 6, 4, kBlockBudget, 32),
      stream, h, d_out, num_rows, d_h);
}

namespace {

// The checks the two tile-quantizer launchers below share, in their order: the SwiGLU shape with
// F a multiple of 128, h (and d_out) set and 16-byte aligned, and the fp8-block outputs of the
// [rows][cols] matrix they stand for (`quantize`).
absl::Status ValidateTileLaunch(const SwigluShape& shape, const Fp8BlockQuantizeShape& quantize,
                                const Bf16* h, const Bf16* d_out, bool backward,
                                const Fp8BlockRowwise* rowwise, const Fp8BlockColwise* colwise) {
  if (absl::Status s = ValidateSwigluShape(shape, false); !s.ok()) return s;
  if (shape.ffn % kFp8Block != 0) {
    return absl::InvalidArgumentError("ffn: must be a multiple of 128 for the fp8-block output");
  }
  if (shape.ffn > (1 << 28)) return absl::InvalidArgumentError("ffn: too large");
  if (shape.rows > 0 && (h == nullptr || (backward && d_out == nullptr))) {
    return absl::InvalidArgumentError(backward ? "h, d_out: must be set" : "h: is null");
  }
  if (absl::Status s = ValidateFp8BlockQuantize(quantize, h, rowwise, colwise); !s.ok()) return s;
  if (!Aligned16(h) || (backward && !Aligned16(d_out))) {
    return absl::InvalidArgumentError(backward ? "h, d_out: must be 16-byte aligned"
                                               : "h: must be 16-byte aligned");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SwigluForwardFp8BlockGrouped(const SwigluShape& shape, const int32_t* group_offsets,
                                          int num_groups, const Bf16* h,
                                          const Fp8BlockRowwise* rowwise,
                                          const Fp8BlockColwise* colwise, Fp8ScaleMode mode,
                                          Stream stream) {
  const Fp8BlockQuantizeShape quantize{shape.rows, shape.ffn, num_groups, mode};
  if (absl::Status s = ValidateTileLaunch(shape, quantize, h, nullptr, /*backward=*/false,
                                          rowwise, colwise);
      !s.ok()) {
    return s;
  }
  return fp8_block_tile::LaunchTiles(quantize, SwigluTiles{h, shape.ffn}, group_offsets, rowwise,
                                     colwise, stream);
}

absl::Status SwigluBackwardFp8Block(const SwigluShape& shape, const int32_t* group_offsets,
                                    int num_groups, const Bf16* h, const Bf16* d_out,
                                    const Fp8BlockRowwise* rowwise, const Fp8BlockColwise* colwise,
                                    Fp8ScaleMode mode, Stream stream) {
  const Fp8BlockQuantizeShape quantize{shape.rows, 2 * shape.ffn, num_groups, mode};
  if (absl::Status s = ValidateTileLaunch(shape, quantize, h, d_out, /*backward=*/true, rowwise,
                                          colwise);
      !s.ok()) {
    return s;
  }
  return fp8_block_tile::LaunchTiles(quantize, SwigluGradTiles{h, d_out, shape.ffn}, group_offsets,
                                     rowwise, colwise, stream);
}

}  // namespace dropless::kernels::cuda
