// MXFP8 quantization (row-wise, and row-wise + column-wise from one read, grouped) and
// dequantization. Layouts and rounding: dropless/kernels/mxfp8.h.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "absl/status/status.h"
#include "dropless/kernels/mxfp8.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/hopper/bulk_copy.cuh"
#include "kernels/cuda/hopper/mbarrier.cuh"
#include "kernels/cuda/padded_offsets.cuh"

namespace dropless::kernels::cuda {
namespace {

using detail::kFullMask;

// ---- Row-wise only: 16 elements (two vectors) per thread, 2 lanes per block, 16-byte stores;
// the next pass's loads are issued before this pass is quantized. ----

constexpr int kRowThreads = 256;
constexpr int kRowUnroll = 2;  // pairs per thread per pass

__device__ __forceinline__ int64_t LiveRows(int64_t rows, const int32_t* group_offsets,
                                            int num_groups) {
  if (group_offsets == nullptr) return rows;
  return min(rows, static_cast<int64_t>(max(0, group_offsets[num_groups])));
}

__device__ __forceinline__ void LoadPairs(const uint4* __restrict__ x, int64_t base, int64_t total,
                                          uint4 (&a)[kRowUnroll], uint4 (&b)[kRowUnroll]) {
#pragma unroll
  for (int u = 0; u < kRowUnroll; ++u) {
    const int64_t i = base + u * kRowThreads + threadIdx.x;
    a[u] = i < total ? detail::LoadVecStreaming(x + 2 * i) : make_uint4(0, 0, 0, 0);
    b[u] = i < total ? detail::LoadVecStreaming(x + 2 * i + 1) : make_uint4(0, 0, 0, 0);
  }
}

__global__ void __launch_bounds__(kRowThreads)
    QuantizeRowwiseKernel(const uint4* __restrict__ x, int64_t rows, int64_t cols,
                          const int32_t* __restrict__ group_offsets, int num_groups,
                          uint4* __restrict__ data, uint8_t* __restrict__ scales) {
  // Pairs of vectors (16 elements); cols % 32 == 0 keeps both lanes of an MX block valid or
  // invalid together, and the block-uniform loop keeps every lane at the shuffle.
  const int64_t total = LiveRows(rows, group_offsets, num_groups) * (cols / 16);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kRowThreads * kRowUnroll;
  // From the first live row, offsets[0] (a run of the groups may start past row 0).
  const int64_t first =
      group_offsets == nullptr ? 0 : min(rows, static_cast<int64_t>(max(0, group_offsets[0])));
  int64_t base = first * (cols / 16) + static_cast<int64_t>(blockIdx.x) * kRowThreads * kRowUnroll;
  uint4 a[kRowUnroll], b[kRowUnroll];
  LoadPairs(x, base, total, a, b);
  for (; base < total; base += stride) {
    uint4 next_a[kRowUnroll], next_b[kRowUnroll];
    LoadPairs(x, base + stride, total, next_a, next_b);
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int64_t i = base + u * kRowThreads + threadIdx.x;
      const detail::MxPair q = detail::QuantizeMxPair(a[u], b[u]);
      if (i < total) {
        data[i] = q.data;
        if ((threadIdx.x & 1) == 0) scales[i / 2] = static_cast<uint8_t>(q.scale);
      }
      a[u] = next_a[u];
      b[u] = next_b[u];
    }
  }
}

// ---- Row-wise + column-wise streaming kernel ----
//
// A persistent grid walks items = (one padded 32-row block of one group) x (a segment of kW
// columns), segments fastest, so the blocks running at once read whole input rows. Per block one
// producer warp resolves an item's group and copies its live rows into a stage of a ring with one
// bulk copy per row (kW * 2 contiguous bytes; cp.async.bulk completing on the stage's mbarrier),
// kStages - 1 items ahead; kConsumerWarps warps quantize from the stage, each on its own (no block
// barrier), and release it through the stage's empty barrier:
//   column-wise: lanes i and i + 16 take rows 0-15 and 16-31 of column pair i of 16; their amax
//     meet in one shuffle; each lane stores 16 E4M3 bytes per column, so a warp writes 16 whole
//     32-byte column runs per store, and a block writes its item's block-major output run
//     (kW * 32 contiguous bytes) and its kW scale bytes without gaps;
//   row-wise: 2 lanes per MX block of a row (QuantizeMxPair), 16-byte stores.
// Rows 16-31 of a stage start 64 bytes later than a dense layout would put them, so the column
// reads of lanes i and i + 16 fall in different banks.

struct RowBlock {
  int32_t source_row;  // input row of the block's first padded row; -1: past the last group
  int32_t live;        // rows of the block that hold data (the rest is group padding)
};

// Warp-collective: the group holding padded rows [padded_row, padded_row + 32). `group` is the
// warp's previous answer (0 at first): padded rows only grow along a block's tiles, so the search
// resumes there and usually takes one ballot.
__device__ __forceinline__ RowBlock ResolveRowBlock(int32_t padded_row, int& group,
                                                    const int32_t* __restrict__ offsets,
                                                    const int32_t* __restrict__ padded_offsets,
                                                    int num_groups, int32_t rows,
                                                    int32_t live_padded) {
  if (padded_row >= live_padded) return {-1, 0};
  const int lane = threadIdx.x & 31;
  // group = number of j in [1, G] with padded_offsets[j] <= padded_row (a prefix of [1, G]).
  for (;;) {
    const int j = group + 1 + lane;
    const unsigned le =
        __ballot_sync(kFullMask, j <= num_groups && padded_offsets[j] <= padded_row);
    group += __popc(le);
    if (le != kFullMask) break;
  }
  const int32_t local = padded_row - padded_offsets[group];
  const int32_t begin = offsets == nullptr ? 0 : offsets[group];
  const int32_t count = offsets == nullptr ? rows : offsets[group + 1] - begin;
  const int32_t live = count - local;
  return {begin + local, live < 0 ? 0 : (live > kMxBlock ? kMxBlock : live)};
}

template <int kW, int kStagesT, int kConsumerWarpsT>
struct StreamConfig {
  static constexpr int kWidth = kW, kStages = kStagesT, kConsumerWarps = kConsumerWarpsT;
  static constexpr int kPitch = kW * 2;  // bytes of a staged row
  static constexpr int kHalfShift = 64;  // extra offset of rows 16-31
  static constexpr int kStageStride = (32 * kPitch + kHalfShift + 127) / 128 * 128;
  static constexpr int kThreads = (kConsumerWarps + 1) * 32;
  static constexpr size_t kSmemBytes = size_t{kStages} * kStageStride + kStages * (16 + 16);
  static_assert(kW % 256 == 0, "segment: a multiple of 256 columns");
  static_assert(kStages >= 2, "at least one item in flight");
  __device__ static constexpr int RowOffset(int r) {
    return r * kPitch + (r >= 16 ? kHalfShift : 0);
  }
};

struct StreamSlot {
  int32_t source_row;  // input row of the block's first row
  int32_t live;        // rows holding data, 1..32
  int32_t padded_row;  // first padded row (column-wise position)
  int32_t c0;          // first column of the segment
};

template <class Cfg, bool kMasked>
__device__ __forceinline__ void StreamColumnPair(const uint8_t* stage, const StreamSlot& slot,
                                                 int g, int lane, int32_t cols,
                                                 uint8_t* __restrict__ col_data,
                                                 uint8_t* __restrict__ col_scales) {
  const int h = lane >> 4, pair = g * 16 + (lane & 15);
  const uint8_t* base = stage + Cfg::RowOffset(16 * h) + pair * 4;
  const int lim = slot.live - 16 * h;
  uint32_t word[16];
  uint32_t amax = 0;
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    uint32_t w = *reinterpret_cast<const uint32_t*>(base + e * Cfg::kPitch);
    if (kMasked && e >= lim) w = 0;
    word[e] = w;
    amax = __vmaxu2(amax, w & 0x7fff7fffu);
  }
  amax = __vmaxu2(amax, __shfl_xor_sync(kFullMask, amax, 16));
  const uint32_t scale_lo = detail::ScaleByteForAmaxBits(amax & 0xffffu);
  const uint32_t scale_hi = detail::ScaleByteForAmaxBits(amax >> 16);
  const float inv_lo = detail::InverseScale(scale_lo), inv_hi = detail::InverseScale(scale_hi);
  uint32_t lo[4], hi[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t* v = word + 4 * q;
    lo[q] = detail::E4M3x2(detail::BfLo(v[0]) * inv_lo, detail::BfLo(v[1]) * inv_lo) |
            (detail::E4M3x2(detail::BfLo(v[2]) * inv_lo, detail::BfLo(v[3]) * inv_lo) << 16);
    hi[q] = detail::E4M3x2(detail::BfHi(v[0]) * inv_hi, detail::BfHi(v[1]) * inv_hi) |
            (detail::E4M3x2(detail::BfHi(v[2]) * inv_hi, detail::BfHi(v[3]) * inv_hi) << 16);
    if (scale_lo == kE8M0Nan) lo[q] = 0x7f7f7f7fu;
    if (scale_hi == kE8M0Nan) hi[q] = 0x7f7f7f7fu;
  }
  // Block-major output: block row j = padded_row / 32 is [cols][32] bytes.
  const int64_t at = static_cast<int64_t>(slot.padded_row / kMxBlock) * cols + slot.c0 + 2 * pair;
  uint8_t* dst = col_data + at * kMxBlock + 16 * h;
  *reinterpret_cast<uint4*>(dst) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  *reinterpret_cast<uint4*>(dst + kMxBlock) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
  col_scales[at + h] = static_cast<uint8_t>(h == 0 ? scale_lo : scale_hi);
}

