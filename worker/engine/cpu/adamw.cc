#include "worker/engine/cpu/adamw.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "dropless/kernels/adamw.h"
#include "dropless/kernels/types.h"

namespace dropless::cpu {
namespace {

// A moment as stored with optimizer.moment_dtype bf16 (kernels/adamw.h's StochasticBf16 with the
// element's draw). The double instantiation (a reference) keeps its moments in double.
template <typename T>
T Bf16Moment(T x, uint32_t random16) {
  if constexpr (std::is_same_v<T, float>) {
    return kernels::StochasticBf16(x, random16);
  } else {
    return x;
  }
}

}  // namespace

double AdamWLearningRate(const OptimizerSpec& optimizer, int64_t step) {
  if (optimizer.warmup_steps <= 0) return optimizer.lr;
  return optimizer.lr *
         std::min(1.0, static_cast<double>(step) / static_cast<double>(optimizer.warmup_steps));
}

template <typename T>
void AdamWUpdate(const OptimizerSpec& optimizer, int64_t step, int64_t n, const T* grad, T* param,
                 T* m, T* v, uint32_t moment_stream, int64_t first_index) {
  const double lr = AdamWLearningRate(optimizer, step);
  const double t = static_cast<double>(step);
  const T beta1 = static_cast<T>(optimizer.beta1);
  const T beta2 = static_cast<T>(optimizer.beta2);
  const T decay = static_cast<T>(1.0 - lr * optimizer.weight_decay);
  const T m_correction = static_cast<T>(1.0 / (1.0 - std::pow(optimizer.beta1, t)));
  const T v_correction = static_cast<T>(1.0 / (1.0 - std::pow(optimizer.beta2, t)));
  const T step_size = static_cast<T>(lr);
  const T eps = static_cast<T>(optimizer.eps);
  const bool bf16_moments = optimizer.moment_dtype == MomentDtype::kBf16;
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i];
    const T mi = beta1 * m[i] + (T(1) - beta1) * g;
    const T vi = beta2 * v[i] + (T(1) - beta2) * g * g;
    const T update = (mi * m_correction) / (std::sqrt(vi * v_correction) + eps);
    param[i] = param[i] * decay - step_size * update;
    // The update used the moments as computed; bf16 moments are stored rounded.
    if (bf16_moments) {
      const uint32_t bits = kernels::BF16MomentBits(moment_stream, first_index + i, step);
      m[i] = Bf16Moment(mi, bits & 0xffffu);
      v[i] = Bf16Moment(vi, bits >> 16);
    } else {
      m[i] = mi;
      v[i] = vi;
    }
  }
}

void RoundMomentsTo(MomentDtype dtype, int64_t n, float* moments) {
  if (dtype != MomentDtype::kBf16) return;
  for (int64_t i = 0; i < n; ++i) {
    moments[i] = kernels::NearestBf16Moment(moments[i]);
  }
}

template void AdamWUpdate<float>(const OptimizerSpec&, int64_t, int64_t, const float*, float*,
                                 float*, float*, uint32_t, int64_t);
template void AdamWUpdate<double>(const OptimizerSpec&, int64_t, int64_t, const double*, double*,
                                  double*, double*, uint32_t, int64_t);

}  // namespace dropless::cpu
