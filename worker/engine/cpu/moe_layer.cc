#include "worker/engine/cpu/moe_layer.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/step_phase.h"
#include "dropless/kernels/dispatch_plan.h"
#include "dropless/kernels/permute.h"
#include "dropless/kernels/routing.h"
#include "worker/engine/cpu/blas_gemm.h"
#include "worker/engine/cpu/swiglu_expert.h"

namespace dropless::cpu {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

template <typename V>
int64_t VectorBytes(const V& v) {
  return static_cast<int64_t>(v.capacity() * sizeof(typename V::value_type));
}

absl::Status CheckShape(const MoeLayerShape& shape, const ExpertExchange& exchange) {
  if (shape.tokens < 0 || shape.hidden <= 0 || shape.ffn <= 0 || shape.experts <= 0 ||
      shape.topk <= 0 || shape.topk > shape.experts || shape.shared_experts < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "moe layer: bad shape (tokens %d, hidden %d, ffn %d, experts %d, topk %d, shared %d)",
        shape.tokens, shape.hidden, shape.ffn, shape.experts, shape.topk,
        shape.shared_experts));
  }
  if (shape.experts % exchange.ep_size() != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "moe layer: %d experts do not split over %d EP ranks", shape.experts,
        exchange.ep_size()));
  }
  return absl::OkStatus();
}

namespace kc = kernels::cpu;

kernels::RoutingShape ToRoutingShape(const MoeLayerShape& shape) {
  kernels::RoutingShape r;
  r.num_tokens = shape.tokens;
  r.num_experts = static_cast<int>(shape.experts);
  r.top_k = static_cast<int>(shape.topk);
  r.score = shape.router == RouterKind::kSigmoid ? kernels::ScoreFunction::kSigmoid
                                                 : kernels::ScoreFunction::kSoftmax;
  r.renormalize = shape.renormalize;
  return r;
}

kernels::PermuteShape ToPermuteShape(const MoeLayerShape& shape) {
  return kernels::PermuteShape{shape.tokens, shape.hidden, static_cast<int>(shape.topk)};
}

