#include "worker/engine/cpu/swiglu_expert.h"

#include <algorithm>

#include "dropless/kernels/swiglu.h"
#include "worker/engine/cpu/blas_gemm.h"

namespace dropless::cpu {

template <typename T>
absl::Status SwiGluForward(const SwiGluShape& shape, const T* w1, const T* w2, const T* x, T* h, T* a,
                   T* y, T y_beta) {
  const int64_t n = shape.rows, hid = shape.hidden, f = shape.ffn;
  if (n == 0) return absl::OkStatus();
  Gemm<T>(false, false, n, 2 * f, hid, T(1), x, hid, w1, 2 * f, T(0), h, 2 * f);
  if (absl::Status s = kernels::cpu::SwigluForward<T>({n, f}, nullptr, h, a, nullptr); !s.ok()) {
    return s;
  }
  Gemm<T>(false, false, n, hid, f, T(1), a, f, w2, hid, y_beta, y, hid);
  return absl::OkStatus();
}

template <typename T>
absl::Status SwiGluBackwardData(const SwiGluShape& shape, const T* w1, const T* w2, const T* h,
                        const T* y_grad, T* h_grad, T* x_grad, T x_grad_beta,
                        std::vector<T>* scratch) {
  const int64_t n = shape.rows, hid = shape.hidden, f = shape.ffn;
  if (n == 0) return absl::OkStatus();
  scratch->resize(static_cast<size_t>(n * f));
  T* a_grad = scratch->data();  // n x F
  Gemm<T>(false, true, n, f, hid, T(1), y_grad, hid, w2, hid, T(0), a_grad, f);
  if (absl::Status s = kernels::cpu::SwigluBackward<T>({n, f}, nullptr, h, a_grad, h_grad);
      !s.ok()) {
    return s;
  }
  Gemm<T>(false, true, n, hid, 2 * f, T(1), h_grad, 2 * f, w1, 2 * f, x_grad_beta, x_grad, hid);
  return absl::OkStatus();
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
  template absl::Status SwiGluForward<T>(const SwiGluShape&, const T*, const T*, const T*, T*, T*, T*, \
                                 T);                                                          \
  template absl::Status SwiGluBackwardData<T>(const SwiGluShape&, const T*, const T*, const T*,        \
                                      const T*, T*, T*, T, std::vector<T>*);                  \
  template void SwiGluBackwardWeights<T>(const SwiGluShape&, const T*, const T*, const T*,     \
                                         const T*, T*, T*);
DROPLESS_INSTANTIATE_SWIGLU(float)
DROPLESS_INSTANTIATE_SWIGLU(double)
#undef DROPLESS_INSTANTIATE_SWIGLU

}  // namespace dropless::cpu
