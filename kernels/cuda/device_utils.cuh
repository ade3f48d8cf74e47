// Device helpers shared by the kernel families: 16-byte bf16 vectors, the MXFP8 block math (bit
// for bit the host reference in mxfp8.h), and warp reductions.
#ifndef DROPLESS_KERNELS_CUDA_DEVICE_UTILS_CUH_
#define DROPLESS_KERNELS_CUDA_DEVICE_UTILS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "dropless/kernels/mxfp8.h"
#include "dropless/kernels/types.h"

namespace dropless::kernels::cuda::detail {

static_assert(sizeof(__nv_bfloat16) == sizeof(Bf16) && alignof(__nv_bfloat16) == alignof(Bf16),
              "Bf16 must be layout-compatible with __nv_bfloat16");

constexpr unsigned kFullMask = 0xffffffffu;

inline int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// ---- 8 x bf16 in one 16-byte vector ----

__device__ __forceinline__ uint4 LoadVec(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}
// For data read exactly once: skip L1.
__device__ __forceinline__ uint4 LoadVecStreaming(const void* p) {
  return __ldcs(reinterpret_cast<const uint4*>(p));
}
// For data read exactly once: skip L1, and on an L2 miss fetch the whole 256-byte DRAM granule
// (the neighbouring lanes' and passes' bytes arrive with one request).
__device__ __forceinline__ uint4 LoadVecStreaming256(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
__device__ __forceinline__ void StoreVec(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }

// Blocks of `kernel` (with `threads` and `smem` bytes) that fit on the current device at once.
template <typename Kernel>
inline int ResidentBlocks(Kernel kernel, int threads, size_t smem) {
  int per_sm = 0, device = 0, sms = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess ||
      cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return per_sm * sms;
}

// ---- Asynchronous global -> shared copies (cp.async, sm_80+) ----

// Copies 16 bytes to shared memory, or writes 16 zero bytes when !valid (src is then not read).
// The L2 prefetch hint fetches the whole 256-byte DRAM granule on a miss.
__device__ __forceinline__ void CpAsync16(void* smem, const void* src, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ float BfLo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float BfHi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ void Unpack8(uint4 v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = BfLo(w[i]);
    f[2 * i + 1] = BfHi(w[i]);
  }
}

__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint4 Pack8(const float (&f)[8]) {
  return make_uint4(PackBf16x2(f[0], f[1]), PackBf16x2(f[2], f[3]), PackBf16x2(f[4], f[5]),
                    PackBf16x2(f[6], f[7]));
}

// ---- MXFP8 block math ----

// Largest |bf16| bit pattern among the 8 values: for bf16, magnitude order is integer order of the
// bits without the sign, and NaN > Inf > every finite value.
__device__ __forceinline__ uint32_t AbsMaxBits8(uint4 v) {
  uint32_t m = __vmaxu2(__vmaxu2(v.x & 0x7fff7fffu, v.y & 0x7fff7fffu),
                        __vmaxu2(v.z & 0x7fff7fffu, v.w & 0x7fff7fffu));
  return max(m & 0xffffu, m >> 16);
}

// mxfp8.h's E8M0ScaleForAmax: ceil(log2(amax / 448)) + 127, clamped to [0, 246].
__device__ __forceinline__ uint32_t ScaleByteForAmaxBits(uint32_t amax_bits) {
  if (amax_bits >= 0x7f80u) return kE8M0Nan;
  const int biased = static_cast<int>(amax_bits >> 7) - 8 + ((amax_bits & 0x7fu) > 96u ? 1 : 0);
  return static_cast<uint32_t>(min(max(biased, 0), 246));
}

// 1 / X = 2^(127 - b): the binary32 with exponent field 254 - b (b <= 246 for finite blocks).
__device__ __forceinline__ float InverseScale(uint32_t scale_byte) {
  return __uint_as_float((254u - scale_byte) << 23);
}

// Two floats to two E4M3 bytes (low byte = lo): round to nearest even, saturate to +-448.
__device__ __forceinline__ uint32_t E4M3x2(float lo, float hi) {
  return static_cast<uint32_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

// 8 bf16 values scaled by inverse_scale, as 8 E4M3 bytes; a NaN block gives 0x7F everywhere.
__device__ __forceinline__ uint2 QuantizeE4M3x8(uint4 v, uint32_t scale_byte) {
  if (scale_byte == kE8M0Nan) return make_uint2(0x7f7f7f7fu, 0x7f7f7f7fu);
  const float inv = InverseScale(scale_byte);
  float f[8];
  Unpack8(v, f);
  const uint32_t b01 = E4M3x2(f[0] * inv, f[1] * inv);
  const uint32_t b23 = E4M3x2(f[2] * inv, f[3] * inv);
  const uint32_t b45 = E4M3x2(f[4] * inv, f[5] * inv);
  const uint32_t b67 = E4M3x2(f[6] * inv, f[7] * inv);
  return make_uint2(b01 | (b23 << 16), b45 | (b67 << 16));
}

// Row-wise MXFP8 of 32 consecutive values held as 8 per lane by 4 consecutive lanes (lane % 4 = 0
// holds the first 8). Every lane of the warp must call it (shuffles over the full mask).
struct MxQuad {
  uint2 data;
  uint32_t scale;
};
__device__ __forceinline__ MxQuad QuantizeMxQuad(uint4 v) {
  uint32_t amax = AbsMaxBits8(v);
  amax = max(amax, __shfl_xor_sync(kFullMask, amax, 1));
  amax = max(amax, __shfl_xor_sync(kFullMask, amax, 2));
  const uint32_t scale = ScaleByteForAmaxBits(amax);
  return {QuantizeE4M3x8(v, scale), scale};
}

// Row-wise MXFP8 of 32 consecutive values held as 16 per lane (two vectors) by 2 consecutive lanes
// (even lane first): one 16-byte store of E4M3 per lane. Every lane of the warp must call it.
struct MxPair {
  uint4 data;
  uint32_t scale;
};
__device__ __forceinline__ MxPair QuantizeMxPair(uint4 a, uint4 b) {
  uint32_t amax = max(AbsMaxBits8(a), AbsMaxBits8(b));
  amax = max(amax, __shfl_xor_sync(kFullMask, amax, 1));
  const uint32_t scale = ScaleByteForAmaxBits(amax);
  const uint2 lo = QuantizeE4M3x8(a, scale), hi = QuantizeE4M3x8(b, scale);
  return {make_uint4(lo.x, lo.y, hi.x, hi.y), scale};
}

// ---- warp reductions ----

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

}  // namespace dropless::kernels::cuda::detail

#endif  // DROPLESS_KERNELS_CUDA_DEVICE_UTILS_CUH_
