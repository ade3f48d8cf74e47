// Routing: fused score + top-k + counts + aux statistics, the aux loss, and the backward pass
// (contracts: dropless/kernels/routing.h). One warp per token; lane l holds experts l, l+32, ...
#include <cuda_runtime.h>

#include <climits>

#include "absl/status/status.h"
#include "dropless/kernels/routing.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.cuh"

namespace dropless::kernels::cuda {
namespace {

using detail::kFullMask;
using detail::WarpMax;
using detail::WarpSum;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTokensPerWarp = 2;  // forward: 16 tokens per block share one flush of the counts

// Total order of the kernel and the CPU reference: NaN lowest, -0 < +0.
__device__ __forceinline__ uint32_t OrderKey(float x) {
  if (isnan(x)) return 0;
  const uint32_t bits = __float_as_uint(x);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Token t's logits and scores in registers; invalid (e >= E) entries are masked by `valid`.
template <int kPerLane>
struct TokenScores {
  float logit[kPerLane];
  float score[kPerLane];
  uint32_t valid = 0;  // bit i: expert lane + 32 i exists
  float max_logit = 0, exp_sum = 0, score_sum = 0;

  __device__ void Load(const float* __restrict__ row, int experts, bool sigmoid) {
    const int lane = threadIdx.x & 31;
    float local_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      const bool ok = e < experts;
      logit[i] = ok ? row[e] : -INFINITY;
      valid |= ok ? (1u << i) : 0u;
      local_max = fmaxf(local_max, logit[i]);
    }
    if (!sigmoid) {
      max_logit = WarpMax(local_max);
      float local = 0;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        score[i] = ((valid >> i) & 1) ? expf(logit[i] - max_logit) : 0.0f;
        local += score[i];
      }
      exp_sum = WarpSum(local);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) score[i] = score[i] / exp_sum;
      score_sum = 1.0f;
    } else {
      float local = 0;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        score[i] = ((valid >> i) & 1) ? 1.0f / (1.0f + expf(-logit[i])) : 0.0f;
        local += score[i];
      }
      score_sum = WarpSum(local);
    }
  }

  // Score of one expert from its logit, bit-identical to the lane-held value.
  __device__ float ScoreOf(float l, bool sigmoid) const {
    return sigmoid ? 1.0f / (1.0f + expf(-l)) : expf(l - max_logit) / exp_sum;
  }
};

template <int kPerLane>
__global__ void __launch_bounds__(kThreads)
    RouteTopKKernel(const float* __restrict__ logits, int64_t tokens, int experts, int top_k,
                    bool sigmoid, bool renormalize, int32_t* __restrict__ expert_ids,
                    float* __restrict__ weights, int32_t* __restrict__ counts,
                    float* __restrict__ prob_sums) {
  __shared__ int32_t block_counts[kMaxRoutingExperts];
  __shared__ float block_sums[kMaxRoutingExperts];
  for (int e = threadIdx.x; e < experts; e += kThreads) {
    block_counts[e] = 0;
    block_sums[e] = 0.0f;
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int n = 0; n < kTokensPerWarp; ++n) {
    const int64_t t = (static_cast<int64_t>(blockIdx.x) * kTokensPerWarp + n) * kWarps + warp;
    if (t >= tokens) break;  // warp-uniform
    TokenScores<kPerLane> ts;
    ts.Load(logits + t * experts, experts, sigmoid);
    uint32_t key[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) key[i] = OrderKey(ts.logit[i]);
    uint32_t taken = ~ts.valid;
    int my_id = -1;
    float my_score = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxRoutingTopK; ++j) {
      if (j >= top_k) break;
      uint32_t best_key = 0;
      int best_id = INT_MAX;
      float best_score = 0.0f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        // Lane-local ids grow with i, so a strict > keeps the lower id on ties.
        if (!((taken >> i) & 1) && (best_id == INT_MAX || key[i] > best_key)) {
          best_key = key[i];
          best_id = lane + 32 * i;
          best_score = ts.score[i];
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const uint32_t other_key = __shfl_xor_sync(kFullMask, best_key, o);
        const int other_id = __shfl_xor_sync(kFullMask, best_id, o);
        const float other_score = __shfl_xor_sync(kFullMask, best_score, o);
        if (other_key > best_key || (other_key == best_key && other_id < best_id)) {
          best_key = other_key;
          best_id = other_id;
          best_score = other_score;
        }
      }
      if (lane == j) {
        my_id = best_id;
        my_score = best_score;
      }
      if ((best_id & 31) == lane) taken |= 1u << (best_id >> 5);
    }
    float weight = my_score;
    if (renormalize) weight = my_score / WarpSum(lane < top_k ? my_score : 0.0f);
    if (lane < top_k) {
      expert_ids[t * top_k + lane] = my_id;
      weights[t * top_k + lane] = weight;
      atomicAdd(&block_counts[my_id], 1);
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if ((ts.valid >> i) & 1) atomicAdd(&block_sums[lane + 32 * i], ts.score[i] / ts.score_sum);
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += kThreads) {
    if (block_counts[e] != 0) atomicAdd(&counts[e], block_counts[e]);
    atomicAdd(&prob_sums[e], block_sums[e]);
  }
}

