// MoeLayerGpu (moe_layer_gpu.h): the backward stages and the expert GEMMs' timing.
#include <cuda_bf16.h>

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <vector>

#include "common/status_macros.h"
#include "dropless/kernels/permute.h"
#include "dropless/kernels/swiglu.h"
#include "kernels/cuda/cuda_check.h"
#include "worker/engine/cuda/engine_kernels.h"
#include "worker/engine/cuda/moe_layer_gpu.h"

#include "dropless/kernels/fp8_block.h"
#include "worker/engine/cuda/moe_layer_gpu_internal.h"

namespace dropless::cuda_engine {
namespace {

namespace kc = kernels::cuda;
using layer_internal::Begin;
using layer_internal::End;
using layer_internal::Nv;

// Runs `hook` on the optimizer stream once everything queued so far on `after` is done.
absl::Status RunHook(const std::function<absl::Status(cudaStream_t)>& hook, const LayerStreams& s,
                     std::initializer_list<cudaStream_t> after) {
  if (!hook) return absl::OkStatus();
  for (cudaStream_t from : after) DROPLESS_RETURN_IF_ERROR(s.links->Link(from, s.optimizer));
  return hook(s.optimizer);
}

}  // namespace

absl::Status MoeLayerGpu::SharedBackward(const LayerWeights& w, const Bf16* x, const Bf16* d_x_next,
                                         const LayerGrads& grads, const LayerStreams& s) {
  const LayerDims& d = k_->dims_;
  const int64_t H = d.hidden, F = d.ffn;
  LayerKernels& k = *k_;
  const int32_t* live_rows = k.shared_offsets_ + 1;
  for (int e = 0; e < d.shared; ++e) {
    DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kGemmDgrad, s.side));
    DROPLESS_RETURN_IF_ERROR(k.shared_w2_->BackwardData(Nv(d_x_next), Nv(w.shared_w2 + e * F * H),
                                                        k.shared_offsets_, Nv(k.d_shared_a_), s.side));
    DROPLESS_RETURN_IF_ERROR(kc::SwigluBackward(kernels::SwigluShape{d.tokens, F}, live_rows,
                                                shared_h_[e], k.d_shared_a_, k.d_shared_h_, s.side));
    DROPLESS_RETURN_IF_ERROR(k.shared_w1_->BackwardData(Nv(k.d_shared_h_),
                                                        Nv(w.shared_w1 + e * H * 2 * F),
                                                        k.shared_offsets_, Nv(k.d_x_shared_[e]), s.side));
    DROPLESS_RETURN_IF_ERROR(End(s, PhaseTimer::kGemmDgrad, s.side));
    DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kGemmWgrad, s.side));
    DROPLESS_RETURN_IF_ERROR(k.shared_w2_->BackwardWeight(Nv(shared_a_[e]), Nv(d_x_next),
                                                          k.shared_offsets_,
                                                          grads.shared_w2 + e * F * H, s.side));
    DROPLESS_RETURN_IF_ERROR(k.shared_w1_->BackwardWeight(Nv(x), Nv(k.d_shared_h_), k.shared_offsets_,
                                                          grads.shared_w1 + e * H * 2 * F, s.side));
    DROPLESS_RETURN_IF_ERROR(End(s, PhaseTimer::kGemmWgrad, s.side));
  }
  return absl::OkStatus();
}

