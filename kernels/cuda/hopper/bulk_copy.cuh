// One-dimensional bulk copies between global and shared memory (cp.async.bulk, sm_90), the bulk
// groups that stores (these and the TMA tensor stores) complete in, and the fence that orders
// shared-memory writes before the copies read them. The streaming kernels move whole contiguous
// row chunks through shared memory with them (stream_chunks.cuh): the copy engine keeps many
// kilobytes in flight per multiprocessor without a load instruction per 16 bytes. Part of the
// Hopper layer (README.md beside this file).
#ifndef DROPLESS_KERNELS_CUDA_HOPPER_BULK_COPY_CUH_
#define DROPLESS_KERNELS_CUDA_HOPPER_BULK_COPY_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/hopper/smem.cuh"

namespace dropless::kernels::hopper {

// Global -> shared, completing on `bar` (mbarrier.cuh). dst, src and bytes: multiples of 16.
__device__ __forceinline__ void BulkLoad(void* dst, const void* src, uint32_t bytes,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(SmemAddr(dst)),
      "l"(src), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
}

// Shared -> global in the thread's current bulk group. dst, src and bytes: multiples of 16. The
// writes to src must be ordered before it by FenceSharedForCopies and a barrier.
__device__ __forceinline__ void BulkStore(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst),
               "r"(SmemAddr(src)), "r"(bytes)
               : "memory");
}

// Closes the thread's current bulk group (its bulk and TMA stores).
__device__ __forceinline__ void BulkCommit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Until at most kPending of this thread's bulk groups still read their shared memory.
template <int kPending>
__device__ __forceinline__ void BulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
// Until every bulk group of this thread has completed.
__device__ __forceinline__ void BulkWaitAll() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Orders this thread's shared-memory writes (generic proxy) before later bulk / TMA copies that
// read them (async proxy).
__device__ __forceinline__ void FenceSharedForCopies() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

}  // namespace dropless::kernels::hopper

#endif  // DROPLESS_KERNELS_CUDA_HOPPER_BULK_COPY_CUH_
