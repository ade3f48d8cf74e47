// AdamW's update of one parameter as the engines compute it (worker/engine/cpu/adamw.h's formula in
// fp32, its step's scalars in fp64): the step's scalars, the stochastic rounding of bf16 moments,
// and on the device the element update, one IEEE fp32 operation per step in the CPU formula's order
// (no contraction into fused multiply-adds), so that every kernel that updates a parameter writes
// the CPU engine's bits. Shared by the CPU engine's AdamW (the rounding), the CUDA engine's
// (worker/engine/cuda/engine_kernels.cu) and the kernels that fuse the update with what reads the
// new value (fp8_block.h's AdamWQuantizeFp8BlockWeights).
#ifndef DROPLESS_KERNELS_ADAMW_H_
#define DROPLESS_KERNELS_ADAMW_H_

#include <cstdint>
#include <cstring>

#include "dropless/kernels/types.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#endif

namespace dropless::kernels {

// One step's scalars (decay = 1 - lr * weight_decay, step_size = lr, the bias corrections
// 1 / (1 - beta^t)) and the 1-based step number, computed once per step on the device.
struct AdamWStep {
  float beta1, beta2, eps, decay, step_size, m_correction, v_correction;
  int64_t step;
};

// Where a tensor's moments live: `m` and `v` point at fp32 elements, or at bf16 ones when `bf16`
// (the job's optimizer.moment_dtype). Each step computes the moments in fp32 and the update uses
// those values; bf16 moments are then stored stochastically rounded (BF16MomentBits below), with
// draws keyed by the element's place: `stream` names its flat parameter buffer (the engines'
// replicated 0, experts 1) and `first` the index there of the tensor's element 0.
struct AdamWMoments {
  void* m = nullptr;
  void* v = nullptr;
  bool bf16 = false;
  uint32_t stream = 0;
  int64_t first = 0;

  int element_bytes() const { return bf16 ? 2 : 4; }
  // The moments of the element `offset` elements further on.
  AdamWMoments At(int64_t offset) const {
    return AdamWMoments{static_cast<char*>(m) + offset * element_bytes(),
                        static_cast<char*>(v) + offset * element_bytes(), bf16, stream,
                        first + offset};
  }
};

// bf16 moments are rounded stochastically, not to nearest: with beta2 = 0.999 a step moves v by
// 0.1% of (g^2 - v), under half of bf16's spacing (0.2-0.4%) unless g^2 > ~3 v, so rounding to
// nearest would freeze v (it could grow on large gradients but never decay). Rounding up with
// probability equal to the dropped fraction keeps every moment unbiased. The draws are a hash of
// (stream, index, step), so the CPU and the CUDA engine, and a resumed run, round alike.
DROPLESS_KERNELS_HD inline uint32_t MixBits32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// 32 random bits for element `index` of buffer `stream` at `step`: the low 16 round its m, the
// high 16 its v. The key holds what the elements of one step, buffer and high index word share,
// so a kernel mixes it once for several elements and then once per element.
DROPLESS_KERNELS_HD inline uint32_t BF16MomentKey(uint32_t stream, uint32_t index_high,
                                                  int64_t step) {
  const uint32_t h = MixBits32(static_cast<uint32_t>(step) * 0x9e3779b9u ^ stream * 0x85ebca6bu);
  return MixBits32(h ^ index_high ^ 0x5bd1e995u);
}
DROPLESS_KERNELS_HD inline uint32_t BF16MomentBits(uint32_t key, uint32_t index_low) {
  return MixBits32(key ^ index_low);
}
DROPLESS_KERNELS_HD inline uint32_t BF16MomentBits(uint32_t stream, int64_t index, int64_t step) {
  const uint64_t i = static_cast<uint64_t>(index);
  return BF16MomentBits(BF16MomentKey(stream, static_cast<uint32_t>(i >> 32), step),
                        static_cast<uint32_t>(i));
}

// x rounded to a bf16 neighbour: away from zero when `random16` (0..65535) plus the 16 bits that
// bf16 drops reach 2^16, i.e. with probability (dropped bits) / 2^16. Infinities and NaNs pass
// unchanged. The result's low 16 bits are zero.
DROPLESS_KERNELS_HD inline float StochasticBf16(float x, uint32_t random16) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  u = (u + (random16 & 0xffffu)) & 0xffff0000u;
  std::memcpy(&x, &u, sizeof(u));
  return x;
}

