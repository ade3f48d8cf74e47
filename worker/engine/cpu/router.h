// Router of a MoE layer on plain buffers: probabilities, top-k gates with a deterministic tie-break,
// the load-balancing auxiliary loss and the backward pass from gate gradients to logit gradients.
// Templated on float (engine) and double (fp64 gradient checks).
#ifndef DROPLESS_WORKER_ENGINE_CPU_ROUTER_H_
#define DROPLESS_WORKER_ENGINE_CPU_ROUTER_H_

#include <cstdint>

#include "common/job_spec.h"

namespace dropless::cpu {

struct RouterShape {
  int64_t tokens = 0;
  int64_t experts = 0;
  int64_t topk = 0;
  RouterKind kind = RouterKind::kSoftmax;
  bool renormalize = true;
};

// probs[t, e] = softmax over e of logits[t, :] (kSoftmax) or sigmoid(logits[t, e]) (kSigmoid).
// probs may be logits (in place).
template <typename T>
void RouterProbabilities(const RouterShape& shape, const T* logits, T* probs);

// Picks the k most probable experts of each token, most probable first; equal probabilities go
// to the lower expert id so that routing never depends on evaluation order. gates[t, j] is the
// chosen probability, divided by the sum of the k chosen ones when shape.renormalize.
template <typename T>
void SelectTopK(const RouterShape& shape, const T* probs, int32_t* expert_ids, T* gates);

// Adds this rank's share of the statistics of the auxiliary loss: slots_per_expert[e] += number of
// (token, slot) pairs routed to e; prob_sum_per_expert[e] += sum over tokens of q[t, e], the
// routing distribution: probs for softmax, the sigmoids normalized per token for sigmoid (as the
// kernels define it, dropless/kernels/routing.h).
template <typename T>
void AccumulateRoutingStats(const RouterShape& shape, const T* probs, const int32_t* expert_ids,
                            double* slots_per_expert, double* prob_sum_per_expert);

// Switch/GShard load-balancing loss from statistics summed over `tokens` tokens:
// E * sum_e f_e * P_e with f_e = slots_e / (tokens * k) and P_e = prob_sum_e / tokens.
double LoadBalancingLoss(int64_t experts, int64_t topk, const double* slots_per_expert,
                         const double* prob_sum_per_expert, double tokens);

// Gradient of the objective with respect to the router logits, given the gradient of the gates
// and aux_scale = d objective / d aux loss. f_e is treated as a constant (it has no gradient);
// slots_per_expert and tokens are the totals the loss was computed over.
template <typename T>
void RouterBackward(const RouterShape& shape, const T* probs, const int32_t* expert_ids,
                    const T* gates, const T* gate_grads, const double* slots_per_expert,
                    double tokens, double aux_scale, T* logit_grads);

}  // namespace dropless::cpu

#endif  // DROPLESS_WORKER_ENGINE_CPU_ROUTER_H_
