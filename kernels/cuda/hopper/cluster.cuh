// Thread-block clusters (sm_90): the CTA's rank in its cluster and the barrier over the cluster.
// Part of the Hopper layer (README.md beside this file).
#ifndef DROPLESS_KERNELS_CUDA_HOPPER_CLUSTER_CUH_
#define DROPLESS_KERNELS_CUDA_HOPPER_CLUSTER_CUH_

#include <cuda_runtime.h>

#include <cstdint>

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

}  // namespace dropless::kernels::hopper

#endif  // DROPLESS_KERNELS_CUDA_HOPPER_CLUSTER_CUH_
