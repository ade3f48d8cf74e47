// CPU reference of routing (routing.h). Scores and gradients are computed in double and rounded to
// T once; the expert choice compares the T logits exactly as the CUDA kernel compares its floats.
#include "dropless/kernels/routing.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/status/status.h"

namespace dropless::kernels::cpu {
namespace {

// Total order on logits that matches the kernel: NaN lowest, then -inf .. +inf, -0 < +0.
uint32_t OrderKey(float x) {
  if (std::isnan(x)) return 0;
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

uint64_t OrderKey(double x) {
  if (std::isnan(x)) return 0;
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return (bits & (uint64_t{1} << 63)) ? ~bits : (bits | (uint64_t{1} << 63));
}

// Chosen experts of one token, best first.
template <typename T>
void ChooseTopK(const T* logits, int num_experts, int top_k, int32_t* ids) {
  std::vector<bool> taken(num_experts, false);
  for (int j = 0; j < top_k; ++j) {
    int best = -1;
    for (int e = 0; e < num_experts; ++e) {
      if (taken[e]) continue;
      if (best < 0 || OrderKey(logits[e]) > OrderKey(logits[best])) best = e;  // ties: lower id
    }
    taken[best] = true;
    ids[j] = best;
  }
}

// Scores (softmax probabilities or sigmoids) of one token, in double.
template <typename T>
void Scores(const T* logits, int num_experts, ScoreFunction score, std::vector<double>* out) {
  out->resize(num_experts);
  if (score == ScoreFunction::kSoftmax) {
    double max_logit = -INFINITY;
    for (int e = 0; e < num_experts; ++e) max_logit = std::fmax(max_logit, logits[e]);
    double sum = 0;
    for (int e = 0; e < num_experts; ++e) {
      (*out)[e] = std::exp(static_cast<double>(logits[e]) - max_logit);
      sum += (*out)[e];
    }
    for (int e = 0; e < num_experts; ++e) (*out)[e] /= sum;
  } else {
    for (int e = 0; e < num_experts; ++e) {
      (*out)[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[e])));
    }
  }
}

absl::Status CheckPointers(const RoutingShape& shape, std::initializer_list<const void*> ptrs) {
  if (shape.num_tokens == 0) return absl::OkStatus();
  for (const void* p : ptrs) {
    if (p == nullptr) return absl::InvalidArgumentError("routing: a required buffer is null");
  }
  return absl::OkStatus();
}

}  // namespace

