// The arithmetic of one fp8-block tile on the device (fp8_block.h's scale and rounding rules, one
// IEEE fp32 operation per step, so the kernels produce the CPU references' bits): the tile's amax
// from bf16 bit patterns, its scale and inverse, and four elements to E4M3. Shared by the
// quantizers (fp8_block.cu) and the kernels that quantize what they produce (swiglu.cu).
#ifndef DROPLESS_KERNELS_CUDA_FP8_BLOCK_MATH_CUH_
#define DROPLESS_KERNELS_CUDA_FP8_BLOCK_MATH_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "dropless/kernels/fp8_block.h"
#include "kernels/cuda/device_utils.cuh"

namespace dropless::kernels::cuda::fp8_block_math {

// Largest |bf16| as its bit pattern (NaN > Inf > finite in integer order), to a float: NaN or Inf
// stays non-finite, so max never drops a NaN the way fmaxf would.
__device__ __forceinline__ float AmaxFromBits(uint32_t bits) { return __uint_as_float(bits << 16); }

struct DeviceScale {
  float scale;
  float inverse;
};

// fp8_block.h's Fp8BlockScaleForAmax, one IEEE fp32 operation per step.
__device__ __forceinline__ DeviceScale ScaleForAmax(float amax, bool pow2) {
  if (!isfinite(amax)) {
    const float nan = __uint_as_float(0x7fc00000u);
    return {nan, nan};
  }
  const float a = fmaxf(amax, kFp8BlockMinAmax);
  if (!pow2) return {__fdiv_rn(a, 448.0f), __fdiv_rn(448.0f, a)};
  int ex = 0;
  const float m = frexpf(a, &ex);
  const int e = m <= 0.875f ? ex - 9 : ex - 8;  // in [-108, 120]: both powers are normal floats
  return {__uint_as_float(static_cast<uint32_t>(127 + e) << 23),
          __uint_as_float(static_cast<uint32_t>(127 - e) << 23)};
}

// Four values (as two bf16 pairs) times `inverse`, to four E4M3 bytes (low byte first). A NaN
// inverse (non-finite tile) gives 0x7F everywhere.
__device__ __forceinline__ uint32_t QuantizeFour(uint32_t w0, uint32_t w1, float inverse) {
  if (isnan(inverse)) return 0x7f7f7f7fu;
  const uint32_t lo = detail::E4M3x2(__fmul_rn(detail::BfLo(w0), inverse),
                                     __fmul_rn(detail::BfHi(w0), inverse));
  const uint32_t hi = detail::E4M3x2(__fmul_rn(detail::BfLo(w1), inverse),
                                     __fmul_rn(detail::BfHi(w1), inverse));
  return lo | (hi << 16);
}

__device__ __forceinline__ uint32_t MagnitudeMax(uint32_t a, uint32_t w) {
  return __vmaxu2(a, w & 0x7fff7fffu);
}

__device__ __forceinline__ uint32_t WarpMaxBits(uint32_t bits) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) bits = max(bits, __shfl_xor_sync(detail::kFullMask, bits, o));
  return bits;
}

}  // namespace dropless::kernels::cuda::fp8_block_math

#endif  // DROPLESS_KERNELS_CUDA_FP8_BLOCK_MATH_CUH_
