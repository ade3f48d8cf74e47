#include "worker/engine/cuda/moe_layer_gpu.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_format.h"
#include "dropless/kernels/dispatch_plan.h"
#include "dropless/kernels/permute.h"
#include "dropless/kernels/swiglu.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "worker/engine/cuda/engine_kernels.h"

namespace dropless::cuda_engine {
namespace {

namespace kc = kernels::cuda;
using Phase = PhaseTimer::Phase;

const __nv_bfloat16* Nv(const Bf16* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }
__nv_bfloat16* Nv(Bf16* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

// Phase spans are optional (the timer may be null).
absl::Status Begin(const LayerStreams& s, Phase phase, cudaStream_t stream) {
  return s.timer == nullptr ? absl::OkStatus() : s.timer->Begin(phase, stream);
}
absl::Status End(const LayerStreams& s, Phase phase, cudaStream_t stream) {
  return s.timer == nullptr ? absl::OkStatus() : s.timer->End(phase, stream);
}

absl::Status AllocRowwise(DeviceArena* arena, int64_t rows, int64_t cols, kernels::MxRowwise* out) {
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(rows * cols, "mxfp8 rows", &out->data));
  return arena->Allocate(rows * (cols / kernels::kMxBlock), "mxfp8 row scales", &out->scales);
}

absl::Status AllocColwise(DeviceArena* arena, int64_t padded_rows, int64_t cols, int groups,
                          kernels::MxColwise* out) {
  out->padded_rows = padded_rows;
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(padded_rows * cols, "mxfp8 columns", &out->data));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(padded_rows / kernels::kMxBlock * cols, "mxfp8 column scales",
                        &out->scales));
  return arena->Allocate(groups + 1, "mxfp8 padded offsets", &out->group_offsets);
}

}  // namespace

