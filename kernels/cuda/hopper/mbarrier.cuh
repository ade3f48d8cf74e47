// Shared-memory barriers (mbarrier, sm_90): the full / empty handshakes between a kernel's
// producers (bulk and TMA copies, which complete bytes on them) and its consumers. Part of the
// Hopper layer (README.md beside this file).
#ifndef DROPLESS_KERNELS_CUDA_HOPPER_MBARRIER_CUH_
#define DROPLESS_KERNELS_CUDA_HOPPER_MBARRIER_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/hopper/smem.cuh"

namespace dropless::kernels::hopper {

__device__ __forceinline__ void BarrierInit(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)), "r"(arrivals)
               : "memory");
}

// A ring of `stages` full / empty barrier pairs, full[s] and empty[s] initialized in turn (by one
// thread; BarrierInitFence and a block or cluster barrier follow): full[s] completes when stage s
// holds its data (`full_arrivals` arrivals and the bytes announced with them), empty[s] when its
// `empty_arrivals` consumers have released it.
__device__ __forceinline__ void BarrierInitRing(uint64_t* full, uint64_t* empty, int stages,
                                                uint32_t full_arrivals, uint32_t empty_arrivals) {
  for (int s = 0; s < stages; ++s) {
    BarrierInit(&full[s], full_arrivals);
    BarrierInit(&empty[s], empty_arrivals);
  }
}

// Makes initialized barriers visible to the other threads and to the copy engine (follow it with
// a block barrier, or a cluster barrier when other CTAs of the cluster arrive on them).
__device__ __forceinline__ void BarrierInitFence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void BarrierArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SmemAddr(bar)) : "memory");
}

// BarrierArrive by the lane whose `lane` is 0, through a predicate rather than a branch: a
// divergent path while a wgmma is in flight makes ptxas serialize every wgmma of the kernel
// (C7518).
__device__ __forceinline__ void BarrierArriveLane0(uint64_t* bar, int lane) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.eq.u32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, "
      "[%0];\n}\n" ::"r"(SmemAddr(bar)),
      "r"(lane)
      : "memory");
}

// Arrives on the barrier at `bar`'s offset in CTA `rank` of the cluster. Default (CTA-scope
// release) semantics: the arrival only says this warp's wgmmas have finished reading the stage.
// A cluster-scope release (.release.cluster) also waits for the thread's earlier global stores to
// reach L2, and cost the bf16 2 x 1 cluster kernel 40% (measured on an H200).
__device__ __forceinline__ void BarrierArriveCluster(uint64_t* bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(SmemAddr(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

// One arrival that also announces `bytes` of bulk / TMA copies completing on this barrier.
__device__ __forceinline__ void BarrierArriveExpectBytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddr(bar)),
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
      "}\n" ::"r"(SmemAddr(bar)),
      "r"(parity)
      : "memory");
}

}  // namespace dropless::kernels::hopper

#endif  // DROPLESS_KERNELS_CUDA_HOPPER_MBARRIER_CUH_
