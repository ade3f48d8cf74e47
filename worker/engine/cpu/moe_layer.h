// One MoE layer of the CPU engine on plain buffers, forward and analytic backward:
//   x_next = x + sum_j gate[t, j] * Expert_{id[t, j]}(x[t]) + sum_s Shared_s(x[t])
// Routing (top-k, aux loss and their backward), the dispatch plan, permute / unpermute-combine and
// the SwiGLU activation are the kernels' CPU references (dropless/kernels/routing.h,
// dispatch_plan.h, permute.h, swiglu.h) over T; the GEMMs are OpenBLAS (swiglu_expert.h).
// Experts other ranks own are reached through an ExpertExchange, so the same code runs one rank
// holding every expert (fp64 gradient checks) and an expert-parallel rank of a job (the engine,
// float).
#ifndef DROPLESS_WORKER_ENGINE_CPU_MOE_LAYER_H_
#define DROPLESS_WORKER_ENGINE_CPU_MOE_LAYER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/job_spec.h"
#include "worker/engine/cpu/expert_exchange.h"

namespace dropless::cpu {

struct MoeLayerShape {
  int64_t tokens = 0;  // this rank's tokens
  int64_t hidden = 0;  // H
  int64_t ffn = 0;     // F
  int64_t experts = 0; // E, routed experts of the whole layer (E / ep live on this rank)
  int64_t topk = 0;
  int64_t shared_experts = 0;
  RouterKind router = RouterKind::kSoftmax;
  bool renormalize = true;
};

// Row-major weights. Routed experts are this rank's E / ep experts, back to back.
template <typename T>
struct MoeLayerWeights {
  const T* router = nullptr;       // H x E
  const T* router_bias = nullptr;  // E logit offsets, or null (the teacher's routing skew)
  const T* expert_w1 = nullptr;    // [E / ep] x H x 2F
  const T* expert_w2 = nullptr;    // [E / ep] x F x H
  const T* shared_w1 = nullptr;    // [shared] x H x 2F
  const T* shared_w2 = nullptr;    // [shared] x F x H
};

// Gradients, overwritten by MoeLayerBackward; same shapes as the weights (no router_bias).
template <typename T>
struct MoeLayerGrads {
  T* router = nullptr;
  T* expert_w1 = nullptr;
  T* expert_w2 = nullptr;
  T* shared_w1 = nullptr;
  T* shared_w2 = nullptr;
};

// What the forward pass keeps for the backward pass, plus reusable scratch. One per layer; reusing
// it across steps avoids reallocating.
template <typename T>
struct MoeLayerCache {
  std::vector<T> logits;               // tokens x E (router logits, bias included)
  std::vector<int32_t> expert_ids;     // tokens x k
  std::vector<T> gates;                // tokens x k
  std::vector<int32_t> expert_counts;  // E: this rank's (token, slot) pairs per expert
  std::vector<T> prob_sums;            // E: this rank's sums of the aux loss's routing distribution
  // The dispatch plan (dropless/kernels/dispatch_plan.h): expert order of the (token, slot) pairs.
  std::vector<int32_t> expert_offsets;  // E + 1
  std::vector<int32_t> slot_of_choice;  // tokens x k: row of that pair in expert order
  std::vector<int32_t> choice_of_slot;  // tokens x k
  std::vector<int64_t> rows_per_expert; // E: expert_counts for the exchange
  ExchangePlan plan;
  std::vector<T> expert_in;   // received rows x H, grouped by local expert
  std::vector<T> expert_h;    // received rows x 2F
  std::vector<T> expert_a;    // received rows x F
  std::vector<T> expert_out;  // (tokens x k) x H, expert outputs back in expert order
  std::vector<T> shared_h;    // shared x tokens x 2F
  std::vector<T> shared_a;    // shared x tokens x F
  // Router statistics summed over the job: slots per expert (E), probability sums (E), tokens;
  // the counts and sums again as the routing references take them.
  std::vector<double> job_routing_stats;
  std::vector<int32_t> job_counts;
  std::vector<T> job_prob_sums;
  int64_t job_tokens = 0;
  double aux_loss = 0;

  // Scratch.
  std::vector<T> token_rows;   // (tokens x k) x H
  std::vector<T> token_sums;   // tokens x H: combined expert outputs, or row gradients summed
  std::vector<T> expert_rows;  // received rows x H
  std::vector<T> expert_rows_grad;
  std::vector<T> gate_grads;
  std::vector<T> h_grad;  // (received rows or shared x tokens) x 2F, dgrad -> wgrad
  std::vector<T> swiglu_scratch;

  int64_t BytesHeld() const;
};

// Wall time of the layer's parts, accumulated (forward and backward). The expert GEMMs (routed
// and shared, with their activations) are split by phase: forward, backward-data (dgrad: the
// input gradients, with the activation's backward) and backward-weight (wgrad).
struct MoeLayerTimes {
  double dispatch_seconds = 0;  // counts + rows to the experts (fwd), row gradients back (bwd)
  double combine_seconds = 0;   // rows back from the experts (fwd), output gradients to them (bwd)
  double gemm_forward_seconds = 0;
  double gemm_dgrad_seconds = 0;
  double gemm_wgrad_seconds = 0;

  double gemm_seconds() const {
    return gemm_forward_seconds + gemm_dgrad_seconds + gemm_wgrad_seconds;
  }
};

// Forward pass. compute_aux_loss sums the router statistics over the job (a collective, so every
// rank passes the same value) and is needed by MoeLayerBackward; the teacher skips it.
template <typename T>
absl::Status MoeLayerForward(const MoeLayerShape& shape, const MoeLayerWeights<T>& weights,
                             const T* x, bool compute_aux_loss, ExpertExchange* exchange,
                             MoeLayerCache<T>* cache, MoeLayerTimes* times, T* x_next);

// Backward pass of the objective J with x_next_grad = dJ/dx_next and aux_scale = dJ/d aux_loss:
// writes x_grad = dJ/dx (must not alias x_next_grad) and every gradient in `grads`.
template <typename T>
absl::Status MoeLayerBackward(const MoeLayerShape& shape, const MoeLayerWeights<T>& weights,
                              const T* x, const T* x_next_grad, double aux_scale,
                              ExpertExchange* exchange, MoeLayerCache<T>* cache,
                              MoeLayerTimes* times, const MoeLayerGrads<T>& grads, T* x_grad);

}  // namespace dropless::cpu

#endif  // DROPLESS_WORKER_ENGINE_CPU_MOE_LAYER_H_