absl::StatusOr<std::unique_ptr<LayerKernels>> LayerKernels::Create(const LayerDims& d,
                                                                   DeviceArena* arena) {
  auto k = std::unique_ptr<LayerKernels>(new LayerKernels());
  k->dims_ = d;
  const int64_t T = d.tokens, H = d.hidden, F = d.ffn, Tk = d.rows();
  absl::StatusOr<std::unique_ptr<kc::RouterGemm>> router =
      kc::RouterGemm::Create(kernels::RouterGemmShape{T, H, d.experts});
  if (!router.ok()) return router.status();
  k->router_ = *std::move(router);

  auto grouped = [&](int groups, int64_t kdim, int64_t ndim, int64_t max_rows,
                     kernels::GradType grad_type,
                     std::unique_ptr<kernels::GroupedGemm>* out) -> absl::Status {
    kernels::GroupedGemmOptions o;
    o.num_groups = groups;
    o.k = static_cast<int>(kdim);
    o.n = static_cast<int>(ndim);
    o.max_rows = max_rows;
    o.expected_rows_per_group = std::max<int64_t>(1, max_rows / groups);
    o.weight_grad_type = grad_type;
    absl::StatusOr<std::unique_ptr<kernels::GroupedGemm>> g = kernels::GroupedGemm::Create(o);
    if (!g.ok()) return g.status();
    *out = *std::move(g);
    return absl::OkStatus();
  };
  DROPLESS_RETURN_IF_ERROR(grouped(d.experts, H, 2 * F, Tk, kernels::GradType::kFloat32, &k->w1_));
  DROPLESS_RETURN_IF_ERROR(grouped(d.experts, F, H, Tk, kernels::GradType::kFloat32, &k->w2_));
  if (d.shared > 0) {
    DROPLESS_RETURN_IF_ERROR(grouped(1, H, 2 * F, T, kernels::GradType::kFloat32, &k->shared_w1_));
    DROPLESS_RETURN_IF_ERROR(grouped(1, F, H, T, kernels::GradType::kFloat32, &k->shared_w2_));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(2, "shared expert offsets", &k->shared_offsets_));
    const int32_t offsets[2] = {0, static_cast<int32_t>(T)};
    DROPLESS_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(k->shared_offsets_, offsets, sizeof(offsets), cudaMemcpyHostToDevice));
  }
  const kernels::DispatchPlanShape plan_shape{T, d.experts, d.topk};
  DROPLESS_RETURN_IF_ERROR(kernels::ValidateDispatchPlanShape(plan_shape));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(static_cast<int64_t>(kernels::DispatchPlanWorkspaceBytes(plan_shape)),
                        "dispatch plan workspace", reinterpret_cast<uint8_t**>(&k->plan_workspace_)));

  DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * H, "combined output", &k->combined_));
  k->shared_out_.resize(d.shared);
  k->d_x_shared_.resize(d.shared);
  for (int s = 0; s < d.shared; ++s) {
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * H, "shared expert output", &k->shared_out_[s]));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * H, "shared expert input gradient", &k->d_x_shared_[s]));
  }
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk * H, "expert output gradient", &k->d_out_rows_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk * F, "activation gradient", &k->d_a_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk * 2 * F, "w1 output gradient", &k->d_h_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk * H, "expert input gradient", &k->d_rows_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * H, "routed input gradient", &k->d_x_routed_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * H, "router input gradient", &k->d_x_router_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * d.topk, "gate gradient", &k->d_weights_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * d.experts, "logit gradient", &k->d_logits_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(int64_t{d.experts} * H, "router weight gradient", &k->d_router_));
  if (d.shared > 0) {
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * F, "shared activation gradient", &k->d_shared_a_));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * 2 * F, "shared w1 output gradient", &k->d_shared_h_));
  }

  if (d.mxfp8) {
    auto mx = [&](int64_t kdim, int64_t ndim, std::unique_ptr<kernels::MxGroupedGemm>* out) {
      kernels::MxGroupedGemmOptions o;
      o.num_groups = d.experts;
      o.k = static_cast<int>(kdim);
      o.n = static_cast<int>(ndim);
      o.max_rows = Tk;
      o.expected_rows_per_group = std::max<int64_t>(1, Tk / d.experts);
      absl::StatusOr<std::unique_ptr<kernels::MxGroupedGemm>> g = kernels::MxGroupedGemm::Create(o);
      if (!g.ok()) return g.status();
      *out = *std::move(g);
      return absl::OkStatus();
    };
    DROPLESS_RETURN_IF_ERROR(mx(H, 2 * F, &k->mx_w1_));
    DROPLESS_RETURN_IF_ERROR(mx(F, H, &k->mx_w2_));
    k->padded_rows_ = kernels::ColwisePaddedRows(Tk, d.experts);
    DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, Tk, H, &k->mx_rows_));
    DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, Tk, F, &k->mx_a_));
    DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, Tk, H, &k->mx_d_out_));
    DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, Tk, 2 * F, &k->mx_d_h_));
    DROPLESS_RETURN_IF_ERROR(AllocColwise(arena, k->padded_rows_, H, d.experts, &k->col_rows_));
    DROPLESS_RETURN_IF_ERROR(AllocColwise(arena, k->padded_rows_, F, d.experts, &k->col_a_));
    DROPLESS_RETURN_IF_ERROR(AllocColwise(arena, k->padded_rows_, H, d.experts, &k->col_d_out_));
    DROPLESS_RETURN_IF_ERROR(AllocColwise(arena, k->padded_rows_, 2 * F, d.experts, &k->col_d_h_));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(int64_t{d.experts} * H * 2 * F, "weight transpose scratch",
                          &k->transpose_scratch_));
  }
  return k;
}

absl::StatusOr<MxWeight> LayerKernels::AllocateMxWeight(int64_t kdim, int64_t ndim,
                                                        DeviceArena* arena) const {
  const int64_t n = int64_t{dims_.experts} * kdim * ndim;
  MxWeight w;
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(n, "mxfp8 weight (along n)", &w.along_n));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(n / kernels::kMxBlock, "mxfp8 weight scales", &w.along_n_scales));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(n, "mxfp8 weight (along k)", &w.along_k));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(n / kernels::kMxBlock, "mxfp8 weight scales", &w.along_k_scales));
  return w;
}

