#include "worker/engine/cpu/adamw.h"

#include <algorithm>
#include <cmath>

namespace dropless::cpu {

double AdamWLearningRate(const OptimizerSpec& optimizer, int64_t step) {
  if (optimizer.warmup_steps <= 0) return optimizer.lr;
  return optimizer.lr *
         std::min(1.0, static_cast<double>(step) / static_cast<double>(optimizer.warmup_steps));
}

template <typename T>
void AdamWUpdate(const OptimizerSpec& optimizer, int64_t step, int64_t n, const T* grad, T* param,
                 T* m, T* v) {
  const double lr = AdamWLearningRate(optimizer, step);
  const double t = static_cast<double>(step);
  const T beta1 = static_cast<T>(optimizer.beta1);
  const T beta2 = static_cast<T>(optimizer.beta2);
  const T decay = static_cast<T>(1.0 - lr * optimizer.weight_decay);
  const T m_correction = static_cast<T>(1.0 / (1.0 - std::pow(optimizer.beta1, t)));
  const T v_correction = static_cast<T>(1.0 / (1.0 - std::pow(optimizer.beta2, t)));
  const T step_size = static_cast<T>(lr);
  const T eps = static_cast<T>(optimizer.eps);
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i];
    m[i] = beta1 * m[i] + (T(1) - beta1) * g;
    v[i] = beta2 * v[i] + (T(1) - beta2) * g * g;
    const T update = (m[i] * m_correction) / (std::sqrt(v[i] * v_correction) + eps);
    param[i] = param[i] * decay - step_size * update;
  }
}

template void AdamWUpdate<float>(const OptimizerSpec&, int64_t, int64_t, const float*, float*,
                                 float*, float*);
template void AdamWUpdate<double>(const OptimizerSpec&, int64_t, int64_t, const double*, double*,
                                  double*, double*);

}  // namespace dropless::cpu