template <class Cfg, bool kRowwise>
__global__ void __launch_bounds__(Cfg::kThreads)
    QuantizeStreamKernel(const Bf16* __restrict__ x, int32_t rows, int32_t cols,
                         const int32_t* __restrict__ offsets, int num_groups,
                         uint8_t* __restrict__ row_data, uint8_t* __restrict__ row_scales,
                         uint8_t* __restrict__ col_data, uint8_t* __restrict__ col_scales,
                         const int32_t* __restrict__ padded_offsets) {
  constexpr int kW = Cfg::kWidth, kStages = Cfg::kStages, kWarps = Cfg::kConsumerWarps;
  extern __shared__ __align__(128) uint8_t smem[];
  StreamSlot* const slots =
      reinterpret_cast<StreamSlot*>(smem + size_t{kStages} * Cfg::kStageStride);
  uint64_t* const full = reinterpret_cast<uint64_t*>(slots + kStages);
  uint64_t* const empty = full + kStages;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int32_t live_padded = padded_offsets[num_groups];
  const uint32_t segs = static_cast<uint32_t>(cols + kW - 1) / kW;
  const uint32_t items = static_cast<uint32_t>(live_padded / kMxBlock) * segs;  // < 2^31 (launcher)
  if (tid == 0) {
    hopper::BarrierInitRing(full, empty, kStages, 1, kWarps);
    hopper::BarrierInitFence();
  }
  __syncthreads();
  int s = 0;
  uint32_t phase = 0;
  auto advance = [&] {
    if (++s == kStages) {
      s = 0;
      phase ^= 1;
    }
  };
  if (warp == kWarps) {  // producer warp
    int group = 0;
    for (uint32_t c = blockIdx.x; c < items; c += gridDim.x, advance()) {
      const uint32_t rb = c / segs, seg = c - rb * segs;
      const int32_t padded_row = static_cast<int32_t>(rb) * kMxBlock;
      const RowBlock b = ResolveRowBlock(padded_row, group, offsets, padded_offsets, num_groups,
                                         rows, live_padded);
      const int32_t c0 = static_cast<int32_t>(seg) * kW;
      const uint32_t bytes = static_cast<uint32_t>(min(kW, cols - c0)) * 2;
      hopper::BarrierWait(&empty[s], phase ^ 1);
      if (lane == 0) {
        slots[s] = StreamSlot{b.source_row, b.live, padded_row, c0};
        hopper::BarrierArriveExpectBytes(&full[s], bytes * static_cast<uint32_t>(b.live));
      }
      __syncwarp();
      if (lane < b.live) {
        hopper::BulkLoad(smem + size_t{Cfg::kStageStride} * s + Cfg::RowOffset(lane),
                         x + (static_cast<int64_t>(b.source_row) + lane) * cols + c0, bytes,
                         &full[s]);
      }
    }
    return;
  }
  for (uint32_t c = blockIdx.x; c < items; c += gridDim.x, advance()) {
    hopper::BarrierWait(&full[s], phase);
    const StreamSlot slot = slots[s];
    const uint8_t* const stage = smem + size_t{Cfg::kStageStride} * s;
    const int32_t width = min(kW, cols - slot.c0);
    for (int g = warp; g < kW / 32 && g * 32 < width; g += kWarps) {
      if (slot.live == kMxBlock) {
        StreamColumnPair<Cfg, false>(stage, slot, g, lane, cols, col_data, col_scales);
      } else {
        StreamColumnPair<Cfg, true>(stage, slot, g, lane, cols, col_data, col_scales);
      }
    }
    if constexpr (kRowwise) {
      constexpr int kLanesPerRow = kW / 16 < 32 ? kW / 16 : 32;
      constexpr int kRowsPerPass = 32 / kLanesPerRow;
      const int lr = lane / kLanesPerRow, lc = lane % kLanesPerRow;
      for (int r0 = warp * kRowsPerPass; r0 < slot.live; r0 += kWarps * kRowsPerPass) {
        const int r = r0 + lr;
        const uint8_t* rowp = stage + Cfg::RowOffset(r);
#pragma unroll
        for (int cb = 0; cb < kW; cb += kLanesPerRow * 16) {
          if (cb >= width) break;
          const int col = cb + 16 * lc;
          const uint4 a = *reinterpret_cast<const uint4*>(rowp + 2 * col);
          const uint4 b = *reinterpret_cast<const uint4*>(rowp + 2 * col + 16);
          const detail::MxPair q = detail::QuantizeMxPair(a, b);
          if (r < slot.live && col < width) {
            const uint64_t at =
                static_cast<uint64_t>(slot.source_row + r) * static_cast<uint32_t>(cols) + slot.c0 +
                col;
            *reinterpret_cast<uint4*>(row_data + at) = q.data;
            if ((lc & 1) == 0) row_scales[at / kMxBlock] = static_cast<uint8_t>(q.scale);
          }
        }
      }
    }
    __syncwarp();
    if (lane == 0) hopper::BarrierArrive(&empty[s]);
  }
}

