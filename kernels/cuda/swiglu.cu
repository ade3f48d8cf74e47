// SwiGLU forward (bf16 and/or row-wise MXFP8 output) and backward (contracts: swiglu.h).
// Memory-bound, so the kernels stream: a persistent grid walks chunks of whole rows (or, for wide
// rows, row segments); one producer thread per block moves each chunk into shared memory with bulk
// copies (kStages in flight), the consumer warps compute from shared memory into an output buffer,
// and one consumer thread writes that buffer back with bulk copies (double-buffered). Fast exp and
// division keep the arithmetic under the memory time.
#include <cuda_runtime.h>

#include <algorithm>

#include "absl/status/status.h"
#include "dropless/kernels/swiglu.h"
#include "kernels/cuda/bulk_copy.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.cuh"

namespace dropless::kernels::cuda {
namespace {

// Compute threads per block (plus one producer warp): 128, or 256 for the MXFP8-only output.
// Measured on an H200 (docs/kernels.md).
constexpr int kConsumers = 128;
constexpr int kMxConsumers = 256;
constexpr int kMaxStages = 8;
constexpr uint32_t kChunkTarget = 16 * 1024;     // input bytes per chunk
constexpr uint32_t kBlockBudget = 56 * 1024;     // shared memory per block: about four per multiprocessor

// A chunk: rows [r0, r0 + nr) x columns [c0, c0 + width) of the F-wide halves. Whole rows (width ==
// F) when a row fits the chunk target: then each stream is one contiguous copy.
struct Plan {
  int64_t live_rows_cap;  // shape.rows
  int32_t ffn;
  int32_t rows_per_chunk;
  int32_t seg_width;      // columns per segment (multiple of 32), == ffn for whole rows
  int32_t segs;           // segments per row
  int32_t stages;
  uint32_t in_chunk;      // stage bytes
  uint32_t out_chunk;     // output buffer bytes
};

Plan MakePlan(const SwigluShape& shape, uint32_t in_bytes_per_col, uint32_t out_bytes_per_col) {
  Plan p{};
  p.live_rows_cap = shape.rows;
  p.ffn = static_cast<int32_t>(shape.ffn);
  const uint64_t row_in = uint64_t{in_bytes_per_col} * shape.ffn;
  if (row_in <= kChunkTarget) {
    p.rows_per_chunk = static_cast<int32_t>(kChunkTarget / row_in);
    p.seg_width = p.ffn;
  } else {
    p.rows_per_chunk = 1;
    p.seg_width = static_cast<int32_t>(kChunkTarget / in_bytes_per_col / 32 * 32);
  }
  p.segs = (p.ffn + p.seg_width - 1) / p.seg_width;
  p.in_chunk = static_cast<uint32_t>(p.rows_per_chunk) * p.seg_width * in_bytes_per_col;
  p.out_chunk = static_cast<uint32_t>(p.rows_per_chunk) * p.seg_width * out_bytes_per_col;
  const int64_t fit = (int64_t{kBlockBudget} - 2 * int64_t{p.out_chunk}) / p.in_chunk;
  p.stages = static_cast<int32_t>(std::clamp<int64_t>(fit, 2, kMaxStages));
  return p;
}

size_t SmemBytes(const Plan& p) {
  return size_t{p.in_chunk} * p.stages + 2 * size_t{p.out_chunk} + 2 * sizeof(uint64_t) * p.stages;
}

// Blocks resident at once for blocks of `threads` threads using `smem` bytes of shared memory.
int ResidentGrid(size_t smem, int threads) {
  static const int2 device = [] {
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return make_int2(0, 0);
    }
    return make_int2(sms, per_sm);
  }();
  const int by_smem = static_cast<int>(device.y / (smem + 1024));  // 1 KB reserved per block
  return device.x * std::max(1, std::min(by_smem, 2048 / threads));
}

__device__ __forceinline__ int64_t LiveRows(int64_t rows, const int32_t* num_rows) {
  return num_rows == nullptr ? rows : min(rows, static_cast<int64_t>(max(0, *num_rows)));
}

// silu(g) * u with the fast exp and division (a few fp32 ulps from the CPU reference's exact
// formula g / (1 + exp(-g)); the tests bound the difference at one bf16 ulp).
__device__ __forceinline__ float Sigmoid(float g) { return __fdividef(1.0f, 1.0f + __expf(-g)); }

__device__ __forceinline__ uint4 SwigluVec(uint4 gate, uint4 up) {
  float g[8], u[8], o[8];
  detail::Unpack8(gate, g);
  detail::Unpack8(up, u);
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = __fdividef(g[e], 1.0f + __expf(-g[e])) * u[e];
  return detail::Pack8(o);
}

// The block's chunk sequence, its stage ring and output buffers. The producer thread (first lane
// of the last warp) loads chunk i into stage i % stages once the consumers have released it; the
// consumers compute chunk i into out buffer i % 2, which consumer thread 0 stores with bulk copies
// after a barrier, having waited for the store of chunk i - 2 to leave that buffer.
struct Chunk {
  int64_t r0;
  int32_t nr;      // rows
  int32_t c0;      // first column of the segment
  int32_t width;   // columns of the segment
};

// Chunk indices stay below 2^31 (rows * segments are checked on the host): 32-bit arithmetic, and
// no division at all for whole rows.
__device__ __forceinline__ Chunk ChunkAt(uint32_t c, const Plan& p, int64_t live) {
  uint32_t row_chunk = c, seg = 0;
  if (p.segs != 1) {
    row_chunk = c / static_cast<uint32_t>(p.segs);
    seg = c - row_chunk * static_cast<uint32_t>(p.segs);
  }
  Chunk k;
  k.r0 = static_cast<int64_t>(row_chunk) * p.rows_per_chunk;
  k.nr = static_cast<int32_t>(live - k.r0 < p.rows_per_chunk ? live - k.r0 : p.rows_per_chunk);
  k.c0 = static_cast<int32_t>(seg) * p.seg_width;
  k.width = min(p.seg_width, p.ffn - k.c0);
  return k;
}

template <int kConsumers, class Produce, class Consume, class Store>
__device__ __forceinline__ void StreamChunks(const Plan& p, int64_t live, Produce produce,
                                             Consume consume, Store store) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* const stages = smem;
  uint8_t* const outs = smem + size_t{p.in_chunk} * p.stages;
  uint64_t* const full = reinterpret_cast<uint64_t*>(outs + 2 * size_t{p.out_chunk});
  uint64_t* const empty = full + p.stages;
  const int tid = threadIdx.x;
  const uint32_t chunks =
      static_cast<uint32_t>((live + p.rows_per_chunk - 1) / p.rows_per_chunk) * p.segs;
  if (tid == 0) {
    for (int s = 0; s < p.stages; ++s) {
      bulk::BarrierInit(&full[s], 1);
      bulk::BarrierInit(&empty[s], kConsumers / 32);
    }
    bulk::BarrierInitFence();
  }
  __syncthreads();
  // Stage s of the ring and the parity of its current round, advanced without divisions.
  int s = 0;
  uint32_t phase = 0;
  auto advance = [&] {
    if (++s == p.stages) {
      s = 0;
      phase ^= 1;
    }
  };
  if (tid >= kConsumers) {
    if (tid == kConsumers) {
      for (uint32_t c = blockIdx.x; c < chunks; c += gridDim.x, advance()) {
        bulk::BarrierWait(&empty[s], phase ^ 1);
        produce(ChunkAt(c, p, live), stages + size_t{p.in_chunk} * s, &full[s]);
      }
    }
    return;
  }
  uint32_t i = 0;
  for (uint32_t c = blockIdx.x; c < chunks; c += gridDim.x, ++i, advance()) {
    uint8_t* const out = outs + size_t{p.out_chunk} * (i & 1);
    const Chunk k = ChunkAt(c, p, live);
    if (tid == 0) bulk::WaitRead<1>();  // the store of chunk i - 2 has left `out`
    bulk::NamedBarrier(1, kConsumers);
    bulk::BarrierWait(&full[s], phase);
    consume(k, stages + size_t{p.in_chunk} * s, out);
    __syncwarp();
    if ((tid & 31) == 0) bulk::BarrierArrive(&empty[s]);
    bulk::FenceSharedForCopies();
    bulk::NamedBarrier(2, kConsumers);
    if (tid == 0) {
      store(k, out);
      bulk::Commit();
    }
  }
  if (tid == 0) bulk::WaitAll();
}