absl::Status LayerKernels::QuantizeWeight(const Bf16* w, int64_t kdim, int64_t ndim,
                                          const MxWeight& out, cudaStream_t stream) {
  const int64_t E = dims_.experts;
  kernels::MxRowwise along_n{out.along_n, out.along_n_scales};
  DROPLESS_RETURN_IF_ERROR(kc::QuantizeMxfp8(kernels::MxQuantizeShape{E * kdim, ndim, 1}, w, nullptr,
                                    &along_n, nullptr, stream));
  DROPLESS_RETURN_IF_ERROR(Transpose(E, kdim, ndim, w, transpose_scratch_, stream));
  kernels::MxRowwise along_k{out.along_k, out.along_k_scales};
  return kc::QuantizeMxfp8(kernels::MxQuantizeShape{E * ndim, kdim, 1}, transpose_scratch_,
                           nullptr, &along_k, nullptr, stream);
}

absl::StatusOr<std::unique_ptr<MoeLayerGpu>> MoeLayerGpu::Create(LayerKernels* kernels,
                                                                 DeviceArena* arena) {
  auto layer = std::unique_ptr<MoeLayerGpu>(new MoeLayerGpu(kernels));
  const LayerDims& d = kernels->dims_;
  const int64_t T = d.tokens, H = d.hidden, F = d.ffn, Tk = d.rows(), E = d.experts;
  MoeLayerGpu& l = *layer;
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * E, "router logits", &l.logits_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk, "expert ids", &l.expert_ids_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk, "gates", &l.gates_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(E, "expert counts", &l.counts_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(E, "probability sums", &l.prob_sums_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(E + 1, "expert offsets", &l.offsets_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk, "slot of choice", &l.slot_of_choice_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk, "choice of slot", &l.choice_of_slot_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk * H, "permuted rows", &l.rows_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk * 2 * F, "w1 output", &l.h_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk * F, "SwiGLU output", &l.a_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk * H, "expert output", &l.out_rows_));
  l.shared_h_.resize(d.shared);
  l.shared_a_.resize(d.shared);
  for (int s = 0; s < d.shared; ++s) {
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * 2 * F, "shared w1 output", &l.shared_h_[s]));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * F, "shared SwiGLU output", &l.shared_a_[s]));
  }
  return layer;
}

kernels::RoutingShape MoeLayerGpu::RoutingShape() const {
  const LayerDims& d = k_->dims_;
  return kernels::RoutingShape{d.tokens, d.experts, d.topk, d.score, d.renormalize};
}

absl::Status MoeLayerGpu::SharedForward(const LayerWeights& w, const Bf16* x,
                                        const LayerStreams& s) {
  const LayerDims& d = k_->dims_;
  const int64_t H = d.hidden, F = d.ffn;
  const int32_t* live_rows = k_->shared_offsets_ + 1;
  DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kGemmForward, s.side));
  for (int e = 0; e < d.shared; ++e) {
    DROPLESS_RETURN_IF_ERROR(k_->shared_w1_->Forward(Nv(x), Nv(w.shared_w1 + e * H * 2 * F),
                                            k_->shared_offsets_, Nv(shared_h_[e]), s.side));
    DROPLESS_RETURN_IF_ERROR(kc::SwigluForward(kernels::SwigluShape{d.tokens, F}, live_rows, shared_h_[e],
                                      shared_a_[e], nullptr, s.side));
    DROPLESS_RETURN_IF_ERROR(k_->shared_w2_->Forward(Nv(shared_a_[e]), Nv(w.shared_w2 + e * F * H),
                                            k_->shared_offsets_, Nv(k_->shared_out_[e]), s.side));
  }
  return End(s, PhaseTimer::kGemmForward, s.side);
}

