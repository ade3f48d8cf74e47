// Streaming row chunks through shared memory with bulk copies: the skeleton of the memory-bound
// kernels whose rows are contiguous (swiglu.cu). A persistent grid walks chunks of
// whole rows (or, for wide rows, row segments). Per block, one producer thread (the first lane of
// the last warp) loads chunk i into stage i % stages of a ring once the consumers have released
// it (mbarrier full / empty per stage, several chunks in flight); the consumer warps compute
// chunk i into output buffer i % 2; after a barrier the lanes of consumer warp 0 write that buffer
// back with bulk copies, each lane first waiting until its copies of chunk i - 2 have left the
// buffer. The copy engine keeps many kilobytes in flight without a load instruction per 16 bytes,
// which the per-thread kernels these replace could not sustain (docs/kernels.md).
#ifndef DROPLESS_KERNELS_CUDA_STREAM_CHUNKS_CUH_
#define DROPLESS_KERNELS_CUDA_STREAM_CHUNKS_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/hopper/bulk_copy.cuh"
#include "kernels/cuda/hopper/mbarrier.cuh"
#include "kernels/cuda/hopper/warpgroup.cuh"

namespace dropless::kernels::cuda::streaming {

constexpr int kMaxStages = 8;
constexpr uint32_t kChunkTarget = 16 * 1024;  // input bytes per chunk
// The attribute every streaming kernel gets once: above any plan's shared memory.
constexpr int kSmemCap = 160 * 1024;

// Rows [0, rows) of `cols` columns; a chunk is rows [r0, r0 + nr) x columns [c0, c0 + width).
struct Plan {
  int64_t rows;  // rows the buffers hold (the live count may be lower, read on the device)
  int32_t cols;
  int32_t rows_per_chunk;
  int32_t seg_width;  // columns per segment; == cols for whole rows
  int32_t segs;       // segments per row
  int32_t stages;
  uint32_t in_chunk;   // stage bytes
  uint32_t out_chunk;  // output buffer bytes
};

// Whole rows when a row's input fits the chunk target, else segments of a multiple of
// `seg_multiple` columns; as many stages as fit `budget` bytes of shared memory with two output
// buffers (2 to kMaxStages).
inline Plan MakePlan(int64_t rows, int64_t cols, uint32_t in_bytes_per_col,
                     uint32_t out_bytes_per_col, uint32_t budget, int seg_multiple) {
  Plan p{};
  p.rows = rows;
  p.cols = static_cast<int32_t>(cols);
  const uint64_t row_in = uint64_t{in_bytes_per_col} * cols;
  if (row_in <= kChunkTarget) {
    p.rows_per_chunk = static_cast<int32_t>(kChunkTarget / row_in);
    p.seg_width = p.cols;
  } else {
    p.rows_per_chunk = 1;
    p.seg_width = std::max(seg_multiple, static_cast<int32_t>(kChunkTarget / in_bytes_per_col /
                                                              seg_multiple * seg_multiple));
  }
  p.segs = (p.cols + p.seg_width - 1) / p.seg_width;
  p.in_chunk = static_cast<uint32_t>(p.rows_per_chunk) * p.seg_width * in_bytes_per_col;
  p.out_chunk = static_cast<uint32_t>(p.rows_per_chunk) * p.seg_width * out_bytes_per_col;
  const int64_t fit = (int64_t{budget} - 2 * int64_t{p.out_chunk}) / p.in_chunk;
  p.stages = static_cast<int32_t>(std::clamp<int64_t>(fit, 2, kMaxStages));
  return p;
}

inline size_t SmemBytes(const Plan& p) {
  return size_t{p.in_chunk} * p.stages + 2 * size_t{p.out_chunk} + 2 * sizeof(uint64_t) * p.stages;
}

// Blocks resident at once for blocks of `threads` threads using `smem` bytes of shared memory.
inline int ResidentGrid(size_t smem, int threads) {
  const DeviceShape device = CurrentDeviceShape();
  const int by_smem =
      static_cast<int>(device.smem_per_multiprocessor / (smem + 1024));  // 1 KB a block
  return device.multiprocessors * std::max(1, std::min(by_smem, 2048 / threads));
}

struct Chunk {
  int64_t r0;
  int32_t nr;     // rows
  int32_t c0;     // first column of the segment
  int32_t width;  // columns of the segment
};

// Chunk indices stay below 2^31 (checked by Launch): 32-bit arithmetic, and no division at all
// for whole rows.
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
  k.width = min(p.seg_width, p.cols - k.c0);
  return k;
}