absl::Status MoeLayerGpu::BackwardCombine(const LayerWeights& w, const Bf16* x,
                                          const Bf16* d_x_next, float aux_coef,
                                          const LayerGrads& grads, const LayerStreams& s,
                                          const LayerOptimizerHooks& hooks) {
  if (k_->forward_only()) {
    return absl::FailedPreconditionError("MoeLayerGpu: a forward-only layer has no backward");
  }
  const LayerDims& d = k_->dims_;
  const int64_t T = d.tokens, H = d.hidden;
  LayerKernels& k = *k_;
  // Shared experts beside the routed path.
  DROPLESS_RETURN_IF_ERROR(s.links->Link(s.main, s.side));
  if (d.shared > 0) DROPLESS_RETURN_IF_ERROR(SharedBackward(w, x, d_x_next, grads, s));

  // Recomputed activations (the previous layer's backward has joined every reader of the
  // scratch into main): the permuted rows (the experts' input at EP = 1, read by w1's weight
  // gradient) and the SwiGLU output (w2's weight-gradient operand) from the kept w1 output, here
  // so that neither waits for the output gradients' exchange.
  // fp8_block_local recomputes the weight gradients' column-wise operands themselves.
  if (d.recompute && k.fp8_block_local()) {
    DROPLESS_RETURN_IF_ERROR(kc::PermuteFp8BlockGrouped(
        kernels::PermuteShape{T, H, d.topk}, x, choice_of_slot_, ExpertOffsets(), d.local_experts(),
        nullptr, &k.fb_col_rows_, kernels::Fp8ScaleMode::kFloat32, s.main));
    DROPLESS_RETURN_IF_ERROR(kc::SwigluForwardFp8BlockGrouped(
        kernels::SwigluShape{d.recv_rows(), d.ffn}, ExpertOffsets(), d.local_experts(), h_, nullptr,
        &k.fb_col_a_, kernels::Fp8ScaleMode::kFloat32, s.main));
  } else if (d.recompute && !k_->exchange()) {
    DROPLESS_RETURN_IF_ERROR(kc::Permute(kernels::PermuteShape{T, H, d.topk}, x, slot_of_choice_,
                                         rows_, s.main));
  }
  if (d.recompute && !k.fp8_block_local()) {
    DROPLESS_RETURN_IF_ERROR(kc::SwigluForward(
        kernels::SwigluShape{d.recv_rows(), d.ffn}, ExpertOffsets() + d.local_experts(), h_, a_,
        nullptr, s.main));
  }
  // Combine backward: gate gradients and the expert outputs' gradients.
  DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kCombine, s.main));
  // Without an exchange, fp8-block quantizes the expert outputs' gradients from d_x_next directly
  // (both forms, every expert: BackwardW2Data's operands) and the combine writes no bf16 copy.
  const bool quantize_here = k.fp8_block_local();
  DROPLESS_RETURN_IF_ERROR(kc::UnpermuteCombineBackward(
      kernels::PermuteShape{T, H, d.topk}, d_x_next, out_send_, slot_of_choice_, gates_,
      quantize_here ? nullptr : k.d_out_send_, k.d_weights_, s.main));
  DROPLESS_RETURN_IF_ERROR(End(s, PhaseTimer::kCombine, s.main));
  if (quantize_here) {
    const ExpertOperands w2 = W2(w, grads);
    DROPLESS_RETURN_IF_ERROR(kc::UnpermuteCombineBackwardFp8Block(
        kernels::PermuteShape{T, H, d.topk}, d_x_next, choice_of_slot_, gates_, ExpertOffsets(),
        d.local_experts(), w2.dy_fb, w2.dy_fb_col, kernels::Fp8ScaleMode::kFloat32, s.main));
  }

  // Router backward on the side stream once the gate gradients exist; the aux loss's gradient
  // uses the group's counts over the group's tokens (RoutingShape's aux_tokens).
  DROPLESS_RETURN_IF_ERROR(s.links->Link(s.main, s.side));
  DROPLESS_RETURN_IF_ERROR(kc::RouteTopKBackward(RoutingShape(), logits_, expert_ids_,
                                                 job_counts(), k.d_weights_, aux_coef,
                                                 k.d_logits_, s.side));
  DROPLESS_RETURN_IF_ERROR(k.router_->LogitsBackward(T, x, w.router, k.d_logits_, k.d_x_router_,
                                                     /*accumulate_d_x=*/false, k.d_router_, s.side));
  DROPLESS_RETURN_IF_ERROR(Transpose(1, d.experts, H, k.d_router_, grads.router, s.side));
  return RunHook(hooks.router_and_shared, s, {s.side});
}

absl::Status MoeLayerGpu::BackwardExperts(const LayerWeights& w, const LayerGrads& grads,
                                          const LayerStreams& s,
                                          const LayerOptimizerHooks& hooks) {
  DROPLESS_RETURN_IF_ERROR(BackwardW2Data(w, grads, LocalExperts{}, s));
  DROPLESS_RETURN_IF_ERROR(BackwardExpertsMiddle(w, grads, s, hooks));
  DROPLESS_RETURN_IF_ERROR(BackwardW1Data(w, grads, LocalExperts{}, s));
  return BackwardExpertsEnd(w, grads, s, hooks);
}