#if defined(__CUDACC__)
// m, v and the returned parameter of one element.
__device__ __forceinline__ float AdamWElement(const AdamWStep& s, float g, float& m, float& v,
                                              float p) {
  m = __fadd_rn(__fmul_rn(s.beta1, m), __fmul_rn(__fsub_rn(1.0f, s.beta1), g));
  v = __fadd_rn(__fmul_rn(s.beta2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, s.beta2), g), g));
  const float update = __fdiv_rn(__fmul_rn(m, s.m_correction),
                                 __fadd_rn(__fsqrt_rn(__fmul_rn(v, s.v_correction)), s.eps));
  return __fsub_rn(__fmul_rn(p, s.decay), __fmul_rn(s.step_size, update));
}

// One moment element as fp32, and stored back: fp32 as is, bf16 from StochasticBf16's value
// (whose low 16 bits are zero) with the given random bits.
__device__ __forceinline__ float LoadMoment(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float LoadMoment(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void StoreMoment(float* p, int64_t i, float x, uint32_t) { p[i] = x; }
__device__ __forceinline__ uint16_t Bf16BitsOf(float rounded) {
  return static_cast<uint16_t>(__float_as_uint(rounded) >> 16);
}
__device__ __forceinline__ void StoreMoment(__nv_bfloat16* p, int64_t i, float x,
                                            uint32_t random16) {
  reinterpret_cast<uint16_t*>(p)[i] = Bf16BitsOf(StochasticBf16(x, random16));
}

// Element i of a tensor whose moments are `mv`, at the step of `s`: m then v stored (M: float or
// __nv_bfloat16, as mv.bf16 says).
template <typename M>
__device__ __forceinline__ void StoreMoments(const AdamWStep& s, const AdamWMoments& mv, int64_t i,
                                             float m, float v) {
  const uint32_t bits = sizeof(M) == 2 ? BF16MomentBits(mv.stream, mv.first + i, s.step) : 0u;
  StoreMoment(static_cast<M*>(mv.m), i, m, bits & 0xffffu);
  StoreMoment(static_cast<M*>(mv.v), i, v, bits >> 16);
}

// Moment elements i .. i + 3 (16-byte aligned for fp32, 8-byte for bf16).
__device__ __forceinline__ float4 LoadMomentFour(const float* p, int64_t i) {
  return *reinterpret_cast<const float4*>(p + i);
}
__device__ __forceinline__ float4 LoadMomentFour(const __nv_bfloat16* p, int64_t i) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p + i);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// Four bf16 values, rounded to nearest even, packed in the order of memory (low half first).
__device__ __forceinline__ uint2 PackBf16Four(const float4& x) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
  return make_uint2(*reinterpret_cast<const uint32_t*>(&lo),
                    *reinterpret_cast<const uint32_t*>(&hi));
}