// The operands of one routed expert weight's three products (w1: rows -> h; w2: a -> out_rows).
struct MoeLayerGpu::ExpertOperands {
  kernels::GroupedGemm* gemm;
  kernels::MxGroupedGemm* mx_gemm;
  const Bf16* w;
  const MxWeight* mx_w;
  float* dw;
  const Bf16* x;                   // forward input
  const kernels::MxRowwise* x_mx;  // its row-wise MXFP8 (mxfp8)
  const kernels::MxColwise* x_col; // its column-wise MXFP8 (mxfp8, weight gradient)
  Bf16* y;                         // forward output
  const Bf16* dy;                  // output gradient
  const kernels::MxRowwise* dy_mx;
  const kernels::MxColwise* dy_col;
  Bf16* dx;                        // input gradient
};

MoeLayerGpu::ExpertOperands MoeLayerGpu::W1(const LayerWeights& w, const LayerGrads& g) {
  LayerKernels& k = *k_;
  return ExpertOperands{k.w1_.get(), k.mx_w1_.get(), w.w1, &w.mx_w1, g.w1, rows_, &k.mx_rows_,
                        &k.col_rows_, h_, k.d_h_, &k.mx_d_h_, &k.col_d_h_, k.d_rows_};
}

MoeLayerGpu::ExpertOperands MoeLayerGpu::W2(const LayerWeights& w, const LayerGrads& g) {
  LayerKernels& k = *k_;
  return ExpertOperands{k.w2_.get(), k.mx_w2_.get(), w.w2, &w.mx_w2, g.w2, a_, &k.mx_a_,
                        &k.col_a_, out_rows_, k.d_out_rows_, &k.mx_d_out_, &k.col_d_out_, k.d_a_};
}

absl::Status MoeLayerGpu::ExpertForward(const ExpertOperands& o, cudaStream_t stream) {
  if (k_->dims_.mxfp8) {
    return o.mx_gemm->Forward({o.x_mx->data, o.x_mx->scales},
                              {o.mx_w->along_k, o.mx_w->along_k_scales}, offsets_, o.y, stream);
  }
  return o.gemm->Forward(Nv(o.x), Nv(o.w), offsets_, Nv(o.y), stream);
}

absl::Status MoeLayerGpu::ExpertBackwardData(const ExpertOperands& o, cudaStream_t stream) {
  if (k_->dims_.mxfp8) {
    return o.mx_gemm->BackwardData({o.dy_mx->data, o.dy_mx->scales},
                                   {o.mx_w->along_n, o.mx_w->along_n_scales}, offsets_, o.dx,
                                   stream);
  }
  return o.gemm->BackwardData(Nv(o.dy), Nv(o.w), offsets_, Nv(o.dx), stream);
}

absl::Status MoeLayerGpu::ExpertBackwardWeight(const ExpertOperands& o, cudaStream_t stream) {
  if (k_->dims_.mxfp8) {
    return o.mx_gemm->BackwardWeight({o.x_col->data, o.x_col->scales},
                                     {o.dy_col->data, o.dy_col->scales},
                                     o.x_col->group_offsets, o.dw, stream);
  }
  return o.gemm->BackwardWeight(Nv(o.x), Nv(o.dy), offsets_, o.dw, stream);
}

absl::Status MoeLayerGpu::RoutedGemmsForward(const LayerWeights& w, const LayerStreams& s) {
  const LayerDims& d = k_->dims_;
  const int64_t Tk = d.rows(), H = d.hidden, F = d.ffn;
  const int32_t* live_rows = offsets_ + d.experts;
  const ExpertOperands w1 = W1(w, {}), w2 = W2(w, {});
  DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kGemmForward, s.main));
  if (d.mxfp8) {
    DROPLESS_RETURN_IF_ERROR(kc::QuantizeMxfp8(kernels::MxQuantizeShape{Tk, H, 1}, rows_, nullptr,
                                      &k_->mx_rows_, nullptr, s.main));
  }
  DROPLESS_RETURN_IF_ERROR(ExpertForward(w1, s.main));
  DROPLESS_RETURN_IF_ERROR(kc::SwigluForward(kernels::SwigluShape{Tk, F}, live_rows, h_, a_,
                                    d.mxfp8 ? &k_->mx_a_ : nullptr, s.main));
  DROPLESS_RETURN_IF_ERROR(ExpertForward(w2, s.main));
  return End(s, PhaseTimer::kGemmForward, s.main);
}