absl::Status MoeLayerGpu::WeightGradient(const ExpertOperands& o, int64_t in_cols,
                                         int64_t out_cols, bool dy_colwise,
                                         const LayerStreams& s) {
  const LayerDims& d = k_->dims_;
  const int El = d.local_experts();
  const int64_t R = d.recv_rows();
  const int32_t* live_rows = ExpertOffsets() + El;
  DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kGemmWgrad, s.wgrad));
  if (o.x == recv_rows_ && quantized_tokens()) {
    // The tokens arrived quantized: their column-wise form (the weight gradient's operand) is
    // quantized from the dequantized values, as after any FP8 dispatch.
    if (d.fp8_block()) {
      DROPLESS_RETURN_IF_ERROR(kc::DequantizeFp8BlockRowwise(
          R, in_cols, live_rows, fb_recv_.data, fb_recv_.scales, recv_rows_, s.wgrad));
    } else {
      DROPLESS_RETURN_IF_ERROR(kc::DequantizeMxfp8Rowwise(R, in_cols, live_rows, mx_recv_.data,
                                                          mx_recv_.scales, recv_rows_, s.wgrad));
    }
  }
  if (d.mxfp8()) {
    DROPLESS_RETURN_IF_ERROR(kc::QuantizeMxfp8(kernels::MxQuantizeShape{R, in_cols, El}, o.x,
                                               ExpertOffsets(), nullptr, o.x_col, s.wgrad));
    if (dy_colwise) {
      DROPLESS_RETURN_IF_ERROR(kc::QuantizeMxfp8(kernels::MxQuantizeShape{R, out_cols, El}, o.dy,
                                                 ExpertOffsets(), nullptr, o.dy_col, s.wgrad));
    }
  }
  // (Else X's column-wise form came with the permute or SwiGLU, or their recomputation.)
  if (d.fp8_block() && !k_->fp8_block_local()) {
    DROPLESS_RETURN_IF_ERROR(kc::QuantizeFp8Block(kernels::Fp8BlockQuantizeShape{R, in_cols, El},
                                                  o.x, ExpertOffsets(), nullptr, o.x_fb_col,
                                                  s.wgrad));
  }
  if (d.fp8_block() && dy_colwise) {
    DROPLESS_RETURN_IF_ERROR(kc::QuantizeFp8Block(kernels::Fp8BlockQuantizeShape{R, out_cols, El},
                                                  o.dy, ExpertOffsets(), nullptr, o.dy_fb_col,
                                                  s.wgrad));
  }
  DROPLESS_RETURN_IF_ERROR(ExpertBackwardWeight(o, s.wgrad));
  return End(s, PhaseTimer::kGemmWgrad, s.wgrad);
}

absl::Status MoeLayerGpu::BackwardW2Data(const LayerWeights& w, const LayerGrads& grads,
                                         LocalExperts run, const LayerStreams& s) {
  const LayerDims& d = k_->dims_;
  const int El = d.local_experts();
  const int64_t R = d.recv_rows(), F = d.ffn, H = d.hidden;
  const int32_t* live_rows = ExpertOffsets() + El;
  const ExpertOperands o = W2(w, grads);
  // The output gradient's row-wise form (the data gradient's operand); over every expert in one
  // pass with the column-wise form, else the run's rows only (the column-wise form then comes in
  // BackwardExpertsMiddle, once every run has arrived).
  const bool whole = Whole(run);
  const int groups = whole ? El : run.count;
  // A run's offsets (offsets + first) are for the row-wise-only quantization: the column-wise
  // output's padded offsets need the groups from the first.
  const int32_t* offsets = ExpertOffsets() + (whole ? 0 : run.first);
  if (d.mxfp8()) {
    DROPLESS_RETURN_IF_ERROR(kc::QuantizeMxfp8(kernels::MxQuantizeShape{R, H, groups}, o.dy,
                                               offsets, o.dy_mx, whole ? o.dy_col : nullptr,
                                               s.main));
  }
  if (d.fp8_block() && !k_->fp8_block_local()) {  // else BackwardCombine did
    DROPLESS_RETURN_IF_ERROR(kc::QuantizeFp8Block(kernels::Fp8BlockQuantizeShape{R, H, groups},
                                                  o.dy, offsets, o.dy_fb,
                                                  whole ? o.dy_fb_col : nullptr, s.main));
  }
  // Every expert at once: the weight gradient may start beside the data gradient (unless the
  // backward's GEMMs run one at a time: BackwardExpertsMiddle).
  if (whole && !d.serial_expert_backward) DROPLESS_RETURN_IF_ERROR(s.links->Link(s.main, s.wgrad));
  DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kGemmDgrad, s.main));
  DROPLESS_RETURN_IF_ERROR(ExpertBackwardData(Run(o, run), s.main));
  return End(s, PhaseTimer::kGemmDgrad, s.main);
}