// out = a + b, elementwise over n values.
template <typename T>
void AddInto(int64_t n, const T* a, const T* b, T* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace

template <typename T>
int64_t MoeLayerCache<T>::BytesHeld() const {
  return VectorBytes(logits) + VectorBytes(expert_ids) + VectorBytes(gates) +
         VectorBytes(expert_counts) + VectorBytes(prob_sums) + VectorBytes(expert_offsets) +
         VectorBytes(slot_of_choice) + VectorBytes(choice_of_slot) + VectorBytes(rows_per_expert) +
         VectorBytes(expert_in) + VectorBytes(expert_h) + VectorBytes(expert_a) +
         VectorBytes(expert_out) + VectorBytes(shared_h) + VectorBytes(shared_a) +
         VectorBytes(job_routing_stats) + VectorBytes(job_counts) + VectorBytes(job_prob_sums) +
         VectorBytes(token_rows) + VectorBytes(token_sums) + VectorBytes(expert_rows) +
         VectorBytes(expert_rows_grad) + VectorBytes(gate_grads) + VectorBytes(h_grad) +
         VectorBytes(swiglu_scratch);
}

template <typename T>
absl::Status MoeLayerForward(const MoeLayerShape& shape, const MoeLayerWeights<T>& weights,
                             const T* x, bool compute_aux_loss, ExpertExchange* exchange,
                             MoeLayerCache<T>* cache, MoeLayerTimes* times, T* x_next) {
  if (absl::Status status = CheckShape(shape, *exchange); !status.ok()) return status;
  const int64_t tokens = shape.tokens, hidden = shape.hidden, ffn = shape.ffn;
  const int64_t experts = shape.experts, k = shape.topk;
  const int64_t local_experts = experts / exchange->ep_size();
  const size_t row_bytes = static_cast<size_t>(hidden) * sizeof(T);
  MoeLayerCache<T>& c = *cache;

  // Router and top-k.
  kernels::RoutingShape routing = ToRoutingShape(shape);
  c.logits.resize(tokens * experts);
  Gemm<T>(false, false, tokens, experts, hidden, T(1), x, hidden, weights.router, experts, T(0),
          c.logits.data(), experts);
  if (weights.router_bias != nullptr) {
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t e = 0; e < experts; ++e) c.logits[t * experts + e] += weights.router_bias[e];
    }
  }
  c.expert_ids.resize(tokens * k);
  c.gates.resize(tokens * k);
  c.expert_counts.resize(experts);
  c.prob_sums.resize(experts);
  DROPLESS_RETURN_IF_ERROR(kc::RouteTopK<T>(
      routing, c.logits.data(),
      {c.expert_ids.data(), c.gates.data(), c.expert_counts.data(), c.prob_sums.data()}));

  c.aux_loss = 0;
  c.job_routing_stats.clear();
  if (compute_aux_loss) {
    c.job_routing_stats.assign(2 * experts + 1, 0.0);
    for (int64_t e = 0; e < experts; ++e) {
      c.job_routing_stats[e] = c.expert_counts[e];
      c.job_routing_stats[experts + e] = static_cast<double>(c.prob_sums[e]);
    }
    c.job_routing_stats[2 * experts] = static_cast<double>(tokens);
    DROPLESS_RETURN_IF_ERROR(exchange->SumOverJob(absl::MakeSpan(c.job_routing_stats)));
    c.job_counts.resize(experts);
    c.job_prob_sums.resize(experts);
    for (int64_t e = 0; e < experts; ++e) {
      c.job_counts[e] = static_cast<int32_t>(c.job_routing_stats[e]);
      c.job_prob_sums[e] = static_cast<T>(c.job_routing_stats[experts + e]);
    }
    c.job_tokens = static_cast<int64_t>(c.job_routing_stats[2 * experts]);
    routing.aux_tokens = c.job_tokens;
    T aux = 0;
    DROPLESS_RETURN_IF_ERROR(
        kc::AuxLoss<T>(routing, c.job_counts.data(), c.job_prob_sums.data(), &aux));
    c.aux_loss = static_cast<double>(aux);
  }

  // Permute into expert order and dispatch to the experts' ranks.
  c.expert_offsets.resize(experts + 1);
  c.slot_of_choice.resize(tokens * k);
  c.choice_of_slot.resize(tokens * k);
  DROPLESS_RETURN_IF_ERROR(kc::BuildDispatchPlan(
      kernels::DispatchPlanShape{tokens, static_cast<int>(experts), static_cast<int>(k)},
      c.expert_ids.data(),
      {c.expert_offsets.data(), c.slot_of_choice.data(), c.choice_of_slot.data()}, nullptr));
  c.rows_per_expert.resize(experts);
  for (int64_t e = 0; e < experts; ++e) {
    c.rows_per_expert[e] = c.expert_offsets[e + 1] - c.expert_offsets[e];
  }
  const kernels::PermuteShape permute = ToPermuteShape(shape);
  c.token_rows.resize(tokens * k * hidden);
  DROPLESS_RETURN_IF_ERROR(
      kc::Permute<T>(permute, x, c.slot_of_choice.data(), c.token_rows.data()));
  EnterStepPhase(StepPhase::kDispatch);
  Clock::time_point start = Clock::now();
  absl::StatusOr<ExchangePlan> plan = exchange->Plan(c.rows_per_expert);
  if (!plan.ok()) return plan.status();
  c.plan = *std::move(plan);
  const int64_t received = c.plan.total_recv_rows;
  c.expert_in.resize(received * hidden);
  absl::Status status =
      exchange->Dispatch(c.plan, c.token_rows.data(), row_bytes, c.expert_in.data());
  times->dispatch_seconds += SecondsSince(start);
  if (!status.ok()) return status;

  // Local experts on their variable-size groups.
  EnterStepPhase(StepPhase::kGemm);
  start = Clock::now();
  c.expert_h.resize(received * 2 * ffn);
  c.expert_a.resize(received * ffn);
  c.expert_rows.resize(received * hidden);
  int64_t offset = 0;
  for (int64_t e = 0; e < local_experts; ++e) {
    const int64_t rows = c.plan.rows_per_local_expert[e];
    DROPLESS_RETURN_IF_ERROR(SwiGluForward<T>(
        SwiGluShape{rows, hidden, ffn}, weights.expert_w1 + e * hidden * 2 * ffn,
        weights.expert_w2 + e * ffn * hidden, c.expert_in.data() + offset * hidden,
        c.expert_h.data() + offset * 2 * ffn, c.expert_a.data() + offset * ffn,
        c.expert_rows.data() + offset * hidden, T(0)));
    offset += rows;
  }
  times->gemm_forward_seconds += SecondsSince(start);

  // Combine: outputs back to their tokens' rank, weighted by the gates.
  EnterStepPhase(StepPhase::kCombine);
  start = Clock::now();
  c.expert_out.resize(tokens * k * hidden);
  status = exchange->Combine(c.plan, c.expert_rows.data(), row_bytes, c.expert_out.data());
  times->combine_seconds += SecondsSince(start);
  if (!status.ok()) return status;
  EnterStepPhase(StepPhase::kForward);
  c.token_sums.resize(tokens * hidden);
  DROPLESS_RETURN_IF_ERROR(kc::UnpermuteCombine<T>(permute, c.expert_out.data(),
                                                   c.slot_of_choice.data(), c.gates.data(),
                                                   c.token_sums.data()));
  AddInto(tokens * hidden, x, c.token_sums.data(), x_next);

  // Shared experts see every token.
  start = Clock::now();
  c.shared_h.resize(shape.shared_experts * tokens * 2 * ffn);
  c.shared_a.resize(shape.shared_experts * tokens * ffn);
  for (int64_t s = 0; s < shape.shared_experts; ++s) {
    DROPLESS_RETURN_IF_ERROR(SwiGluForward<T>(
        SwiGluShape{tokens, hidden, ffn}, weights.shared_w1 + s * hidden * 2 * ffn,
        weights.shared_w2 + s * ffn * hidden, x, c.shared_h.data() + s * tokens * 2 * ffn,
        c.shared_a.data() + s * tokens * ffn, x_next, T(1)));
  }
  times->gemm_forward_seconds += SecondsSince(start);
  return absl::OkStatus();
}

