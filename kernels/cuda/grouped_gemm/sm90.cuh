// What the own Hopper GEMM kernels share (the MXFP8 kernels in mxfp8/, the bf16 fixed-map kernels
// in tma/): shared-window addresses, TMA tile copies completing on an mbarrier, the wgmma fences,
// and the driver's tensor-map encoder.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_SM90_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_SM90_CUH_

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dropless::kernels::sm90 {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One TMA box of a 2-D / 3-D tensor map at the given coordinates (innermost first) into shared
// memory, its bytes counted on `bar`.
__device__ __forceinline__ void TmaLoad2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0,
                                          int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, "
      "%4}], [%2];" ::"r"(SmemAddr(dst)),
      "l"(map), "r"(SmemAddr(bar)), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void TmaLoad3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0,
                                          int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, "
      "%4, %5}], [%2];" ::"r"(SmemAddr(dst)),
      "l"(map), "r"(SmemAddr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no libcuda link); null when the
// driver lacks it.
inline PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

}  // namespace dropless::kernels::sm90

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_SM90_CUH_