absl::Status MoeLayerGpu::BackwardExpertsMiddle(const LayerWeights& w, const LayerGrads& grads,
                                                const LayerStreams& s,
                                                const LayerOptimizerHooks& hooks) {
  const LayerDims& d = k_->dims_;
  const int El = d.local_experts();
  const int64_t R = d.recv_rows(), F = d.ffn, H = d.hidden;
  const int32_t* live_rows = ExpertOffsets() + El;
  LayerKernels& k = *k_;
  // In chunks, the weight gradient waits for every run's output gradient (and quantizes its
  // column-wise form itself).
  // With the update fused into the weight gradient, w2's waits for its data gradient (the last
  // reader of the working copy it rewrites); so it does when the GEMMs run one at a time.
  const bool chunked = ExpertRuns(d, s).size() > 1;
  if (chunked || d.fused_expert_adamw || d.serial_expert_backward) {
    DROPLESS_RETURN_IF_ERROR(s.links->Link(s.main, s.wgrad));
  }
  DROPLESS_RETURN_IF_ERROR(WeightGradient(W2(w, grads), F, H, /*dy_colwise=*/chunked, s));
  // w2's gradient is complete and no later work reads its working copy: its update can start.
  DROPLESS_RETURN_IF_ERROR(RunHook(hooks.experts_w2, s, {s.main, s.wgrad}));
  // w1's output gradient in both forms over every expert (SwiGLU's backward is one pass; for
  // fp8-block the pass that writes them, without a bf16 form).
  const ExpertOperands w1 = W1(w, grads);
  if (d.fp8_block_fused_quantizers) {
    DROPLESS_RETURN_IF_ERROR(kc::SwigluBackwardFp8Block(kernels::SwigluShape{R, F}, ExpertOffsets(),
                                                        El, h_, k.d_a_, w1.dy_fb, w1.dy_fb_col,
                                                        kernels::Fp8ScaleMode::kFloat32, s.main));
  } else {
    DROPLESS_RETURN_IF_ERROR(
        kc::SwigluBackward(kernels::SwigluShape{R, F}, live_rows, h_, k.d_a_, k.d_h_, s.main));
  }
  if (d.mxfp8()) {
    DROPLESS_RETURN_IF_ERROR(kc::QuantizeMxfp8(kernels::MxQuantizeShape{R, 2 * F, El}, w1.dy,
                                               ExpertOffsets(), w1.dy_mx, w1.dy_col, s.main));
  }
  if (d.fp8_block() && !d.fp8_block_fused_quantizers) {
    DROPLESS_RETURN_IF_ERROR(kc::QuantizeFp8Block(kernels::Fp8BlockQuantizeShape{R, 2 * F, El},
                                                  w1.dy, ExpertOffsets(), w1.dy_fb, w1.dy_fb_col,
                                                  s.main));
  }
  // Fused: w1's weight gradient and update come after its data gradient (BackwardExpertsEnd).
  if (d.fused_expert_adamw) return absl::OkStatus();
  DROPLESS_RETURN_IF_ERROR(s.links->Link(s.main, s.wgrad));
  return WeightGradient(w1, H, 2 * F, /*dy_colwise=*/false, s);
}

absl::Status MoeLayerGpu::BackwardW1Data(const LayerWeights& w, const LayerGrads& grads,
                                         LocalExperts run, const LayerStreams& s) {
  // One at a time: after the weight gradients before it (w2's, and unfused w1's).
  if (k_->dims_.serial_expert_backward) DROPLESS_RETURN_IF_ERROR(s.links->Link(s.wgrad, s.main));
  DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kGemmDgrad, s.main));
  DROPLESS_RETURN_IF_ERROR(ExpertBackwardData(Run(W1(w, grads), run), s.main));
  return End(s, PhaseTimer::kGemmDgrad, s.main);
}

absl::Status MoeLayerGpu::BackwardExpertsEnd(const LayerWeights& w, const LayerGrads& grads,
                                             const LayerStreams& s,
                                             const LayerOptimizerHooks& hooks) {
  const LayerDims& d = k_->dims_;
  if (d.fused_expert_adamw) {
    // w1's working copy has been read for the last time: its weight gradient may rewrite it.
    DROPLESS_RETURN_IF_ERROR(s.links->Link(s.main, s.wgrad));
    DROPLESS_RETURN_IF_ERROR(WeightGradient(W1(w, grads), d.hidden, 2 * d.ffn,
                                            /*dy_colwise=*/false, s));
  }
  // w1's gradient is complete and its working copy read for the last time.
  return RunHook(hooks.experts_w1, s, {s.main, s.wgrad});
}