template <typename T>
absl::Status MoeLayerBackward(const MoeLayerShape& shape, const MoeLayerWeights<T>& weights,
                              const T* x, const T* x_next_grad, double aux_scale,
                              ExpertExchange* exchange, MoeLayerCache<T>* cache,
                              MoeLayerTimes* times, const MoeLayerGrads<T>& grads, T* x_grad) {
  if (absl::Status status = CheckShape(shape, *exchange); !status.ok()) return status;
  const int64_t tokens = shape.tokens, hidden = shape.hidden, ffn = shape.ffn;
  const int64_t experts = shape.experts, k = shape.topk;
  const int64_t local_experts = experts / exchange->ep_size();
  const size_t row_bytes = static_cast<size_t>(hidden) * sizeof(T);
  MoeLayerCache<T>& c = *cache;
  if (c.job_routing_stats.size() != static_cast<size_t>(2 * experts + 1)) {
    return absl::FailedPreconditionError(
        "moe layer: backward needs a forward pass with compute_aux_loss");
  }
  const int64_t received = c.plan.total_recv_rows;

  // Combine backward: gate gradients here, row gradients to the experts' ranks.
  c.gate_grads.resize(tokens * k);
  c.token_rows.resize(tokens * k * hidden);
  const kernels::PermuteShape permute = ToPermuteShape(shape);
  DROPLESS_RETURN_IF_ERROR(kc::UnpermuteCombineBackward<T>(
      permute, x_next_grad, c.expert_out.data(), c.slot_of_choice.data(), c.gates.data(),
      c.token_rows.data(), c.gate_grads.data()));
  EnterStepPhase(StepPhase::kCombine);
  Clock::time_point start = Clock::now();
  c.expert_rows.resize(received * hidden);
  absl::Status status =
      exchange->Dispatch(c.plan, c.token_rows.data(), row_bytes, c.expert_rows.data());
  times->combine_seconds += SecondsSince(start);
  if (!status.ok()) return status;

  // Local experts backward: every group's data gradient, then every group's weight gradient.
  EnterStepPhase(StepPhase::kGemm);
  start = Clock::now();
  c.expert_rows_grad.resize(received * hidden);
  c.h_grad.resize(received * 2 * ffn);
  int64_t offset = 0;
  for (int64_t e = 0; e < local_experts; ++e) {
    const int64_t rows = c.plan.rows_per_local_expert[e];
    DROPLESS_RETURN_IF_ERROR(SwiGluBackwardData<T>(
        SwiGluShape{rows, hidden, ffn}, weights.expert_w1 + e * hidden * 2 * ffn,
        weights.expert_w2 + e * ffn * hidden, c.expert_h.data() + offset * 2 * ffn,
        c.expert_rows.data() + offset * hidden, c.h_grad.data() + offset * 2 * ffn,
        c.expert_rows_grad.data() + offset * hidden, T(0), &c.swiglu_scratch));
    offset += rows;
  }
  times->gemm_dgrad_seconds += SecondsSince(start);
  start = Clock::now();
  offset = 0;
  for (int64_t e = 0; e < local_experts; ++e) {
    const int64_t rows = c.plan.rows_per_local_expert[e];
    SwiGluBackwardWeights<T>(SwiGluShape{rows, hidden, ffn}, c.expert_in.data() + offset * hidden,
                             c.expert_a.data() + offset * ffn,
                             c.expert_rows.data() + offset * hidden,
                             c.h_grad.data() + offset * 2 * ffn,
                             grads.expert_w1 + e * hidden * 2 * ffn,
                             grads.expert_w2 + e * ffn * hidden);
    offset += rows;
  }
  times->gemm_wgrad_seconds += SecondsSince(start);

  // Dispatch backward: input-row gradients back to their tokens.
  EnterStepPhase(StepPhase::kDispatch);
  start = Clock::now();
  status = exchange->Combine(c.plan, c.expert_rows_grad.data(), row_bytes, c.token_rows.data());
  times->dispatch_seconds += SecondsSince(start);
  if (!status.ok()) return status;
  EnterStepPhase(StepPhase::kBackward);
  c.token_sums.resize(tokens * hidden);
  DROPLESS_RETURN_IF_ERROR(kc::PermuteBackward<T>(permute, c.token_rows.data(),
                                                  c.slot_of_choice.data(), c.token_sums.data()));
  AddInto(tokens * hidden, x_next_grad, c.token_sums.data(), x_grad);  // the residual path too

  // Shared experts backward, the same two phases.
  start = Clock::now();
  c.h_grad.resize(shape.shared_experts * tokens * 2 * ffn);
  for (int64_t s = 0; s < shape.shared_experts; ++s) {
    DROPLESS_RETURN_IF_ERROR(SwiGluBackwardData<T>(
        SwiGluShape{tokens, hidden, ffn}, weights.shared_w1 + s * hidden * 2 * ffn,
        weights.shared_w2 + s * ffn * hidden, c.shared_h.data() + s * tokens * 2 * ffn,
        x_next_grad, c.h_grad.data() + s * tokens * 2 * ffn, x_grad, T(1), &c.swiglu_scratch));
  }
  times->gemm_dgrad_seconds += SecondsSince(start);
  start = Clock::now();
  for (int64_t s = 0; s < shape.shared_experts; ++s) {
    SwiGluBackwardWeights<T>(SwiGluShape{tokens, hidden, ffn}, x,
                             c.shared_a.data() + s * tokens * ffn, x_next_grad,
                             c.h_grad.data() + s * tokens * 2 * ffn,
                             grads.shared_w1 + s * hidden * 2 * ffn,
                             grads.shared_w2 + s * ffn * hidden);
  }
  times->gemm_wgrad_seconds += SecondsSince(start);

  // Router backward (the aux loss over the job's statistics); the logit gradients reuse scratch.
  std::vector<T>& logit_grads = c.expert_rows;
  logit_grads.resize(std::max<size_t>(logit_grads.size(), tokens * experts));
  kernels::RoutingShape routing = ToRoutingShape(shape);
  routing.aux_tokens = c.job_tokens;
  DROPLESS_RETURN_IF_ERROR(kc::RouteTopKBackward<T>(
      routing, c.logits.data(), c.expert_ids.data(), c.job_counts.data(), c.gate_grads.data(),
      static_cast<T>(aux_scale), logit_grads.data()));
  Gemm<T>(true, false, hidden, experts, tokens, T(1), x, hidden, logit_grads.data(), experts, T(0),
          grads.router, experts);
  Gemm<T>(false, true, tokens, hidden, experts, T(1), logit_grads.data(), experts, weights.router,
          experts, T(1), x_grad, hidden);
  return absl::OkStatus();
}

#define DROPLESS_INSTANTIATE_MOE_LAYER(T)                                                     \
  template struct MoeLayerCache<T>;                                                           \
  template absl::Status MoeLayerForward<T>(const MoeLayerShape&, const MoeLayerWeights<T>&,    \
                                           const T*, bool, ExpertExchange*, MoeLayerCache<T>*, \
                                           MoeLayerTimes*, T*);                               \
  template absl::Status MoeLayerBackward<T>(const MoeLayerShape&, const MoeLayerWeights<T>&,   \
                                            const T*, const T*, double, ExpertExchange*,       \
                                            MoeLayerCache<T>*, MoeLayerTimes*,                 \
                                            const MoeLayerGrads<T>&, T*);
DROPLESS_INSTANTIATE_MOE_LAYER(float)
DROPLESS_INSTANTIATE_MOE_LAYER(double)
#undef DROPLESS_INSTANTIATE_MOE_LAYER

}  // namespace dropless::cpu
