// Warp specialization on Hopper: moving registers between the warpgroups of a CTA (setmaxnreg: the
// producer warpgroup gives registers up, the consumers take them) and named barriers over a subset
// of the CTA's warps. Part of the Hopper layer (README.md beside this file).
#ifndef DROPLESS_KERNELS_CUDA_HOPPER_WARPGROUP_CUH_
#define DROPLESS_KERNELS_CUDA_HOPPER_WARPGROUP_CUH_

#include <cuda_runtime.h>

namespace dropless::kernels::hopper {

// Every thread of the warpgroup executes it (.sync.aligned). kRegs: a multiple of 8 in [24, 256].
template <int kRegs>
__device__ __forceinline__ void WarpgroupRegDealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void WarpgroupRegAlloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// Barrier over `threads` threads (a multiple of 32) with id 1..15 (0 is __syncthreads).
__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace dropless::kernels::hopper

#endif  // DROPLESS_KERNELS_CUDA_HOPPER_WARPGROUP_CUH_
