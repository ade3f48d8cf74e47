// One SwiGLU expert applied to a group of rows: h = x w1 (w1: H x 2F, h = gate | up),
// a = silu(gate) * up, y = a w2 (w2: F x H). The activation and its backward are the kernels' CPU
// reference (dropless/kernels/swiglu.h); the GEMMs are OpenBLAS. The routed experts run it once
// per variable-size group (dropless: a group may be empty or hold every token); shared experts
// run it on all tokens.
#ifndef DROPLESS_WORKER_ENGINE_CPU_SWIGLU_EXPERT_H_
#define DROPLESS_WORKER_ENGINE_CPU_SWIGLU_EXPERT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace dropless::cpu {

struct SwiGluShape {
  int64_t rows = 0;    // tokens in this group
  int64_t hidden = 0;  // H
  int64_t ffn = 0;     // F
};

// Writes h (rows x 2F) and a (rows x F), kept for the backward pass, and y = a w2 + y_beta * y.
template <typename T>
absl::Status SwiGluForward(const SwiGluShape& shape, const T* w1, const T* w2, const T* x, T* h, T* a,
                   T* y, T y_beta);

// The backward pass is two independent halves so their GEMMs can be timed (and, on a GPU,
// scheduled) apart: the data gradient (dgrad) is on the critical path to the previous layer, the
// weight gradient (wgrad) only feeds the optimizer.
//
// Data gradient from y_grad: writes h_grad (rows x 2F: gate | up), kept for SwiGluBackwardWeights,
// and x_grad = dx + x_grad_beta * x_grad. `scratch` is reused between calls to avoid reallocating
// rows x F values each time.
template <typename T>
absl::Status SwiGluBackwardData(const SwiGluShape& shape, const T* w1, const T* w2, const T* h,
                        const T* y_grad, T* h_grad, T* x_grad, T x_grad_beta,
                        std::vector<T>* scratch);

// Weight gradient: overwrites w1_grad (H x 2F) = x^T h_grad and w2_grad (F x H) = a^T y_grad.
// An empty group (rows = 0) writes zeros.
template <typename T>
void SwiGluBackwardWeights(const SwiGluShape& shape, const T* x, const T* a, const T* y_grad,
                           const T* h_grad, T* w1_grad, T* w2_grad);

}  // namespace dropless::cpu

#endif  // DROPLESS_WORKER_ENGINE_CPU_SWIGLU_EXPERT_H_