// Measured best on an H200 (docs/kernels.md): 2 KB row copies, two items in flight while one is
// quantized, 16 consumer warps, one block per multiprocessor.
using DefaultStreamConfig = StreamConfig<1024, 3, 16>;

template <class Cfg>
absl::Status LaunchStream(const MxQuantizeShape& shape, const Bf16* x, const int32_t* offsets,
                          const MxRowwise* rowwise, const MxColwise* colwise, Stream stream) {
  static const int resident = [] {
    for (auto k : {QuantizeStreamKernel<Cfg, true>, QuantizeStreamKernel<Cfg, false>}) {
      if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(Cfg::kSmemBytes)) != cudaSuccess ||
          cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
      }
    }
    return detail::ResidentBlocks(QuantizeStreamKernel<Cfg, true>, Cfg::kThreads, Cfg::kSmemBytes);
  }();
  if (resident <= 0) {
    return absl::InternalError("QuantizeStreamKernel: shared-memory or occupancy setup failed");
  }
  const int64_t segs = (shape.cols + Cfg::kWidth - 1) / Cfg::kWidth;
  const int64_t max_items = colwise->padded_rows / kMxBlock * segs;
  if (max_items >= (int64_t{1} << 31) || shape.cols > INT32_MAX) {
    return absl::InvalidArgumentError("cols: too many items for one launch");
  }
  const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(max_items, resident)));
  auto kernel =
      rowwise != nullptr ? QuantizeStreamKernel<Cfg, true> : QuantizeStreamKernel<Cfg, false>;
  kernel<<<blocks, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      x, static_cast<int32_t>(shape.rows), static_cast<int32_t>(shape.cols), offsets,
      shape.num_groups, rowwise == nullptr ? nullptr : rowwise->data,
      rowwise == nullptr ? nullptr : rowwise->scales, colwise->data, colwise->scales,
      colwise->group_offsets);
  return LaunchStatus("QuantizeStreamKernel");
}

