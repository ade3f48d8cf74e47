// AdamW with decoupled weight decay and bias correction, and a linear warmup of the learning rate:
//   lr_t = lr * min(1, t / warmup_steps)          (t = 1-based step; no warmup when warmup_steps <= 0)
//   p <- p - lr_t * weight_decay * p
//   m <- beta1 m + (1 - beta1) g;  v <- beta2 v + (1 - beta2) g^2
//   p <- p - lr_t * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
#ifndef DROPLESS_WORKER_ENGINE_CPU_ADAMW_H_
#define DROPLESS_WORKER_ENGINE_CPU_ADAMW_H_

#include <cstdint>

#include "common/job_spec.h"

namespace dropless::cpu {

double AdamWLearningRate(const OptimizerSpec& optimizer, int64_t step);

// Updates n parameters in place with their gradients and moment buffers m and v.
template <typename T>
void AdamWUpdate(const OptimizerSpec& optimizer, int64_t step, int64_t n, const T* grad, T* param,
                 T* m, T* v);

}  // namespace dropless::cpu

#endif  // DROPLESS_WORKER_ENGINE_CPU_ADAMW_H_