// Copies rows [r0, r0 + nr) x columns [c0, c0 + width) of a row-major matrix with `row` elements
// per row (bf16) between global memory and a dense [nr][width] tile: one copy for whole rows.
__device__ __forceinline__ uint32_t LoadRows(void* tile, const Bf16* src, int64_t row, const Chunk& k,
                                             int32_t col, bool whole, uint64_t* bar) {
  const uint32_t bytes = static_cast<uint32_t>(k.width) * 2;
  if (whole) {
    bulk::Load(tile, src + k.r0 * row + col, bytes * k.nr, bar);
  } else {
    for (int r = 0; r < k.nr; ++r) {
      bulk::Load(static_cast<uint8_t*>(tile) + r * bytes, src + (k.r0 + r) * row + col, bytes, bar);
    }
  }
  return bytes * k.nr;
}

template <typename T>
__device__ __forceinline__ void StoreRows(T* dst, const void* tile, int64_t row, const Chunk& k,
                                          int32_t col, bool whole) {
  const uint32_t bytes = static_cast<uint32_t>(k.width) * sizeof(T);
  if (whole) {
    bulk::Store(dst + k.r0 * row + col, tile, bytes * k.nr);
  } else {
    for (int r = 0; r < k.nr; ++r) {
      bulk::Store(dst + (k.r0 + r) * row + col, static_cast<const uint8_t*>(tile) + r * bytes, bytes);
    }
  }
}