template <int kPerLane>
__global__ void __launch_bounds__(kThreads)
    RouteTopKBackwardKernel(const float* __restrict__ logits, int64_t tokens, int experts,
                            int top_k, bool sigmoid, bool renormalize,
                            const int32_t* __restrict__ expert_ids,
                            const int32_t* __restrict__ counts,
                            const float* __restrict__ d_weights, float aux_scale,
                            float* __restrict__ d_logits) {
  const int lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (t >= tokens) return;  // warp-uniform
  const float* row = logits + t * experts;
  TokenScores<kPerLane> ts;
  ts.Load(row, experts, sigmoid);
  // Weight path: lane j < k owns choice j.
  int my_id = 0;
  float my_dw = 0.0f, my_score = 0.0f;
  if (lane < top_k) {
    my_id = expert_ids[t * top_k + lane];
    my_dw = d_weights[t * top_k + lane];
    my_score = ts.ScoreOf(row[my_id], sigmoid);
  }
  float contribution = my_dw;
  if (renormalize) {
    const float chosen = WarpSum(my_score);
    const float weighted = WarpSum(my_dw * (my_score / chosen));
    contribution = (my_dw - weighted) / chosen;
  }
  float d_score[kPerLane];
  float d_q[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    d_score[i] = 0.0f;
    d_q[i] = ((ts.valid >> i) & 1) ? aux_scale * static_cast<float>(counts[e]) : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kMaxRoutingTopK; ++j) {
    if (j >= top_k) break;
    const int id = __shfl_sync(kFullMask, my_id, j);
    const float c = __shfl_sync(kFullMask, contribution, j);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (lane + 32 * i == id) d_score[i] += c;
    }
  }
  float local = 0.0f;
  if (!sigmoid) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      d_score[i] += d_q[i];
      local += ts.score[i] * d_score[i];
    }
    const float dot = WarpSum(local);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) d_score[i] = ts.score[i] * (d_score[i] - dot);
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) local += (ts.score[i] / ts.score_sum) * d_q[i];
    const float q_dot = WarpSum(local);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const float s = ts.score[i];
      d_score[i] = (d_score[i] + (d_q[i] - q_dot) / ts.score_sum) * s * (1.0f - s);
    }
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if ((ts.valid >> i) & 1) d_logits[t * experts + lane + 32 * i] = d_score[i];
  }
}

__global__ void __launch_bounds__(kMaxRoutingExperts)
    AuxLossKernel(const int32_t* __restrict__ counts, const float* __restrict__ prob_sums,
                  int experts, double scale, float* __restrict__ aux_loss) {
  __shared__ double warp_sums[kMaxRoutingExperts / 32];
  const int e = threadIdx.x;
  double v = e < experts ? static_cast<double>(counts[e]) * prob_sums[e] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  if ((e & 31) == 0) warp_sums[e >> 5] = v;
  __syncthreads();
  if (e == 0) {
    double total = 0;
    for (int w = 0; w < kMaxRoutingExperts / 32; ++w) total += warp_sums[w];
    *aux_loss = static_cast<float>(total * scale);
  }
}

template <template <int> class Launch, typename... Args>
absl::Status DispatchExperts(int experts, Args&&... args) {
  const int per_lane = (experts + 31) / 32;
  if (per_lane <= 1) return Launch<1>::Run(args...);
  if (per_lane <= 2) return Launch<2>::Run(args...);
  if (per_lane <= 4) return Launch<4>::Run(args...);
  if (per_lane <= 8) return Launch<8>::Run(args...);
  return Launch<16>::Run(args...);
}

