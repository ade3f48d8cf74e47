// Token routing: scores from router logits, top-k expert choice, per-expert counts, the
// load-balancing (auxiliary) loss statistics, and the backward pass to the logits.
//
// Forward, per token t with fp32 logits l[t][0..E):
//   score   softmax: p_e = exp(l_e - max) / sum_e' exp(l_e' - max)
//           sigmoid: s_e = 1 / (1 + exp(-l_e))
//   choose  the k experts with the largest logits (both score functions are monotone in the logit,
//           so this is the top-k by score). Ties go to the lower expert id; a NaN logit ranks below
//           every number; +0 ranks above -0. expert_ids[t][j] lists them best first.
//   weight  w[t][j] = score of the j-th choice; with renormalize, divided by the sum of the k
//           chosen scores.
//   count   expert_counts[e] = number of (t, j) with expert_ids[t][j] = e (int32, exact).
//   stats   prob_sums[e] = sum_t q[t][e], where q is the routing distribution of the aux loss:
//           softmax: q = p; sigmoid: q_e = s_e / sum_e' s_e' (the scores normalized per token).
// Auxiliary (load-balancing) loss, before its coefficient (Switch/GShard form):
//   f_e = expert_counts[e] / (T * k),  P_e = prob_sums[e] / T,  aux = E * sum_e f_e * P_e.
// The counts are treated as constants in the backward pass (they are not differentiable).
//
// Backward, given dL/dw[t][j] and the aux loss coefficient c (the loss holds c * aux):
//   dq[t][e]  = c * E * f_e / T                     (aux loss through the routing distribution)
//   dw -> d(score of the chosen experts), through the renormalization when it is on;
//   both -> d_logits through softmax (dl = p * (dp - sum p * dp)) or sigmoid (ds * s * (1 - s),
//   with q's normalization by sum s for the aux term).
//
// Expert parallelism: the auxiliary loss of a job is over every rank's tokens. A rank then passes
// AuxLoss and RouteTopKBackward the job's expert_counts and prob_sums (summed over the ranks) and
// the job's token count as aux_tokens; f_e and P_e above divide by aux_tokens instead of T.
//
// Limits: 1 <= E <= 512 (the CUDA kernels; the CPU references take any E), 1 <= k <= min(E, 16),
// T >= 0. Logits, weights and gradients are fp32; the CPU references also run in fp64
// (T = double: scores, weights and gradients in double throughout, for fp64 gradient checks).
#ifndef DROPLESS_KERNELS_ROUTING_H_
#define DROPLESS_KERNELS_ROUTING_H_

#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "dropless/kernels/types.h"

namespace dropless::kernels {

inline constexpr int kMaxRoutingExperts = 512;
inline constexpr int kMaxRoutingTopK = 16;

enum class ScoreFunction { kSoftmax, kSigmoid };

struct RoutingShape {
  int64_t num_tokens = 0;  // T
  int num_experts = 0;     // E
  int top_k = 0;           // k
  ScoreFunction score = ScoreFunction::kSoftmax;
  bool renormalize = false;
  int64_t aux_tokens = 0;  // tokens the aux loss statistics are over; 0 = num_tokens (one rank)
};

inline int64_t AuxTokens(const RoutingShape& shape) {
  return shape.aux_tokens > 0 ? shape.aux_tokens : shape.num_tokens;
}

// cuda_limits: also E <= kMaxRoutingExperts (one warp's registers per token in the CUDA kernels).
absl::Status ValidateRoutingShape(const RoutingShape& shape, bool cuda_limits = true);

template <typename W>
struct RoutingOutputsOf {
  int32_t* expert_ids = nullptr;     // [T][k]
  W* weights = nullptr;              // [T][k]
  int32_t* expert_counts = nullptr;  // [E]   (overwritten, not accumulated)
  W* prob_sums = nullptr;            // [E]   (overwritten, not accumulated)
};
using RoutingOutputs = RoutingOutputsOf<float>;

namespace cpu {

// T is float (the CUDA kernels' contract) or double. The CPU engine routes with these
// (worker/engine/cpu/moe_layer.cc).
// logits [T][E].
template <typename T>
absl::Status RouteTopK(const RoutingShape& shape, const T* logits, const RoutingOutputsOf<T>& out);

// Writes the auxiliary loss (before its coefficient) to *aux_loss.
template <typename T>
absl::Status AuxLoss(const RoutingShape& shape, const int32_t* expert_counts, const T* prob_sums,
                     T* aux_loss);

// d_weights [T][k], d_logits [T][E] (overwritten). expert_ids and expert_counts are the forward's
// (expert_counts the job's with aux_tokens).
template <typename T>
absl::Status RouteTopKBackward(const RoutingShape& shape, const T* logits,
                               const int32_t* expert_ids, const int32_t* expert_counts,
                               const T* d_weights, std::common_type_t<T> aux_loss_coef,
                               T* d_logits);

}  // namespace cpu

namespace cuda {

// One warp per token; block-level partial counts and sums, then one atomic per expert per block,
// so counts are exact and prob_sums are fp32 sums in an unspecified order.
absl::Status RouteTopK(const RoutingShape& shape, const float* logits, const RoutingOutputs& out,
                       Stream stream);

// aux_loss: one float in device memory.
absl::Status AuxLoss(const RoutingShape& shape, const int32_t* expert_counts,
                     const float* prob_sums, float* aux_loss, Stream stream);

absl::Status RouteTopKBackward(const RoutingShape& shape, const float* logits,
                               const int32_t* expert_ids, const int32_t* expert_counts,
                               const float* d_weights, float aux_loss_coef, float* d_logits,
                               Stream stream);

}  // namespace cuda
}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_ROUTING_H_