absl::Status MoeLayerGpu::Forward(const LayerWeights& w, const Bf16* x, Bf16* x_next,
                                  float* aux_loss, const LayerStreams& s) {
  const LayerDims& d = k_->dims_;
  const int64_t T = d.tokens, H = d.hidden;
  if (d.shared > 0) {
    DROPLESS_RETURN_IF_ERROR(s.links->Link(s.main, s.side));
    DROPLESS_RETURN_IF_ERROR(SharedForward(w, x, s));
  }
  // Router, top-k, aux loss statistics and the dispatch plan.
  DROPLESS_RETURN_IF_ERROR(k_->router_->Logits(T, x, w.router, logits_, s.main));
  if (w.router_bias != nullptr) DROPLESS_RETURN_IF_ERROR(AddRowBias(T, d.experts, w.router_bias, logits_, s.main));
  const kernels::RoutingShape routing = RoutingShape();
  DROPLESS_RETURN_IF_ERROR(kc::RouteTopK(routing, logits_,
                                kernels::RoutingOutputs{expert_ids_, gates_, counts_, prob_sums_},
                                s.main));
  if (aux_loss != nullptr) DROPLESS_RETURN_IF_ERROR(kc::AuxLoss(routing, counts_, prob_sums_, aux_loss, s.main));
  DROPLESS_RETURN_IF_ERROR(kc::BuildDispatchPlan(kernels::DispatchPlanShape{T, d.experts, d.topk}, expert_ids_,
                                        kernels::DispatchPlan{offsets_, slot_of_choice_, choice_of_slot_},
                                        k_->plan_workspace_, s.main));
  // Dispatch (on one GPU: the permutation into expert order), experts, combine.
  const kernels::PermuteShape permute{T, H, d.topk};
  DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kDispatch, s.main));
  DROPLESS_RETURN_IF_ERROR(kc::Permute(permute, x, slot_of_choice_, rows_, s.main));
  DROPLESS_RETURN_IF_ERROR(End(s, PhaseTimer::kDispatch, s.main));
  DROPLESS_RETURN_IF_ERROR(RoutedGemmsForward(w, s));
  DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kCombine, s.main));
  DROPLESS_RETURN_IF_ERROR(kc::UnpermuteCombine(permute, out_rows_, slot_of_choice_, gates_, k_->combined_,
                                       s.main));
  DROPLESS_RETURN_IF_ERROR(End(s, PhaseTimer::kCombine, s.main));
  // Residual stream.
  std::vector<const Bf16*> terms = {x, k_->combined_};
  if (d.shared > 0) {
    DROPLESS_RETURN_IF_ERROR(s.links->Link(s.side, s.main));
    for (int e = 0; e < d.shared; ++e) terms.push_back(k_->shared_out_[e]);
  }
  return SumBf16(T * H, terms, x_next, s.main);
}

// Runs `hook` on the optimizer stream once everything queued so far on main and wgrad is done.
absl::Status RunHook(const std::function<absl::Status(cudaStream_t)>& hook, const LayerStreams& s,
                     std::initializer_list<cudaStream_t> after) {
  if (!hook) return absl::OkStatus();
  for (cudaStream_t from : after) DROPLESS_RETURN_IF_ERROR(s.links->Link(from, s.optimizer));
  return hook(s.optimizer);
}

