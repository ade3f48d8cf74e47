// Shared memory through the shared window (sm_90): the 32-bit shared addresses that the PTX shared
// instructions, TMA, mbarriers and wgmma descriptors take, the kernel's dynamic shared memory
// aligned for swizzled tiles, and loads / stores through that window. Part of the Hopper layer
// (README.md beside this file).
#ifndef DROPLESS_KERNELS_CUDA_HOPPER_SMEM_CUH_
#define DROPLESS_KERNELS_CUDA_HOPPER_SMEM_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace dropless::kernels::hopper {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The kernel's dynamic shared memory from its first 1024-byte boundary: 128-byte-swizzled TMA
// boxes and the wgmma descriptors that read them need 1024-byte-aligned tiles (the launch asks
// for 1024 bytes of slack).
__device__ __forceinline__ uint8_t* AlignedDynamicSmem() {
  extern __shared__ uint8_t smem_raw[];
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                    ~static_cast<uintptr_t>(1023));
}

// Loads and stores at a shared-window address (a generic pointer that reached a helper would
// otherwise compile to generic loads, which wait on the long scoreboard). The loads have no memory
// clobber: the compiler may move other memory accesses across them.
__device__ __forceinline__ float LdsF32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ float4 LdsV4F32(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr));
  return v;
}
__device__ __forceinline__ float2 LdsV2F32(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint4 LdsV4U32(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}
__device__ __forceinline__ void StsF32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ void StsV2F32(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void StsV4F32(uint32_t addr, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
}
__device__ __forceinline__ void StsB32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
// 16 zero bytes (one register for all four words).
__device__ __forceinline__ void StsZero16(uint32_t addr) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(addr), "r"(0) : "memory");
}

}  // namespace dropless::kernels::hopper

#endif  // DROPLESS_KERNELS_CUDA_HOPPER_SMEM_CUH_
