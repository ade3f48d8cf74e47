// One SwiGLU expert applied to a group of rows: h = x w1 (w1: H x 2F, h = gate | up),
// a = silu(gate) * up, y = a w2 (w2: F x H). The routed experts run it once per variable-size
// group (dropless: a group may be empty or hold every token); shared experts run it on all tokens.
#ifndef DROPLESS_WORKER_ENGINE_CPU_SWIGLU_EXPERT_H_
#define DROPLESS_WORKER_ENGINE_CPU_SWIGLU_EXPERT_H_

#include <cstdint>
#include <vector>

namespace dropless::cpu {

struct SwiGluShape {
  int64_t rows = 0;    // tokens in this group
  int64_t hidden = 0;  // H
  int64_t ffn = 0;     // F
};

// Writes h (rows x 2F) and a (rows x F), kept for the backward pass, and y = a w2 + y_beta * y.
template <typename T>
void SwiGluForward(const SwiGluShape& shape, const T* w1, const T* w2, const T* x, T* h, T* a,
                   T* y, T y_beta);

// From y_grad: overwrites w1_grad (H x 2F) and w2_grad (F x H); x_grad = dx + x_grad_beta * x_grad.
// `scratch` is reused between calls to avoid reallocating rows x 3F values each time.
template <typename T>
void SwiGluBackward(const SwiGluShape& shape, const T* w1, const T* w2, const T* x, const T* h,
                    const T* a, const T* y_grad, T* w1_grad, T* w2_grad, T* x_grad,
                    T x_grad_beta, std::vector<T>* scratch);

}  // namespace dropless::cpu

#endif  // DROPLESS_WORKER_ENGINE_CPU_SWIGLU_EXPERT_H_