absl::Status MoeLayerGpu::RoutedGemmsBackward(const LayerWeights& w, const LayerGrads& grads,
                                              const LayerStreams& s,
                                              const LayerOptimizerHooks& hooks) {
  const LayerDims& d = k_->dims_;
  const int64_t Tk = d.rows(), F = d.ffn;
  const int32_t* live_rows = offsets_ + d.experts;
  LayerKernels& k = *k_;
  // Each weight: its output gradient quantized (mxfp8) on main, the weight gradient on the wgrad
  // stream beside the data gradient on main, then the weight's optimizer hook.
  auto backward = [&](const ExpertOperands& o, int64_t in_cols, int64_t out_cols,
                      const std::function<absl::Status(cudaStream_t)>& hook) -> absl::Status {
    if (d.mxfp8) {
      DROPLESS_RETURN_IF_ERROR(kc::QuantizeMxfp8(kernels::MxQuantizeShape{Tk, out_cols, d.experts}, o.dy,
                                        offsets_, o.dy_mx, o.dy_col, s.main));
    }
    DROPLESS_RETURN_IF_ERROR(s.links->Link(s.main, s.wgrad));
    DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kGemmWgrad, s.wgrad));
    if (d.mxfp8) {
      DROPLESS_RETURN_IF_ERROR(kc::QuantizeMxfp8(kernels::MxQuantizeShape{Tk, in_cols, d.experts}, o.x,
                                        offsets_, nullptr, o.x_col, s.wgrad));
    }
    DROPLESS_RETURN_IF_ERROR(ExpertBackwardWeight(o, s.wgrad));
    DROPLESS_RETURN_IF_ERROR(End(s, PhaseTimer::kGemmWgrad, s.wgrad));
    DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kGemmDgrad, s.main));
    DROPLESS_RETURN_IF_ERROR(ExpertBackwardData(o, s.main));
    DROPLESS_RETURN_IF_ERROR(End(s, PhaseTimer::kGemmDgrad, s.main));
    // The gradient is complete and no later work reads the weight: its update can start.
    return RunHook(hook, s, {s.main, s.wgrad});
  };
  DROPLESS_RETURN_IF_ERROR(backward(W2(w, grads), F, d.hidden, hooks.experts_w2));
  DROPLESS_RETURN_IF_ERROR(kc::SwigluBackward(kernels::SwigluShape{Tk, F}, live_rows, h_, k.d_a_, k.d_h_,
                                     s.main));
  return backward(W1(w, grads), d.hidden, 2 * F, hooks.experts_w1);
}

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
    DROPLESS_RETURN_IF_ERROR(kc::SwigluBackward(kernels::SwigluShape{d.tokens, F}, live_rows, shared_h_[e],
                                       k.d_shared_a_, k.d_shared_h_, s.side));
    DROPLESS_RETURN_IF_ERROR(k.shared_w1_->BackwardData(Nv(k.d_shared_h_), Nv(w.shared_w1 + e * H * 2 * F),
                                               k.shared_offsets_, Nv(k.d_x_shared_[e]), s.side));
    DROPLESS_RETURN_IF_ERROR(End(s, PhaseTimer::kGemmDgrad, s.side));
    DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kGemmWgrad, s.side));
    DROPLESS_RETURN_IF_ERROR(k.shared_w2_->BackwardWeight(Nv(shared_a_[e]), Nv(d_x_next), k.shared_offsets_,
                                                 grads.shared_w2 + e * F * H, s.side));
    DROPLESS_RETURN_IF_ERROR(k.shared_w1_->BackwardWeight(Nv(x), Nv(k.d_shared_h_), k.shared_offsets_,
                                                 grads.shared_w1 + e * H * 2 * F, s.side));
    DROPLESS_RETURN_IF_ERROR(End(s, PhaseTimer::kGemmWgrad, s.side));
  }
  return absl::OkStatus();
}