template <typename T>
absl::Status RouteTopK(const RoutingShape& shape, const T* logits, const RoutingOutputsOf<T>& out) {
  if (absl::Status s = ValidateRoutingShape(shape, false); !s.ok()) return s;
  if (absl::Status s = CheckPointers(shape, {logits, out.expert_ids, out.weights});
      !s.ok()) {
    return s;
  }
  if (out.expert_counts == nullptr || out.prob_sums == nullptr) {
    return absl::InvalidArgumentError("expert_counts and prob_sums must be set");
  }
  const int num_experts = shape.num_experts;
  const int top_k = shape.top_k;
  std::vector<int64_t> counts(num_experts, 0);
  std::vector<double> prob_sums(num_experts, 0.0);
  std::vector<double> scores;
  for (int64_t t = 0; t < shape.num_tokens; ++t) {
    const T* row = logits + t * num_experts;
    int32_t* ids = out.expert_ids + t * top_k;
    ChooseTopK(row, num_experts, top_k, ids);
    Scores(row, num_experts, shape.score, &scores);
    double chosen_sum = 0;
    for (int j = 0; j < top_k; ++j) chosen_sum += scores[ids[j]];
    for (int j = 0; j < top_k; ++j) {
      const double w = scores[ids[j]];
      out.weights[t * top_k + j] = static_cast<T>(shape.renormalize ? w / chosen_sum : w);
      ++counts[ids[j]];
    }
    double total = 1.0;  // softmax probabilities already sum to one
    if (shape.score == ScoreFunction::kSigmoid) {
      total = 0;
      for (double s : scores) total += s;
    }
    for (int e = 0; e < num_experts; ++e) prob_sums[e] += scores[e] / total;
  }
  for (int e = 0; e < num_experts; ++e) {
    out.expert_counts[e] = static_cast<int32_t>(counts[e]);
    out.prob_sums[e] = static_cast<T>(prob_sums[e]);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status AuxLoss(const RoutingShape& shape, const int32_t* expert_counts, const T* prob_sums,
                     T* aux_loss) {
  if (absl::Status s = ValidateRoutingShape(shape, false); !s.ok()) return s;
  if (expert_counts == nullptr || prob_sums == nullptr || aux_loss == nullptr) {
    return absl::InvalidArgumentError("expert_counts, prob_sums and aux_loss must be set");
  }
  if (AuxTokens(shape) == 0) {
    *aux_loss = 0;
    return absl::OkStatus();
  }
  const double tokens = static_cast<double>(AuxTokens(shape));
  double sum = 0;
  for (int e = 0; e < shape.num_experts; ++e) {
    sum += (expert_counts[e] / (tokens * shape.top_k)) * (prob_sums[e] / tokens);
  }
  *aux_loss = static_cast<T>(shape.num_experts * sum);
  return absl::OkStatus();
}

template <typename T>
absl::Status RouteTopKBackward(const RoutingShape& shape, const T* logits,
                               const int32_t* expert_ids, const int32_t* expert_counts,
                               const T* d_weights, std::common_type_t<T> aux_loss_coef,
                               T* d_logits) {
  if (absl::Status s = ValidateRoutingShape(shape, false); !s.ok()) return s;
  if (absl::Status s =
          CheckPointers(shape, {logits, expert_ids, expert_counts, d_weights, d_logits});
      !s.ok()) {
    return s;
  }
  const int num_experts = shape.num_experts;
  const int top_k = shape.top_k;
  const double tokens = static_cast<double>(AuxTokens(shape));
  // d aux / d q[t][e] = E * f_e / T, the same for every token.
  std::vector<double> d_q(num_experts);
  for (int e = 0; e < num_experts; ++e) {
    d_q[e] = aux_loss_coef * num_experts * (expert_counts[e] / (tokens * top_k)) / tokens;
  }
  std::vector<double> scores;
  std::vector<double> d_score(num_experts);
  for (int64_t t = 0; t < shape.num_tokens; ++t) {
    const T* row = logits + t * num_experts;
    const int32_t* ids = expert_ids + t * top_k;
    const T* d_w = d_weights + t * top_k;
    Scores(row, num_experts, shape.score, &scores);
    std::fill(d_score.begin(), d_score.end(), 0.0);
    // Weight path.
    if (shape.renormalize) {
      double chosen_sum = 0;
      for (int j = 0; j < top_k; ++j) chosen_sum += scores[ids[j]];
      double weighted = 0;  // sum_i dw_i * w_i
      for (int j = 0; j < top_k; ++j) weighted += d_w[j] * (scores[ids[j]] / chosen_sum);
      for (int j = 0; j < top_k; ++j) d_score[ids[j]] += (d_w[j] - weighted) / chosen_sum;
    } else {
      for (int j = 0; j < top_k; ++j) d_score[ids[j]] += d_w[j];
    }
    T* d_row = d_logits + t * num_experts;
    if (shape.score == ScoreFunction::kSoftmax) {
      for (int e = 0; e < num_experts; ++e) d_score[e] += d_q[e];  // q = p
      double dot = 0;
      for (int e = 0; e < num_experts; ++e) dot += scores[e] * d_score[e];
      for (int e = 0; e < num_experts; ++e) {
        d_row[e] = static_cast<T>(scores[e] * (d_score[e] - dot));
      }
    } else {
      double total = 0;
      for (int e = 0; e < num_experts; ++e) total += scores[e];
      double dot = 0;  // sum_e q_e * dq_e
      for (int e = 0; e < num_experts; ++e) dot += (scores[e] / total) * d_q[e];
      for (int e = 0; e < num_experts; ++e) {
        const double ds = d_score[e] + (d_q[e] - dot) / total;
        d_row[e] = static_cast<T>(ds * scores[e] * (1.0 - scores[e]));
      }
    }
  }
  return absl::OkStatus();
}

#define DROPLESS_INSTANTIATE_ROUTING(T)                                                        \
  template absl::Status RouteTopK<T>(const RoutingShape&, const T*, const RoutingOutputsOf<T>&); \
  template absl::Status AuxLoss<T>(const RoutingShape&, const int32_t*, const T*, T*);           \
  template absl::Status RouteTopKBackward<T>(const RoutingShape&, const T*, const int32_t*,      \
                                             const int32_t*, const T*, T, T*);
DROPLESS_INSTANTIATE_ROUTING(float)
DROPLESS_INSTANTIATE_ROUTING(double)
#undef DROPLESS_INSTANTIATE_ROUTING

}  // namespace dropless::kernels::cpu
