#include "worker/engine/cpu/swiglu_expert.h"

#include <algorithm>
#include <cmath>

#include "worker/engine/cpu/blas_gemm.h"

namespace dropless::cpu {
namespace {

template <typename T>
T Sigmoid(T v) {
  return T(1) / (T(1) + std::exp(-v));
}

}  // namespace

template <typename T>
void SwiGluForward(const SwiGluShape& shape, const T* w1, const T* w2, const T* x, T* h, T* a,
                   T* y, T y_beta) {
  const int64_t n = shape.rows, hid = shape.hidden, f = shape.ffn;
  if (n == 0) return;
  Gemm<T>(false, false, n, 2 * f, hid, T(1), x, hid, w1, 2 * f, T(0), h, 2 * f);
  for (int64_t r = 0; r < n; ++r) {
    const T* gate = h + r * 2 * f;
    const T* up = gate + f;
    T* act = a + r * f;
    for (int64_t i = 0; i < f; ++i) act[i] = gate[i] * Sigmoid(gate[i]) * up[i];
  }
  Gemm<T>(false, false, n, hid, f, T(1), a, f, w2, hid, y_beta, y, hid);
}

template <typename T>
void SwiGluBackwardData(const SwiGluShape& shape, const T* w1, const T* w2, const T* h,
                        const T* y_grad, T* h_grad, T* x_grad, T x_grad_beta,
                        std::vector<T>* scratch) {
  const int64_t n = shape.rows, hid = shape.hidden, f = shape.ffn;
  if (n == 0) return;
  scratch->resize(static_cast<size_t>(n * f));
  T* a_grad = scratch->data();  // n x F
  Gemm<T>(false, true, n, f, hid, T(1), y_grad, hid, w2, hid, T(0), a_grad, f);
  for (int64_t r = 0; r < n; ++r) {
    const T* gate = h + r * 2 * f;
    const T* up = gate + f;
    const T* da = a_grad + r * f;
    T* dgate = h_grad + r * 2 * f;
    T* dup = dgate + f;
    for (int64_t i = 0; i < f; ++i) {
      const T s = Sigmoid(gate[i]);
      const T silu = gate[i] * s;
      dup[i] = da[i] * silu;
      dgate[i] = da[i] * up[i] * s * (T(1) + gate[i] * (T(1) - s));
    }
  }
  Gemm<T>(false, true, n, hid, 2 * f, T(1), h_grad, 2 * f, w1, 2 * f, x_grad_beta, x_grad, hid);
}

template <typename T>
void SwiGluBackwardWeights(const SwiGluShape& shape, const T* x, const T* a, const T* y_grad,
                           const T* h_grad, T* w1_grad, T* w2_grad) {
  const int64_t n = shape.rows, hid = shape.hidden, f = shape.ffn;
  if (n == 0) {  // an empty group contributes nothing
    std::fill(w1_grad, w1_grad + hid * 2 * f, T(0));
    std::fill(w2_grad, w2_grad + f * hid, T(0));
    return;
  }
  Gemm<T>(true, false, f, hid, n, T(1), a, f, y_grad, hid, T(0), w2_grad, hid);
  Gemm<T>(true, false, hid, 2 * f, n, T(1), x, hid, h_grad, 2 * f, T(0), w1_grad, 2 * f);
}

#define DROPLESS_INSTANTIATE_SWIGLU(T)                                                        \
  template void SwiGluForward<T>(const SwiGluShape&, const T*, const T*, const T*, T*, T*, T*, \
                                 T);                                                          \
  template void SwiGluBackwardData<T>(const SwiGluShape&, const T*, const T*, const T*,        \
                                      const T*, T*, T*, T, std::vector<T>*);                  \
  template void SwiGluBackwardWeights<T>(const SwiGluShape&, const T*, const T*, const T*,     \
                                         const T*, T*, T*);
DROPLESS_INSTANTIATE_SWIGLU(float)
DROPLESS_INSTANTIATE_SWIGLU(double)
#undef DROPLESS_INSTANTIATE_SWIGLU

}  // namespace dropless::cpu