// Moments of elements i .. i + 3, stored with vector stores.
__device__ __forceinline__ void StoreMomentsFour(const AdamWStep&, const AdamWMoments& mv,
                                                 int64_t i, const float4& m, const float4& v,
                                                 float*) {
  *reinterpret_cast<float4*>(static_cast<float*>(mv.m) + i) = m;
  *reinterpret_cast<float4*>(static_cast<float*>(mv.v) + i) = v;
}
__device__ __forceinline__ void StoreMomentsFour(const AdamWStep& s, const AdamWMoments& mv,
                                                 int64_t i, const float4& m, const float4& v,
                                                 __nv_bfloat16*) {
  // One key for the four unless their indices cross a multiple of 2^32.
  const uint64_t first = static_cast<uint64_t>(mv.first + i);
  uint32_t bits[4];
  if (static_cast<uint32_t>(first) <= 0xfffffffcu) {
    const uint32_t key = BF16MomentKey(mv.stream, static_cast<uint32_t>(first >> 32), s.step);
#pragma unroll
    for (int q = 0; q < 4; ++q) bits[q] = BF16MomentBits(key, static_cast<uint32_t>(first) + q);
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) bits[q] = BF16MomentBits(mv.stream, mv.first + i + q, s.step);
  }
  const uint32_t m01 = Bf16BitsOf(StochasticBf16(m.x, bits[0] & 0xffffu)) |
                       uint32_t{Bf16BitsOf(StochasticBf16(m.y, bits[1] & 0xffffu))} << 16;
  const uint32_t m23 = Bf16BitsOf(StochasticBf16(m.z, bits[2] & 0xffffu)) |
                       uint32_t{Bf16BitsOf(StochasticBf16(m.w, bits[3] & 0xffffu))} << 16;
  const uint32_t v01 = Bf16BitsOf(StochasticBf16(v.x, bits[0] >> 16)) |
                       uint32_t{Bf16BitsOf(StochasticBf16(v.y, bits[1] >> 16))} << 16;
  const uint32_t v23 = Bf16BitsOf(StochasticBf16(v.z, bits[2] >> 16)) |
                       uint32_t{Bf16BitsOf(StochasticBf16(v.w, bits[3] >> 16))} << 16;
  *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(mv.m) + i) = make_uint2(m01, m23);
  *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(mv.v) + i) = make_uint2(v01, v23);
}

// What the update of elements i .. i + 3 reads: their gradients, moments (as fp32) and masters.
struct AdamWFour {
  float4 g, m, v, p;
};

// Elements i .. i + 3 (16-byte aligned; the moments M: float or __nv_bfloat16, as mv.bf16 says)
// loaded with vector loads. Split from ApplyAdamWFour so that a kernel can have several groups'
// loads in flight before the first update's stores (which, for all the compiler knows, alias
// the later loads).
template <typename M>
__device__ __forceinline__ AdamWFour LoadAdamWFour(int64_t i, const float* grad, const float* param,
                                                   const AdamWMoments& mv) {
  return AdamWFour{
      *reinterpret_cast<const float4*>(grad + i), LoadMomentFour(static_cast<const M*>(mv.m), i),
      LoadMomentFour(static_cast<const M*>(mv.v), i), *reinterpret_cast<const float4*>(param + i)};
}

// The update of elements i .. i + 3 from what LoadAdamWFour read: moments and masters stored with
// vector stores; returns their bf16 values, rounded to nearest even (low half first, the order of
// memory).
template <typename M>
__device__ __forceinline__ uint2 ApplyAdamWFour(const AdamWStep& s, int64_t i, AdamWFour x,
                                                float* param, const AdamWMoments& mv) {
  x.p.x = AdamWElement(s, x.g.x, x.m.x, x.v.x, x.p.x);
  x.p.y = AdamWElement(s, x.g.y, x.m.y, x.v.y, x.p.y);
  x.p.z = AdamWElement(s, x.g.z, x.m.z, x.v.z, x.p.z);
  x.p.w = AdamWElement(s, x.g.w, x.m.w, x.v.w, x.p.w);
  StoreMomentsFour(s, mv, i, x.m, x.v, static_cast<M*>(nullptr));
  *reinterpret_cast<float4*>(param + i) = x.p;
  return PackBf16Four(x.p);
}

template <typename M>
__device__ __forceinline__ uint2 AdamWUpdateFour(const AdamWStep& s, int64_t i, const float* grad,
                                                 float* param, const AdamWMoments& mv) {
  return ApplyAdamWFour<M>(s, i, LoadAdamWFour<M>(i, grad, param, mv), param, mv);
}
#endif

}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_ADAMW_H_
