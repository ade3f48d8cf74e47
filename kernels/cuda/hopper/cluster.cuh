// Thread-block clusters (sm_90): the CTA's rank in its cluster, the barrier over the cluster, and
// the prologue of a barrier ring that a cluster's consumers arrive on.
// Part of the Hopper layer (README.md beside this file).
#ifndef DROPLESS_KERNELS_CUDA_HOPPER_CLUSTER_CUH_
#define DROPLESS_KERNELS_CUDA_HOPPER_CLUSTER_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/hopper/mbarrier.cuh"

namespace dropless::kernels::hopper {

__device__ __forceinline__ uint32_t ClusterRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster (each warp converged: the barrier is .aligned); the
// release / acquire orders the CTAs' shared-memory writes (barrier initialization) before it.
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
}

// A producer / consumer ring's prologue, for every thread of the CTA: thread 0 initializes the
// `stages` full / empty barrier pairs (BarrierInitRing) and fences them; then the CTA (kCluster 1)
// or the whole cluster synchronizes, so that no thread, and no other CTA of the cluster arriving
// on this CTA's empty barriers, uses them before they are initialized.
template <int kCluster>
__device__ __forceinline__ void InitRingForCluster(uint64_t* full, uint64_t* empty, int stages,
                                                   uint32_t full_arrivals,
                                                   uint32_t empty_arrivals) {
  if (threadIdx.x == 0) {
    BarrierInitRing(full, empty, stages, full_arrivals, empty_arrivals);
    BarrierInitFence();
  }
  if constexpr (kCluster > 1) {
    ClusterSync();
  } else {
    __syncthreads();
  }
}

}  // namespace dropless::kernels::hopper

#endif  // DROPLESS_KERNELS_CUDA_HOPPER_CLUSTER_CUH_
