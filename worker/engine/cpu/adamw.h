// AdamW with decoupled weight decay and bias correction, and a linear warmup of the learning rate:
//   lr_t = lr * min(1, t / warmup_steps)   (t = 1-based step; no warmup when warmup_steps <= 0)
//   p <- p - lr_t * weight_decay * p
//   m <- beta1 m + (1 - beta1) g;  v <- beta2 v + (1 - beta2) g^2
//   p <- p - lr_t * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
//   optimizer.moment_dtype bf16 only: m <- sr(m), v <- sr(v)   (after p's update)
// m and v are computed in fp32 and p's update uses them as computed; with bf16 moments the stored
// m and v are then rounded stochastically to bf16 (kernels/adamw.h's StochasticBf16 with the draws
// of BF16MomentBits(moment_stream, first_index + i, step)), so the float buffers hold only
// bf16-representable values, the bits the CUDA engine keeps.
#ifndef DROPLESS_WORKER_ENGINE_CPU_ADAMW_H_
#define DROPLESS_WORKER_ENGINE_CPU_ADAMW_H_

#include <cstdint>

#include "common/job_spec.h"

namespace dropless::cpu {

// The rounding streams of bf16 moments (kernels::AdamWMoments::stream) of the engines' two flat
// parameter buffers (MoeParameterLayout's replicated and experts buffers).
inline constexpr uint32_t kReplicatedMoments = 0;
inline constexpr uint32_t kExpertMoments = 1;

double AdamWLearningRate(const OptimizerSpec& optimizer, int64_t step);

// Updates n parameters in place with their gradients and moment buffers m and v. T = float is the
// CPU engine's (optimizer.moment_dtype honoured); T = double is a reference for tests and keeps
// its moments in double whatever moment_dtype says.
// moment_stream and first_index place the n elements for bf16 moments' rounding: their flat
// buffer (kReplicatedMoments, kExpertMoments) and the index there of element 0.
template <typename T>
void AdamWUpdate(const OptimizerSpec& optimizer, int64_t step, int64_t n, const T* grad, T* param,
                 T* m, T* v, uint32_t moment_stream = kReplicatedMoments, int64_t first_index = 0);

// Rounds n moments to what `dtype` stores (bf16: to nearest even, as the CUDA engine narrows a
// checkpoint's moments; fp32: unchanged), for moments that come from elsewhere: a checkpoint of
// fp32 moments resumed with bf16 moments.
void RoundMomentsTo(MomentDtype dtype, int64_t n, float* moments);

}  // namespace dropless::cpu

#endif  // DROPLESS_WORKER_ENGINE_CPU_ADAMW_H_
