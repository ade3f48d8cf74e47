// Element types of the CPU references (kernels/cpu). Each reference is one template over its
// element type T:
//   Bf16    the CUDA kernels' storage: math in fp32, one rounding to bf16 per output, so the
//           reference checks the CUDA kernel (tests/gpu) with the kernel's own formulas;
//   float   the CPU engine (worker/engine/cpu): the same formulas in fp32, no rounding to bf16;
//   double  the CPU engine's fp64 gradient checks: the same formulas in fp64.
// Shape rules that exist for the CUDA kernels' vector loads (H or F a multiple of 8) apply to
// Bf16 only.
#ifndef DROPLESS_KERNELS_CPU_TYPES_H_
#define DROPLESS_KERNELS_CPU_TYPES_H_

#include <type_traits>

#include "dropless/kernels/types.h"

namespace dropless::kernels::cpu {

// The arithmetic type of a reference over T (also the type of its routing weights).
template <typename T>
using MathOf = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
inline constexpr bool kIsCudaStorage = std::is_same_v<T, Bf16>;

inline float ToMath(Bf16 v) { return Bf16ToFloat(v); }
inline float ToMath(float v) { return v; }
inline double ToMath(double v) { return v; }

template <typename T>
T FromMath(MathOf<T> v) {
  if constexpr (kIsCudaStorage<T>) {
    return FloatToBf16(v);
  } else {
    return v;
  }
}

}  // namespace dropless::kernels::cpu

#endif  // DROPLESS_KERNELS_CPU_TYPES_H_
