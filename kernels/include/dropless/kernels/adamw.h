// AdamW's update of one parameter as the engines compute it (worker/engine/cpu/adamw.h's formula in
// fp32, its step's scalars in fp64): the step's scalars, and on the device the element update, one
// IEEE fp32 operation per step in the CPU formula's order (no contraction into fused
// multiply-adds), so that every kernel that updates a parameter writes the CPU engine's bits.
// Shared by the CUDA engine's AdamW (worker/engine/cuda/engine_kernels.cu) and the kernels that
// fuse the update with what reads the new value (fp8_block.h's AdamWQuantizeFp8BlockWeights).
#ifndef DROPLESS_KERNELS_ADAMW_H_
#define DROPLESS_KERNELS_ADAMW_H_

#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#endif

namespace dropless::kernels {

// One step's scalars (decay = 1 - lr * weight_decay, step_size = lr, the bias corrections
// 1 / (1 - beta^t)), computed once per step on the device.
struct AdamWStep {
  float beta1, beta2, eps, decay, step_size, m_correction, v_correction;
};

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

// Elements i .. i + 3 (16-byte aligned) updated with 16-byte loads and stores; returns their bf16
// values, rounded to nearest even (low half first, the order of memory).
__device__ __forceinline__ uint2 AdamWUpdateFour(const AdamWStep& s, int64_t i, const float* grad,
                                                 float* param, float* m_state, float* v_state) {
  const float4 g = *reinterpret_cast<const float4*>(grad + i);
  float4 m = *reinterpret_cast<const float4*>(m_state + i);
  float4 v = *reinterpret_cast<const float4*>(v_state + i);
  float4 p = *reinterpret_cast<const float4*>(param + i);
  p.x = AdamWElement(s, g.x, m.x, v.x, p.x);
  p.y = AdamWElement(s, g.y, m.y, v.y, p.y);
  p.z = AdamWElement(s, g.z, m.z, v.z, p.z);
  p.w = AdamWElement(s, g.w, m.w, v.w, p.w);
  *reinterpret_cast<float4*>(m_state + i) = m;
  *reinterpret_cast<float4*>(v_state + i) = v;
  *reinterpret_cast<float4*>(param + i) = p;
  const __nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y), hi = __floats2bfloat162_rn(p.z, p.w);
  return make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
}
#endif

}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_ADAMW_H_