// Forward stage: [nr][2 * width] bf16 (each row's gate segment, then its up segment); output
// buffer: [nr][width] bf16 then [nr][width] E4M3 (either may be absent).
template <bool kBf16Out, bool kMxOut, int kConsumers = kMxOut && !kBf16Out ? kMxConsumers : 128>
__global__ void __launch_bounds__(kConsumers + 32)
    SwigluForwardKernel(Plan p, const Bf16* __restrict__ h, const int32_t* __restrict__ num_rows,
                        Bf16* __restrict__ out, uint8_t* __restrict__ mx_data,
                        uint8_t* __restrict__ mx_scales) {
  const int64_t live = LiveRows(p.live_rows_cap, num_rows);
  const bool whole = p.segs == 1;
  const int64_t F = p.ffn;
  StreamChunks<kConsumers>(
      p, live,
      [&](const Chunk& k, uint8_t* stage, uint64_t* full) {
        const uint32_t half = static_cast<uint32_t>(k.width) * 2 * k.nr;
        bulk::BarrierArriveExpectBytes(full, 2 * half);
        if (whole) {  // gate and up of whole rows are one contiguous run
          bulk::Load(stage, h + k.r0 * 2 * F, 2 * half, full);
        } else {
          const uint32_t bytes = static_cast<uint32_t>(k.width) * 2;
          for (int r = 0; r < k.nr; ++r) {
            const Bf16* row = h + (k.r0 + r) * 2 * F + k.c0;
            bulk::Load(stage + 2 * r * bytes, row, bytes, full);
            bulk::Load(stage + (2 * r + 1) * bytes, row + F, bytes, full);
          }
        }
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
          uint4* q = reinterpret_cast<uint4*>(buf + (kBf16Out ? 2 * static_cast<size_t>(p.rows_per_chunk) * p.seg_width : 0));
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
                mx_scales[((k.r0 + r) * F + k.c0 + 16 * cp) / kMxBlock] = static_cast<uint8_t>(mq.scale);
              }
            }
          }
        }
      },
      [&](const Chunk& k, const uint8_t* buf) {
        if constexpr (kBf16Out) StoreRows(out, buf, F, k, k.c0, whole);
        if constexpr (kMxOut) {
          StoreRows(mx_data, buf + (kBf16Out ? 2 * static_cast<size_t>(p.rows_per_chunk) * p.seg_width : 0), F, k,
                    k.c0, whole);
        }
      });
}

