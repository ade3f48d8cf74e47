// MXFP8 elements as exact bf16 values on the device (sm_90a): what the bf16-core MXFP8 grouped GEMM
// (grouped_gemm/mxfp8/mx_core_kernel.cuh) does to its A operand in registers, and what
// cuda::MxWeightImage (mx_weight_image.cu) does to a weight operand once per update.
//
// An E4M3 element P with E8M0 scale byte b stands for P * 2^(b - 127). E4M3 has 3 mantissa bits
// and bf16 7, and bf16 has fp32's exponent range, so that value is a bf16 number whenever it is at
// least 2^-133 in magnitude (bf16's smallest subnormal; only a block scale of 2^-124 or below can
// go under it): the conversion below is exact, and bf16 x bf16 products on the tensor cores are
// exact in their fp32 accumulators. A NaN scale (0xFF) gives NaN; the quantizer writes NaN elements
// only into blocks with a NaN scale (mxfp8.h).
//
// How: the E4M3 byte s.eeee.mmm placed as the bf16 bit pattern s.000eeee.mmm0000 is the element
// times 2^-120, subnormals included (a normal 2^(e-7) (1 + m/8) becomes 2^(e-127) (1 + m/8); a
// subnormal m 2^-9 becomes bf16's subnormal 16 m 2^-133 = m 2^-129). One byte permute (with sign
// replication), one shift and one mask make two such bf16 values; one bf16x2 multiply by
// 2^(b - 7) = 2^120 * 2^(b - 127) scales them. 2^(b - 7) is a bf16 number for b <= 134; larger
// scales (blocks of magnitude 2^16 and up) take a second multiply (2^120, then 2^(b - 127)).
#ifndef DROPLESS_KERNELS_CUDA_MX_BF16_CUH_
#define DROPLESS_KERNELS_CUDA_MX_BF16_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dropless::kernels::mxbf16 {

// The bf16x2 factors of one scale byte: value = (pattern * first) * second, where second is 1.0
// unless the scale needs two multiplies (Factors::twice).
struct Factors {
  uint32_t first;   // bf16x2, both halves equal
  uint32_t second;  // bf16x2
  bool twice;
};

__device__ __forceinline__ Factors FactorsOf(uint32_t scale) {
  constexpr uint32_t kOne = 0x3F80u, kNan = 0x7FC0u, k2Pow120 = (120u + 127u) << 7;
  uint32_t first, second = kOne;
  bool twice = false;
  if (scale == 0xFFu) {
    first = kNan;
  } else if (scale <= 134u) {
    first = (scale + 120u) << 7;  // 2^(b - 7)
  } else {
    first = k2Pow120;
    second = scale << 7;  // 2^(b - 127)
    twice = true;
  }
  return {first | (first << 16), second | (second << 16), twice};
}

// Bytes lo_byte and lo_byte + 1 of x (E4M3) as bf16x2 patterns worth 2^-120 times the elements
// (the lower byte in the lower half). kHigh: bytes 2 and 3, else 0 and 1.
template <bool kHigh>
__device__ __forceinline__ uint32_t E4m3PairPattern(uint32_t x) {
  uint32_t t;
  // Result bytes: element, its sign replicated, next element, its sign replicated.
  if constexpr (kHigh) {
    asm("prmt.b32 %0, %1, 0, 0xB3A2;" : "=r"(t) : "r"(x));
  } else {
    asm("prmt.b32 %0, %1, 0, 0x9180;" : "=r"(t) : "r"(x));
  }
  return (t << 4) & 0x87F087F0u;
}

__device__ __forceinline__ uint32_t MulBf16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// Two E4M3 elements (bytes of x, see E4m3PairPattern) as exact bf16x2 values under one scale.
template <bool kHigh>
__device__ __forceinline__ uint32_t E4m3PairToBf16(uint32_t x, const Factors& f) {
  uint32_t v = MulBf16x2(E4m3PairPattern<kHigh>(x), f.first);
  if (f.twice) v = MulBf16x2(v, f.second);
  return v;
}

}  // namespace dropless::kernels::mxbf16

#endif  // DROPLESS_KERNELS_CUDA_MX_BF16_CUH_