absl::Status MoeLayerGpu::BackwardRoute(const Bf16* d_x_next, Bf16* d_x, const LayerStreams& s) {
  const LayerDims& d = k_->dims_;
  const int64_t T = d.tokens, H = d.hidden;
  LayerKernels& k = *k_;
  DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kDispatch, s.main));
  DROPLESS_RETURN_IF_ERROR(kc::PermuteBackward(kernels::PermuteShape{T, H, d.topk}, k.d_rows_send_,
                                               slot_of_choice_, k.d_x_routed_, s.main));
  DROPLESS_RETURN_IF_ERROR(End(s, PhaseTimer::kDispatch, s.main));
  DROPLESS_RETURN_IF_ERROR(s.links->Link(s.side, s.main));
  DROPLESS_RETURN_IF_ERROR(s.links->Link(s.wgrad, s.main));
  std::vector<const Bf16*> terms = {d_x_next, k.d_x_routed_, k.d_x_router_};
  for (int e = 0; e < d.shared; ++e) terms.push_back(k.d_x_shared_[e]);
  return SumBf16(T * H, terms, d_x, s.main);
}

absl::Status MoeLayerGpu::Backward(const LayerWeights& w, const Bf16* x, const Bf16* d_x_next,
                                   float aux_coef, const LayerGrads& grads, Bf16* d_x,
                                   const LayerStreams& s, const LayerOptimizerHooks& hooks) {
  if (k_->exchange()) {
    return absl::FailedPreconditionError("MoeLayerGpu::Backward is the layer without a dispatcher; "
                                         "with one it runs in stages (moe_layer_group.h)");
  }
  DROPLESS_RETURN_IF_ERROR(BackwardCombine(w, x, d_x_next, aux_coef, grads, s, hooks));
  DROPLESS_RETURN_IF_ERROR(BackwardExperts(w, grads, s, hooks));
  return BackwardRoute(d_x_next, d_x, s);
}

absl::Status MoeLayerGpu::TimeExpertGemms(const LayerWeights& w, const LayerGrads& grads,
                                          int iterations, cudaStream_t stream, double seconds[3]) {
  // The GEMMs alone: with fused_expert_adamw the weight gradient is timed unfused, so that timing
  // updates no weight, into a scratch gradient that lives only while timing (the fused step keeps
  // no routed-expert gradient).
  LayerGrads plain = grads;
  plain.adamw_step = nullptr;
  float* scratch = nullptr;
  if (plain.w1 == nullptr && plain.w1_bf16 == nullptr) {
    const LayerDims& d = k_->dims_;
    const int64_t w1_values = int64_t{d.local_experts()} * d.hidden * 2 * d.ffn;  // >= w2's
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch, w1_values * sizeof(float)));
    plain.w1 = plain.w2 = scratch;
  }
  const ExpertOperands w1 = W1(w, plain), w2 = W2(w, plain);
  auto forward = [&]() -> absl::Status {
    DROPLESS_RETURN_IF_ERROR(ExpertForward(w1, stream));
    return ExpertForward(w2, stream);
  };
  auto dgrad = [&]() -> absl::Status {
    DROPLESS_RETURN_IF_ERROR(ExpertBackwardData(w2, stream));
    return ExpertBackwardData(w1, stream);
  };
  auto wgrad = [&]() -> absl::Status {
    DROPLESS_RETURN_IF_ERROR(ExpertBackwardWeight(w2, stream));
    return ExpertBackwardWeight(w1, stream);
  };
  cudaEvent_t begin = nullptr, end = nullptr;
  absl::Status status = kc::CudaStatus(cudaEventCreate(&begin), "cudaEventCreate");
  if (status.ok()) status = kc::CudaStatus(cudaEventCreate(&end), "cudaEventCreate");
  const std::function<absl::Status()> products[3] = {forward, dgrad, wgrad};
  for (int product = 0; product < 3 && status.ok(); ++product) {
    status = products[product]();  // warm
    if (status.ok()) status = kc::CudaStatus(cudaEventRecord(begin, stream), "cudaEventRecord");
    for (int i = 0; i < iterations && status.ok(); ++i) status = products[product]();
    if (status.ok()) status = kc::CudaStatus(cudaEventRecord(end, stream), "cudaEventRecord");
    if (status.ok()) status = kc::CudaStatus(cudaEventSynchronize(end), "cudaEventSynchronize");
    float ms = 0;
    if (status.ok()) status = kc::CudaStatus(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
    seconds[product] = ms * 1e-3 / std::max(1, iterations);
  }
  // Teardown: the timing's status is the one to report.
  if (begin != nullptr) (void)cudaEventDestroy(begin);
  if (end != nullptr) (void)cudaEventDestroy(end);
  if (scratch != nullptr) (void)cudaFree(scratch);
  return status;
}

}  // namespace dropless::cuda_engine