// ---- Dequantize (row-wise) ----

template <typename Out>
__global__ void __launch_bounds__(256)
    DequantizeKernel(const uint2* __restrict__ data, const uint8_t* __restrict__ scales,
                     int64_t rows, int64_t cols, const int32_t* __restrict__ num_rows,
                     Out* __restrict__ out) {
  const int64_t live =
      num_rows == nullptr ? rows : min(rows, static_cast<int64_t>(max(0, *num_rows)));
  const int64_t total = live * (cols / 8);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint2 q = data[i];
    const uint8_t s = scales[i / 4];
    const float x = s == kE8M0Nan ? __uint_as_float(0x7fc00000u)
                                  : __uint_as_float(static_cast<uint32_t>(s) << 23);
    const uint32_t bytes[2] = {q.x, q.y};
    float f[8];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const __nv_fp8x2_storage_t two = static_cast<__nv_fp8x2_storage_t>(bytes[h] >> (16 * p));
        const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(two, __NV_E4M3);
        const float2 lohi = __half22float2(*reinterpret_cast<const __half2*>(&hr));
        // s == 0 is 2^-127, a binary32 subnormal: build it by multiplying two normal halves.
        const float scale = s == 0 ? 0x1p-64f * 0x1p-63f : x;
        f[4 * h + 2 * p] = lohi.x * scale;
        f[4 * h + 2 * p + 1] = lohi.y * scale;
      }
    }
    if constexpr (std::is_same_v<Out, float>) {
      reinterpret_cast<float4*>(out)[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
      reinterpret_cast<float4*>(out)[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
    } else {
      reinterpret_cast<uint4*>(out)[i] = detail::Pack8(f);
    }
  }
}

