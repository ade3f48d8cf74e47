// One-dimensional bulk copies between global and shared memory (cp.async.bulk, sm_90) and the
// shared-memory barriers (mbarrier) that track them: the building blocks of the streaming kernels
// that move whole contiguous row chunks through shared memory (swiglu.cu). The copy engine keeps
// many kilobytes in flight per multiprocessor without a load instruction per 16 bytes.
#ifndef DROPLESS_KERNELS_CUDA_BULK_COPY_CUH_
#define DROPLESS_KERNELS_CUDA_BULK_COPY_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace dropless::kernels::cuda::bulk {

__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void BarrierInit(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddress(bar)), "r"(arrivals)
               : "memory");
}

// Makes initialized barriers visible to the other threads and to the copy engine (follow it with
// a block barrier).
__device__ __forceinline__ void BarrierInitFence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void BarrierArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SmemAddress(bar)) : "memory");
}

// One arrival that also announces `bytes` of bulk copies completing on this barrier.
__device__ __forceinline__ void BarrierArriveExpectBytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddress(bar)),
               "r"(bytes)
               : "memory");
}

// Waits until the barrier's phase of the given parity has completed. A freshly initialized
// barrier counts as having completed the phase of parity 1.
__device__ __forceinline__ void BarrierWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(SmemAddress(bar)),
      "r"(parity)
      : "memory");
}

// Global -> shared, completing on `bar`. dst, src and bytes: multiples of 16.
__device__ __forceinline__ void Load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(SmemAddress(dst)),
      "l"(src), "r"(bytes), "r"(SmemAddress(bar))
      : "memory");
}

// Shared -> global in the thread's current bulk group. dst, src and bytes: multiples of 16. The
// writes to src must be ordered before it by FenceSharedForCopies and a barrier.
__device__ __forceinline__ void Store(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst),
               "r"(SmemAddress(src)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void Commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Until at most kPending of this thread's bulk groups still read their shared memory.
template <int kPending>
__device__ __forceinline__ void WaitRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
// Until every bulk group of this thread has completed.
__device__ __forceinline__ void WaitAll() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Orders this thread's shared-memory writes before later bulk copies that read them.
__device__ __forceinline__ void FenceSharedForCopies() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Barrier over `threads` threads (a multiple of 32) with id 1..15 (0 is __syncthreads).
__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace dropless::kernels::cuda::bulk

#endif  // DROPLESS_KERNELS_CUDA_BULK_COPY_CUH_