absl::Status MoeLayerGpu::Backward(const LayerWeights& w, const Bf16* x, const Bf16* d_x_next,
                                   float aux_coef, const LayerGrads& grads, Bf16* d_x,
                                   const LayerStreams& s, const LayerOptimizerHooks& hooks) {
  const LayerDims& d = k_->dims_;
  const int64_t T = d.tokens, H = d.hidden;
  LayerKernels& k = *k_;
  // Shared experts beside the routed path.
  DROPLESS_RETURN_IF_ERROR(s.links->Link(s.main, s.side));
  if (d.shared > 0) DROPLESS_RETURN_IF_ERROR(SharedBackward(w, x, d_x_next, grads, s));

  // Combine backward: gate gradients and the expert outputs' gradients.
  const kernels::PermuteShape permute{T, H, d.topk};
  DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kCombine, s.main));
  DROPLESS_RETURN_IF_ERROR(kc::UnpermuteCombineBackward(permute, d_x_next, out_rows_, slot_of_choice_,
                                               gates_, k.d_out_rows_, k.d_weights_, s.main));
  DROPLESS_RETURN_IF_ERROR(End(s, PhaseTimer::kCombine, s.main));

  // Router backward on the side stream once the gate gradients exist.
  DROPLESS_RETURN_IF_ERROR(s.links->Link(s.main, s.side));
  DROPLESS_RETURN_IF_ERROR(kc::RouteTopKBackward(RoutingShape(), logits_, expert_ids_, counts_, k.d_weights_,
                                        aux_coef, k.d_logits_, s.side));
  DROPLESS_RETURN_IF_ERROR(k.router_->LogitsBackward(T, x, w.router, k.d_logits_, k.d_x_router_,
                                            /*accumulate_d_x=*/false, k.d_router_, s.side));
  DROPLESS_RETURN_IF_ERROR(Transpose(1, d.experts, H, k.d_router_, grads.router, s.side));
  DROPLESS_RETURN_IF_ERROR(RunHook(hooks.router_and_shared, s, {s.side}));

  DROPLESS_RETURN_IF_ERROR(RoutedGemmsBackward(w, grads, s, hooks));
  DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kDispatch, s.main));
  DROPLESS_RETURN_IF_ERROR(kc::PermuteBackward(permute, k.d_rows_, slot_of_choice_, k.d_x_routed_, s.main));
  DROPLESS_RETURN_IF_ERROR(End(s, PhaseTimer::kDispatch, s.main));

  DROPLESS_RETURN_IF_ERROR(s.links->Link(s.side, s.main));
  DROPLESS_RETURN_IF_ERROR(s.links->Link(s.wgrad, s.main));
  std::vector<const Bf16*> terms = {d_x_next, k.d_x_routed_, k.d_x_router_};
  for (int e = 0; e < d.shared; ++e) terms.push_back(k.d_x_shared_[e]);
  return SumBf16(T * H, terms, d_x, s.main);
}

absl::Status MoeLayerGpu::TimeExpertGemms(const LayerWeights& w, const LayerGrads& grads,
                                          int iterations, cudaStream_t stream, double seconds[3]) {
  const ExpertOperands w1 = W1(w, grads), w2 = W2(w, grads);
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
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&begin));
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&end));
  absl::Status status;
  int product = 0;
  const std::function<absl::Status()> products[3] = {forward, dgrad, wgrad};
  for (product = 0; product < 3 && status.ok(); ++product) {
    status = products[product]();  // warm
    if (status.ok()) status = kc::CudaStatus(cudaEventRecord(begin, stream), "cudaEventRecord");
    for (int i = 0; i < iterations && status.ok(); ++i) status = products[product]();
    if (status.ok()) status = kc::CudaStatus(cudaEventRecord(end, stream), "cudaEventRecord");
    if (status.ok()) status = kc::CudaStatus(cudaEventSynchronize(end), "cudaEventSynchronize");
    float ms = 0;
    if (status.ok()) status = kc::CudaStatus(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
    seconds[product] = ms * 1e-3 / std::max(1, iterations);
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  return status;
}

}  // namespace dropless::cuda_engine