template <typename Out>
absl::Status Dequantize(int64_t rows, int64_t cols, const int32_t* num_rows, const uint8_t* data,
                        const uint8_t* scales, Out* out, Stream stream) {
  if (rows < 0) return absl::InvalidArgumentError("rows: must be >= 0");
  if (cols <= 0 || cols % kMxBlock != 0) {
    return absl::InvalidArgumentError("cols: must be a positive multiple of 32");
  }
  if (rows == 0) return absl::OkStatus();
  if (data == nullptr || scales == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("data, scales and out must be set");
  }
  DequantizeKernel<Out><<<GridStrideBlocks(rows * cols / 8, 256), 256, 0, stream>>>(
      reinterpret_cast<const uint2*>(data), scales, rows, cols, num_rows, out);
  return LaunchStatus("DequantizeKernel");
}

}  // namespace

absl::Status QuantizeMxfp8(const MxQuantizeShape& shape, const Bf16* x,
                           const int32_t* group_offsets, const MxRowwise* rowwise,
                           const MxColwise* colwise, Stream stream) {
  if (absl::Status s = ValidateMxQuantize(shape, x, rowwise, colwise); !s.ok()) return s;
  if (group_offsets == nullptr && shape.num_groups != 1) {
    return absl::InvalidArgumentError("num_groups: must be 1 when group_offsets is null");
  }
  // The kernels read x in 16-byte vectors / bulk copies and store E4M3 in 16-byte units.
  auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!aligned16(x)) return absl::InvalidArgumentError("x: must be 16-byte aligned");
  if (rowwise != nullptr && !aligned16(rowwise->data)) {
    return absl::InvalidArgumentError("rowwise.data: must be 16-byte aligned");
  }
  if (colwise != nullptr && !aligned16(colwise->data)) {
    return absl::InvalidArgumentError("colwise.data: must be 16-byte aligned");
  }
  if (colwise == nullptr) {
    if (shape.rows == 0) return absl::OkStatus();
    const int blocks = GridStrideBlocks(shape.rows * shape.cols / 16, kRowThreads * kRowUnroll);
    QuantizeRowwiseKernel<<<blocks, kRowThreads, 0, stream>>>(
        reinterpret_cast<const uint4*>(x), shape.rows, shape.cols, group_offsets, shape.num_groups,
        reinterpret_cast<uint4*>(rowwise->data), rowwise->scales);
    return LaunchStatus("QuantizeRowwiseKernel");
  }
  detail::PaddedOffsetsKernel<kMxBlock><<<1, detail::kScanThreads, 0, stream>>>(
      group_offsets, shape.num_groups, shape.rows, colwise->group_offsets);
  if (absl::Status s = LaunchStatus("PaddedOffsetsKernel"); !s.ok()) return s;
  return LaunchStream<DefaultStreamConfig>(shape, x, group_offsets, rowwise, colwise, stream);
}

absl::Status DequantizeMxfp8Rowwise(int64_t rows, int64_t cols, const int32_t* num_rows,
                                    const uint8_t* data, const uint8_t* scales, float* out,
                                    Stream stream) {
  return Dequantize(rows, cols, num_rows, data, scales, out, stream);
}

absl::Status DequantizeMxfp8Rowwise(int64_t rows, int64_t cols, const int32_t* num_rows,
                                    const uint8_t* data, const uint8_t* scales, Bf16* out,
                                    Stream stream) {
  return Dequantize(rows, cols, num_rows, data, scales, reinterpret_cast<__nv_bfloat16*>(out),
                    stream);
}

}  // namespace dropless::kernels::cuda