// Backward stage: [nr][2 * width] bf16 of h (gate, up segments) then [nr][width] of d_out; output
// buffer: [nr][2 * width] (d_gate, d_up segments).
__global__ void __launch_bounds__(kConsumers + 32)
    SwigluBackwardKernel(Plan p, const Bf16* __restrict__ h, const Bf16* __restrict__ d_out,
                         const int32_t* __restrict__ num_rows, Bf16* __restrict__ d_h) {
  const int64_t live = LiveRows(p.live_rows_cap, num_rows);
  const bool whole = p.segs == 1;
  const int64_t F = p.ffn;
  const size_t dy_at = 4 * static_cast<size_t>(p.rows_per_chunk) * p.seg_width;  // d_out's place in the stage
  StreamChunks<kConsumers>(
      p, live,
      [&](const Chunk& k, uint8_t* stage, uint64_t* full) {
        const uint32_t seg = static_cast<uint32_t>(k.width) * 2 * k.nr;
        bulk::BarrierArriveExpectBytes(full, 3 * seg);
        if (whole) {
          bulk::Load(stage, h + k.r0 * 2 * F, 2 * seg, full);
        } else {
          const uint32_t bytes = static_cast<uint32_t>(k.width) * 2;
          for (int r = 0; r < k.nr; ++r) {
            const Bf16* row = h + (k.r0 + r) * 2 * F + k.c0;
            bulk::Load(stage + 2 * r * bytes, row, bytes, full);
            bulk::Load(stage + (2 * r + 1) * bytes, row + F, bytes, full);
          }
        }
        LoadRows(stage + dy_at, d_out, F, k, k.c0, whole, full);
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
          for (int e = 0; e < 8; ++e) {
            const float s = Sigmoid(g[e]);
            dg[e] = dy[e] * u[e] * s * (1.0f + g[e] * (1.0f - s));
            du[e] = dy[e] * g[e] * s;
          }
          o[2 * r * vpr + cv] = detail::Pack8(dg);
          o[(2 * r + 1) * vpr + cv] = detail::Pack8(du);
        }
      },
      [&](const Chunk& k, const uint8_t* buf) {
        if (whole) {
          bulk::Store(d_h + k.r0 * 2 * F, buf, static_cast<uint32_t>(k.width) * 4 * k.nr);
        } else {
          const uint32_t bytes = static_cast<uint32_t>(k.width) * 2;
          for (int r = 0; r < k.nr; ++r) {
            Bf16* row = d_h + (k.r0 + r) * 2 * F + k.c0;
            bulk::Store(row, buf + 2 * r * bytes, bytes);
            bulk::Store(row + F, buf + (2 * r + 1) * bytes, bytes);
          }
        }
      });
}

// kKernel is a template argument so that each kernel sets its attribute once.
template <auto kKernel, int kThreads, class... Args>
absl::Status LaunchStreaming(const char* name, const Plan& plan, Stream stream, Args... args) {
  const size_t smem = SmemBytes(plan);
  // Once per kernel: allow the most shared memory a plan can take (kBlockBudget, or two stages and
  // two output buffers of at most kChunkTarget each), so a call never touches the attribute.
  static const cudaError_t allowed = cudaFuncSetAttribute(
      kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(std::max<size_t>(kBlockBudget, 4 * size_t{kChunkTarget}) + 2 * sizeof(uint64_t) * kMaxStages));
  if (allowed != cudaSuccess) return CudaStatus(allowed, name);
  const int64_t row_chunks = (plan.live_rows_cap + plan.rows_per_chunk - 1) / plan.rows_per_chunk;
  if (row_chunks * plan.segs >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError("rows: too many for one launch");
  }
  const int grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(row_chunks * plan.segs, ResidentGrid(smem, kThreads))));
  kKernel<<<grid, kThreads, smem, stream>>>(plan, args...);
  return LaunchStatus(name);
}

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
  const Plan plan = MakePlan(shape, 4, out_per_col);
  if (out != nullptr && out_mx != nullptr) {
    return LaunchStreaming<SwigluForwardKernel<true, true>, kConsumers + 32>("SwigluForwardKernel", plan, stream, h,
                           num_rows, out, mx_data, mx_scales);
  }
  if (out != nullptr) {
    return LaunchStreaming<SwigluForwardKernel<true, false>, kConsumers + 32>("SwigluForwardKernel", plan, stream, h,
                           num_rows, out, mx_data, mx_scales);
  }
  return LaunchStreaming<SwigluForwardKernel<false, true>, kMxConsumers + 32>("SwigluForwardKernel", plan, stream, h,
                         num_rows, out, mx_data, mx_scales);
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
  return LaunchStreaming<SwigluBackwardKernel, kConsumers + 32>("SwigluBackwardKernel", MakePlan(shape, 6, 4), stream, h,
                                              d_out, num_rows, d_h);
}

}  // namespace dropless::kernels::cuda
