// AdamW as the engines compute it (worker/engine/cpu/adamw.h's formula in fp32, its step's scalars
// in fp64): the step's scalars, where a tensor's moments live, and the stochastic rounding of bf16
// moments, which the CPU engine's AdamW and the device update (adamw_update.h) share.
#ifndef DROPLESS_KERNELS_ADAMW_H_
#define DROPLESS_KERNELS_ADAMW_H_

#include <cstdint>
#include <cstring>

#include "dropless/kernels/types.h"

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
// replicated 0, experts 1) and `first` the index there of the tensor's element 0, in the
// single-rank layout (the same for every ep/dp layout: MoeParameterLayout::ExpertRuns).
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
// bf16 drops reach 2^16, i.e. with probability (dropped bits) / 2^16. A finite x never rounds to
// infinity (bf16's largest finite value instead); infinities stay, NaNs become quiet NaNs (as
// FloatToBf16 makes them). The result's low 16 bits are zero.
DROPLESS_KERNELS_HD inline float StochasticBf16(float x, uint32_t random16) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  if ((u & 0x7f800000u) == 0x7f800000u) {
    if ((u & 0x007fffffu) != 0) u |= 0x00400000u;  // NaN: quiet, its payload's top bits kept
    u &= 0xffff0000u;
  } else {
    u = (u + (random16 & 0xffffu)) & 0xffff0000u;
    if ((u & 0x7f800000u) == 0x7f800000u) u = (u & 0x80000000u) | 0x7f7f0000u;
  }
  std::memcpy(&x, &u, sizeof(u));
  return x;
}

// A moment restored into bf16 from an fp32 checkpoint: x rounded to the nearest bf16, ties to
// even, with StochasticBf16's edges (a finite x stays finite; NaNs become quiet).
DROPLESS_KERNELS_HD inline float NearestBf16Moment(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return StochasticBf16(x, 0x7fffu + ((u >> 16) & 1u));
}

}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_ADAMW_H_