template <int kPerLane>
struct LaunchRoute {
  static absl::Status Run(const RoutingShape& s, const float* logits, const RoutingOutputs& out,
                          Stream stream) {
    const int64_t blocks = (s.num_tokens + kWarps * kTokensPerWarp - 1) / (kWarps * kTokensPerWarp);
    RouteTopKKernel<kPerLane><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        logits, s.num_tokens, s.num_experts, s.top_k, s.score == ScoreFunction::kSigmoid,
        s.renormalize, out.expert_ids, out.weights, out.expert_counts, out.prob_sums);
    return LaunchStatus("RouteTopKKernel");
  }
};

template <int kPerLane>
struct LaunchRouteBackward {
  static absl::Status Run(const RoutingShape& s, const float* logits, const int32_t* ids,
                          const int32_t* counts, const float* d_weights, float aux_scale,
                          float* d_logits, Stream stream) {
    const int64_t blocks = (s.num_tokens + kWarps - 1) / kWarps;
    RouteTopKBackwardKernel<kPerLane><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        logits, s.num_tokens, s.num_experts, s.top_k, s.score == ScoreFunction::kSigmoid,
        s.renormalize, ids, counts, d_weights, aux_scale, d_logits);
    return LaunchStatus("RouteTopKBackwardKernel");
  }
};

}  // namespace

absl::Status RouteTopK(const RoutingShape& shape, const float* logits, const RoutingOutputs& out,
                       Stream stream) {
  if (absl::Status s = ValidateRoutingShape(shape); !s.ok()) return s;
  if (out.expert_counts == nullptr || out.prob_sums == nullptr) {
    return absl::InvalidArgumentError("expert_counts and prob_sums must be set");
  }
  DROPLESS_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(out.expert_counts, 0, sizeof(int32_t) * shape.num_experts, stream));
  DROPLESS_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(out.prob_sums, 0, sizeof(float) * shape.num_experts, stream));
  if (shape.num_tokens == 0) return absl::OkStatus();
  if (logits == nullptr || out.expert_ids == nullptr || out.weights == nullptr) {
    return absl::InvalidArgumentError("logits, expert_ids and weights must be set");
  }
  return DispatchExperts<LaunchRoute>(shape.num_experts, shape, logits, out, stream);
}

absl::Status AuxLoss(const RoutingShape& shape, const int32_t* expert_counts,
                     const float* prob_sums, float* aux_loss, Stream stream) {
  if (absl::Status s = ValidateRoutingShape(shape); !s.ok()) return s;
  if (expert_counts == nullptr || prob_sums == nullptr || aux_loss == nullptr) {
    return absl::InvalidArgumentError("expert_counts, prob_sums and aux_loss must be set");
  }
  const double tokens = static_cast<double>(AuxTokens(shape));
  const double scale = tokens == 0 ? 0.0 : shape.num_experts / (tokens * shape.top_k * tokens);
  AuxLossKernel<<<1, kMaxRoutingExperts, 0, stream>>>(expert_counts, prob_sums, shape.num_experts,
                                                      scale, aux_loss);
  return LaunchStatus("AuxLossKernel");
}

absl::Status RouteTopKBackward(const RoutingShape& shape, const float* logits,
                               const int32_t* expert_ids, const int32_t* expert_counts,
                               const float* d_weights, float aux_loss_coef, float* d_logits,
                               Stream stream) {
  if (absl::Status s = ValidateRoutingShape(shape); !s.ok()) return s;
  if (shape.num_tokens == 0) return absl::OkStatus();
  if (logits == nullptr || expert_ids == nullptr || expert_counts == nullptr ||
      d_weights == nullptr || d_logits == nullptr) {
    return absl::InvalidArgumentError(
        "logits, expert_ids, expert_counts, d_weights and d_logits must be set");
  }
  const double tokens = static_cast<double>(AuxTokens(shape));
  const float aux_scale = static_cast<float>(static_cast<double>(aux_loss_coef) *
                                             shape.num_experts / (tokens * shape.top_k * tokens));
  return DispatchExperts<LaunchRouteBackward>(shape.num_experts, shape, logits, expert_ids,
                                              expert_counts, d_weights, aux_scale, d_logits,
                                              stream);
}

}  // namespace dropless::kernels::cuda
