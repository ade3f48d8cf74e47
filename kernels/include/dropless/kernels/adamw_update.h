// AdamW's element update on the device (adamw.h's step scalars and moments): one IEEE fp32
// operation per step in the CPU formula's order (no contraction into fused multiply-adds), so that
// every kernel that updates a parameter writes the CPU engine's bits. Used by the CUDA engine's
// AdamW (worker/engine/cuda/engine_kernels.cu) and the kernels that fuse the update with what
// produces the gradient or reads the new value (grouped_wgrad_adamw.h, fp8_block.h's
// AdamWQuantizeFp8BlockWeights). Kept apart from adamw.h so that the GEMM kernels, which include
// the contracts, do not recompile when the update changes.
#ifndef DROPLESS_KERNELS_ADAMW_UPDATE_H_
#define DROPLESS_KERNELS_ADAMW_UPDATE_H_

#if !defined(__CUDACC__)
#error "adamw_update.h is device code: include it from .cu files only"
#endif

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "dropless/kernels/adamw.h"

namespace dropless::kernels {

// m, v and the returned parameter of one element.
__device__ __forceinline__ float AdamWElement(const AdamWStep& s, float g, float& m, float& v,
                                              float p) {
  m = __fadd_rn(__fmul_rn(s.beta1, m), __fmul_rn(__fsub_rn(1.0f, s.beta1), g));
  v = __fadd_rn(__fmul_rn(s.beta2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, s.beta2), g), g));
  const float update = __fdiv_rn(__fmul_rn(m, s.m_correction),
                                 __fadd_rn(__fsqrt_rn(__fmul_rn(v, s.v_correction)), s.eps));
  return __fsub_rn(__fmul_rn(p, s.decay), __fmul_rn(s.step_size, update));
}

// One fp32 or bf16 element (a moment; a bf16 gradient) as fp32; a moment stored back: fp32 as is,
// bf16 from StochasticBf16's value (whose low 16 bits are zero) with the given random bits.
__device__ __forceinline__ float LoadFloat(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float LoadFloat(const __nv_bfloat16* p, int64_t i) {
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

// Elements i .. i + 3 as fp32 (moments, gradients; 16-byte aligned for fp32, 8-byte for bf16).
__device__ __forceinline__ float4 LoadFloatFour(const float* p, int64_t i) {
  return *reinterpret_cast<const float4*>(p + i);
}
__device__ __forceinline__ float4 LoadFloatFour(const __nv_bfloat16* p, int64_t i) {
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

// The random draws of the bf16 moments of elements first + j, j <= span, of buffer `stream` at
// `step` (BF16MomentBits): one key mixed once for all of them unless their indices cross a
// multiple of 2^32.
class MomentDraws {
 public:
  __device__ __forceinline__ MomentDraws(uint32_t stream, uint64_t first, int64_t step,
                                         uint32_t span)
      : stream_(stream),
        first_(first),
        step_(step),
        one_key_(static_cast<uint32_t>(first) <= 0xffffffffu - span),
        key_(BF16MomentKey(stream, static_cast<uint32_t>(first >> 32), step)) {}
  __device__ __forceinline__ uint32_t operator()(uint32_t j) const {
    return one_key_ ? BF16MomentBits(key_, static_cast<uint32_t>(first_) + j)
                    : BF16MomentBits(stream_, static_cast<int64_t>(first_ + j), step_);
  }

 private:
  uint32_t stream_;
  uint64_t first_;
  int64_t step_;
  bool one_key_;
  uint32_t key_;
};

// The moments of two adjacent elements rounded stochastically with their draws (m with the low
// 16 bits, v with the high 16) and packed low element first: {m pair, v pair}.
__device__ __forceinline__ uint2 StochasticMomentPairs(float m0, float m1, float v0, float v1,
                                                       uint32_t draw0, uint32_t draw1) {
  return make_uint2(Bf16BitsOf(StochasticBf16(m0, draw0 & 0xffffu)) |
                        uint32_t{Bf16BitsOf(StochasticBf16(m1, draw1 & 0xffffu))} << 16,
                    Bf16BitsOf(StochasticBf16(v0, draw0 >> 16)) |
                        uint32_t{Bf16BitsOf(StochasticBf16(v1, draw1 >> 16))} << 16);
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
  const MomentDraws draws(mv.stream, static_cast<uint64_t>(mv.first + i), s.step, 3);
  const uint2 lo = StochasticMomentPairs(m.x, m.y, v.x, v.y, draws(0), draws(1));
  const uint2 hi = StochasticMomentPairs(m.z, m.w, v.z, v.w, draws(2), draws(3));
  *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(mv.m) + i) = make_uint2(lo.x, hi.x);
  *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(mv.v) + i) = make_uint2(lo.y, hi.y);
}

// What the update of elements i .. i + 3 reads: their gradients, moments (as fp32) and masters.
struct AdamWFour {
  float4 g, m, v, p;
};

// Elements i .. i + 3 (the moments M and the gradient G: float or __nv_bfloat16, as mv.bf16
// and the caller say; aligned as LoadFloatFour needs) loaded with vector loads. Split from
// ApplyAdamWFour so that a kernel can have several groups' loads in flight before the first
// update's stores (which, for all the compiler knows, alias the later loads).
template <typename M, typename G>
__device__ __forceinline__ AdamWFour LoadAdamWFour(int64_t i, const G* grad, const float* param,
                                                   const AdamWMoments& mv) {
  return AdamWFour{LoadFloatFour(grad, i), LoadFloatFour(static_cast<const M*>(mv.m), i),
                   LoadFloatFour(static_cast<const M*>(mv.v), i),
                   *reinterpret_cast<const float4*>(param + i)};
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

template <typename M, typename G>
__device__ __forceinline__ uint2 AdamWUpdateFour(const AdamWStep& s, int64_t i, const G* grad,
                                                 float* param, const AdamWMoments& mv) {
  return ApplyAdamWFour<M>(s, i, LoadAdamWFour<M>(i, grad, param, mv), param, mv);
}
}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_ADAMW_UPDATE_H_
