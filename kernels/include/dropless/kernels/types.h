// Types shared by every kernel contract in kernels/include/dropless/kernels/.
//
// These headers compile without the CUDA toolkit: the CPU references (dropless_kernels_cpu, built
// everywhere) and the CUDA kernels (dropless_kernels_cuda) share one signature per kernel, the CUDA
// one taking a trailing Stream. Device buffers of __nv_bfloat16 are passed as Bf16 (same size,
// alignment and bits; kernels/cuda static_asserts it); cudaStream_t converts to Stream implicitly.
#ifndef DROPLESS_KERNELS_TYPES_H_
#define DROPLESS_KERNELS_TYPES_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DROPLESS_KERNELS_HD __host__ __device__
#else
#define DROPLESS_KERNELS_HD
#endif

// The CUDA runtime spells cudaStream_t as `struct CUstream_st*`; naming the struct here keeps the
// contracts free of CUDA headers while accepting a cudaStream_t argument unchanged.
struct CUstream_st;

namespace dropless::kernels {

using Stream = CUstream_st*;

// bfloat16 storage: the upper 16 bits of an IEEE-754 binary32.
struct alignas(2) Bf16 {
  uint16_t bits;
};
static_assert(sizeof(Bf16) == 2, "Bf16 must be two bytes");

DROPLESS_KERNELS_HD inline float Bf16ToFloat(Bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Round to nearest, ties to even (what __float2bfloat16_rn does); a NaN stays a (quiet) NaN.
DROPLESS_KERNELS_HD inline Bf16 FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return Bf16{static_cast<uint16_t>(u >> 16)};
}

}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_TYPES_H_