// The pipeline over rows [0, live). produce(chunk, stage, full) runs on the producer thread and
// must announce and issue the chunk's loads on `full`; consume(chunk, stage, out) runs on every
// consumer thread; store(chunk, out, lane) runs on each lane of consumer warp 0 and issues that
// lane's share of the bulk stores (each lane commits its own group).
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
    hopper::BarrierInitRing(full, empty, p.stages, 1, kConsumers / 32);
    hopper::BarrierInitFence();
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
        hopper::BarrierWait(&empty[s], phase ^ 1);
        produce(ChunkAt(c, p, live), stages + size_t{p.in_chunk} * s, &full[s]);
      }
    }
    return;
  }
  uint32_t i = 0;
  for (uint32_t c = blockIdx.x; c < chunks; c += gridDim.x, ++i, advance()) {
    uint8_t* const out = outs + size_t{p.out_chunk} * (i & 1);
    const Chunk k = ChunkAt(c, p, live);
    if (tid < 32) hopper::BulkWaitRead<1>();  // this lane's stores of chunk i - 2 have left `out`
    hopper::NamedBarrier(1, kConsumers);
    hopper::BarrierWait(&full[s], phase);
    consume(k, stages + size_t{p.in_chunk} * s, out);
    __syncwarp();
    if ((tid & 31) == 0) hopper::BarrierArrive(&empty[s]);
    hopper::FenceSharedForCopies();
    hopper::NamedBarrier(2, kConsumers);
    if (tid < 32) {
      store(k, out, tid);
      hopper::BulkCommit();
    }
  }
  if (tid < 32) hopper::BulkWaitAll();
}

// Copies rows [r0, r0 + nr) x columns [col, col + width) of a row-major matrix with `row`
// elements of T per row from or to a dense [nr][width] tile: one copy for whole rows.
template <typename T>
__device__ __forceinline__ void LoadRows(void* tile, const T* src, int64_t row, const Chunk& k,
                                         int32_t col, bool whole, uint64_t* bar) {
  const uint32_t bytes = static_cast<uint32_t>(k.width) * sizeof(T);
  if (whole) {
    hopper::BulkLoad(tile, src + k.r0 * row + col, bytes * k.nr, bar);
  } else {
    for (int r = 0; r < k.nr; ++r) {
      hopper::BulkLoad(static_cast<uint8_t*>(tile) + r * bytes, src + (k.r0 + r) * row + col, bytes,
                       bar);
    }
  }
}
template <typename T>
__device__ __forceinline__ void StoreRows(T* dst, const void* tile, int64_t row, const Chunk& k,
                                          int32_t col, bool whole) {
  const uint32_t bytes = static_cast<uint32_t>(k.width) * sizeof(T);
  if (whole) {
    hopper::BulkStore(dst + k.r0 * row + col, tile, bytes * k.nr);
  } else {
    for (int r = 0; r < k.nr; ++r) {
      hopper::BulkStore(dst + (k.r0 + r) * row + col, static_cast<const uint8_t*>(tile) + r * bytes,
                        bytes);
    }
  }
}

// Launches kKernel(plan, args...) with kThreads threads per block on a resident grid. kKernel is a
// template argument so that each kernel sets its shared-memory attribute once.
template <auto kKernel, int kThreads, class... Args>
absl::Status Launch(const char* name, const Plan& plan, Stream stream, Args... args) {
  static const cudaError_t allowed =
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemCap);
  if (allowed != cudaSuccess) return CudaStatus(allowed, name);
  const size_t smem = SmemBytes(plan);
  if (smem > static_cast<size_t>(kSmemCap)) {
    return absl::InvalidArgumentError("shape: a streaming chunk does not fit shared memory");
  }
  const int64_t row_chunks = (plan.rows + plan.rows_per_chunk - 1) / plan.rows_per_chunk;
  if (row_chunks * plan.segs >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError("rows: too many for one launch");
  }
  const int grid = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(row_chunks * plan.segs, ResidentGrid(smem, kThreads))));
  kKernel<<<grid, kThreads, smem, stream>>>(plan, args...);
  return LaunchStatus(name);
}

}  // namespace dropless::kernels::cuda::streaming

#endif  // DROPLESS_KERNELS_CUDA_STREAM_CHUNKS_CUH_
