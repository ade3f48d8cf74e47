#include "worker/engine/cpu/router.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dropless::cpu {

template <typename T>
void RouterProbabilities(const RouterShape& shape, const T* logits, T* probs) {
  const int64_t num_experts = shape.experts;
  for (int64_t t = 0; t < shape.tokens; ++t) {
    const T* z = logits + t * num_experts;
    T* p = probs + t * num_experts;
    if (shape.kind == RouterKind::kSigmoid) {
      for (int64_t e = 0; e < num_experts; ++e) p[e] = T(1) / (T(1) + std::exp(-z[e]));
      continue;
    }
    const T max_logit = *std::max_element(z, z + num_experts);
    T sum = 0;
    for (int64_t e = 0; e < num_experts; ++e) {
      p[e] = std::exp(z[e] - max_logit);
      sum += p[e];
    }
    for (int64_t e = 0; e < num_experts; ++e) p[e] /= sum;
  }
}

template <typename T>
void SelectTopK(const RouterShape& shape, const T* probs, int32_t* expert_ids, T* gates) {
  const int64_t num_experts = shape.experts;
  const int64_t k = shape.topk;
  std::vector<char> taken(num_experts);
  for (int64_t t = 0; t < shape.tokens; ++t) {
    const T* p = probs + t * num_experts;
    int32_t* ids = expert_ids + t * k;
    T* g = gates + t * k;
    std::fill(taken.begin(), taken.end(), 0);
    T chosen_sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < num_experts; ++e) {
        // Strictly greater: on equal probabilities the lower id, met first, stays.
        if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
      }
      taken[best] = 1;
      ids[j] = static_cast<int32_t>(best);
      g[j] = p[best];
      chosen_sum += p[best];
    }
    if (shape.renormalize) {
      for (int64_t j = 0; j < k; ++j) g[j] /= chosen_sum;
    }
  }
}

template <typename T>
void AccumulateRoutingStats(const RouterShape& shape, const T* probs, const int32_t* expert_ids,
                            double* slots_per_expert, double* prob_sum_per_expert) {
  for (int64_t t = 0; t < shape.tokens; ++t) {
    for (int64_t j = 0; j < shape.topk; ++j) slots_per_expert[expert_ids[t * shape.topk + j]] += 1;
    // The aux loss's routing distribution: the probabilities, or the sigmoids normalized per
    // token (the kernels' contract, dropless/kernels/routing.h).
    double total = 1;
    if (shape.kind == RouterKind::kSigmoid) {
      total = 0;
      for (int64_t e = 0; e < shape.experts; ++e) total += static_cast<double>(probs[t * shape.experts + e]);
    }
    for (int64_t e = 0; e < shape.experts; ++e) {
      prob_sum_per_expert[e] += static_cast<double>(probs[t * shape.experts + e]) / total;
    }
  }
}

double LoadBalancingLoss(int64_t experts, int64_t topk, const double* slots_per_expert,
                         const double* prob_sum_per_expert, double tokens) {
  if (tokens <= 0) return 0;
  double sum = 0;
  for (int64_t e = 0; e < experts; ++e) {
    sum += (slots_per_expert[e] / (tokens * static_cast<double>(topk))) *
           (prob_sum_per_expert[e] / tokens);
  }
  return static_cast<double>(experts) * sum;
}

template <typename T>
void RouterBackward(const RouterShape& shape, const T* probs, const int32_t* expert_ids,
                    const T* gates, const T* gate_grads, const double* slots_per_expert,
                    double tokens, double aux_scale, T* logit_grads) {
  const int64_t num_experts = shape.experts;
  const int64_t k = shape.topk;
  // d aux / d q[t, e] = E * f_e / tokens, the same for every token.
  std::vector<T> aux_grad(num_experts, T(0));
  if (aux_scale != 0 && tokens > 0) {
    for (int64_t e = 0; e < num_experts; ++e) {
      const double f = slots_per_expert[e] / (tokens * static_cast<double>(k));
      aux_grad[e] = static_cast<T>(aux_scale * static_cast<double>(num_experts) * f / tokens);
    }
  }
  std::vector<T> prob_grads(num_experts);
  for (int64_t t = 0; t < shape.tokens; ++t) {
    const T* p = probs + t * num_experts;
    const int32_t* ids = expert_ids + t * k;
    const T* g = gates + t * k;
    const T* dg = gate_grads + t * k;
    if (shape.kind == RouterKind::kSigmoid) {
      // q_e = p_e / sum p: dp_e = (dq_e - sum_e' q_e' dq_e') / sum p.
      T total = 0, dot = 0;
      for (int64_t e = 0; e < num_experts; ++e) total += p[e];
      for (int64_t e = 0; e < num_experts; ++e) dot += (p[e] / total) * aux_grad[e];
      for (int64_t e = 0; e < num_experts; ++e) prob_grads[e] = (aux_grad[e] - dot) / total;
    } else {
      std::copy(aux_grad.begin(), aux_grad.end(), prob_grads.begin());
    }
    if (shape.renormalize) {
      // g_j = p_j / s with s = sum of chosen p: dp_j = (dg_j - sum_i dg_i g_i) / s.
      T chosen_sum = 0;
      T dot = 0;
      for (int64_t j = 0; j < k; ++j) {
        chosen_sum += p[ids[j]];
        dot += dg[j] * g[j];
      }
      for (int64_t j = 0; j < k; ++j) prob_grads[ids[j]] += (dg[j] - dot) / chosen_sum;
    } else {
      for (int64_t j = 0; j < k; ++j) prob_grads[ids[j]] += dg[j];
    }
    T* dz = logit_grads + t * num_experts;
    if (shape.kind == RouterKind::kSigmoid) {
      for (int64_t e = 0; e < num_experts; ++e) dz[e] = prob_grads[e] * p[e] * (T(1) - p[e]);
    } else {
      T weighted = 0;
      for (int64_t e = 0; e < num_experts; ++e) weighted += p[e] * prob_grads[e];
      for (int64_t e = 0; e < num_experts; ++e) dz[e] = p[e] * (prob_grads[e] - weighted);
    }
  }
}

#define DROPLESS_INSTANTIATE_ROUTER(T)                                                        \
  template void RouterProbabilities<T>(const RouterShape&, const T*, T*);                     \
  template void SelectTopK<T>(const RouterShape&, const T*, int32_t*, T*);                    \
  template void AccumulateRoutingStats<T>(const RouterShape&, const T*, const int32_t*,       \
                                          double*, double*);                                  \
  template void RouterBackward<T>(const RouterShape&, const T*, const int32_t*, const T*,     \
                                  const T*, const double*, double, double, T*);
DROPLESS_INSTANTIATE_ROUTER(float)
DROPLESS_INSTANTIATE_ROUTER(double)
#undef DROPLESS_INSTANTIATE_ROUTER

}  // namespace dropless::cpu
