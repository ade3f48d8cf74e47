// Tensor-map (TMA) copies on Hopper: boxes of a 2-D / 3-D tensor map into shared memory,
// completing bytes on an mbarrier (mbarrier.cuh), one of them multicast to the CTAs of a cluster;
// the 2-D store from shared memory in a bulk group (bulk_copy.cuh); and the driver's tensor-map
// encoder for the host side. Part of the Hopper layer (README.md beside this file).
#ifndef DROPLESS_KERNELS_CUDA_HOPPER_TMA_CUH_
#define DROPLESS_KERNELS_CUDA_HOPPER_TMA_CUH_

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/hopper/smem.cuh"

namespace dropless::kernels::hopper {

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
// The same copy, written to the same shared-memory offset of every CTA in `mask` (and completing
// bytes on each one's barrier at the same offset).
__device__ __forceinline__ void TmaLoad3dMulticast(void* dst, const CUtensorMap* map, uint64_t* bar,
                                                   int c0, int c1, int c2, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster [%0], [%1, {%3, %4, %5}], [%2], %6;" ::"r"(SmemAddr(dst)),
      "l"(map), "r"(SmemAddr(bar)), "r"(c0), "r"(c1), "r"(c2), "h"(mask)
      : "memory");
}

// One box from shared memory to the tensor at (c0, c1), in the thread's current bulk group (close
// it with BulkCommit; the writes to src must be ordered before it by FenceSharedForCopies).
__device__ __forceinline__ void TmaStore2d(const CUtensorMap* map, const void* src, int c0,
                                           int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(map),
      "r"(c0), "r"(c1), "r"(SmemAddr(src))
      : "memory");
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

}  // namespace dropless::kernels::hopper

#endif  // DROPLESS_KERNELS_CUDA_HOPPER_TMA_CUH_
