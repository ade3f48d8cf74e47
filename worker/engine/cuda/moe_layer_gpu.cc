// MoeLayerGpu (moe_layer_gpu.h): kernels and buffers, the forward stages.
#include "worker/engine/cuda/moe_layer_gpu.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_format.h"
#include "dropless/kernels/dispatch_plan.h"
#include "dropless/kernels/fp8_block.h"
#include "dropless/kernels/permute.h"
#include "dropless/kernels/swiglu.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "worker/engine/cuda/engine_kernels.h"
#include "worker/engine/cuda/moe_layer_gpu_internal.h"

namespace dropless::cuda_engine {
namespace {

namespace kc = kernels::cuda;
using layer_internal::Begin;
using layer_internal::End;
using layer_internal::Nv;

}  // namespace

std::vector<LocalExperts> LayerDims::ExpertChunks() const {
  const int El = local_experts();
  const int chunks = std::clamp(overlap_chunks, 1, std::max(1, El));
  std::vector<LocalExperts> runs;
  for (int c = 0, first = 0; c < chunks; ++c) {
    const int count = El / chunks + (c < El % chunks ? 1 : 0);
    runs.push_back(LocalExperts{first, count});
    first += count;
  }
  return runs;
}

std::vector<LocalExperts> ExpertRuns(const LayerDims& dims, const LayerStreams& streams) {
  if (streams.comm == nullptr) return {LocalExperts{}};
  return dims.ExpertChunks();
}

absl::StatusOr<std::unique_ptr<LayerKernels>> LayerKernels::Create(const LayerDims& d,
                                                                   DeviceArena* arena,
                                                                   ExpertDispatcher* dispatcher,
                                                                   bool forward_only) {
  auto k = std::unique_ptr<LayerKernels>(new LayerKernels());
  k->dims_ = d;
  k->dispatcher_ = dispatcher;
  k->forward_only_ = forward_only;
  if (forward_only && d.quantized()) {
    return absl::InvalidArgumentError(
        "LayerKernels: forward_only layers run in bf16 (the teacher)");
  }
  // The precision-specific choices (fp8_block_local() reads the flag alone; a bf16 routed-expert
  // gradient is the bf16 two passes' only).
  if ((d.fp8_block_fused_quantizers && !d.fp8_block()) || (d.mx_core && !d.mxfp8()) ||
      (d.bf16_expert_grad && (d.quantized() || d.fused_expert_adamw))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "LayerKernels: fp8_block_fused_quantizers (%d), mx_core (%d) or bf16_expert_grad (%d, "
        "fused_expert_adamw %d) set for precision %s",
        d.fp8_block_fused_quantizers, d.mx_core, d.bf16_expert_grad, d.fused_expert_adamw,
        std::string(ToString(d.precision))));
  }
  const int64_t T = d.tokens, H = d.hidden, F = d.ffn, Tk = d.rows(), R = d.recv_rows();
  const int El = d.local_experts();
  DROPLESS_RETURN_IF_ERROR(ValidateEpShape(d.ep_shape()));
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
    o.expected_rows_per_group = std::max<int64_t>(1, std::min(max_rows, Tk) / groups);
    o.weight_grad_type = grad_type;
    absl::StatusOr<std::unique_ptr<kernels::GroupedGemm>> g = kernels::GroupedGemm::Create(o);
    if (!g.ok()) return g.status();
    *out = *std::move(g);
    return absl::OkStatus();
  };
  if (d.overlap_chunks < 1 || d.overlap_chunks > El) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "overlap: %d chunks of %d local experts (1 to %d)", d.overlap_chunks, El, El));
  }
  for (const LocalExperts& run : d.ExpertChunks()) {
    if (k->expert_gemms_.count(run.count) == 0) {
      DROPLESS_RETURN_IF_ERROR(k->CreateExpertGemms(run.count, &k->expert_gemms_[run.count]));
    }
  }
  if (k->expert_gemms_.count(El) == 0) {
    DROPLESS_RETURN_IF_ERROR(k->CreateExpertGemms(El, &k->expert_gemms_[El]));
  }
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
  for (int s = 0; s < d.shared; ++s) {
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * H, "shared expert output", &k->shared_out_[s]));
  }
  // (fp8_block_local recomputes the fp8-block forms themselves: no bf16 scratch.)
  const bool bf16_recompute = d.recompute && !k->fp8_block_local();
  if (bf16_recompute || dispatcher != nullptr) {
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk * H, "permuted rows (transient)", &k->permuted_scratch_));
  }
  if (bf16_recompute) {
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(R * F, "SwiGLU output (recomputed)", &k->swiglu_scratch_));
  }
  if (!forward_only) DROPLESS_RETURN_IF_ERROR(k->AllocateBackwardScratch(arena));
  DROPLESS_RETURN_IF_ERROR(k->AllocateQuantizedScratch(arena));
  return k;
}

// The backward's bf16 and fp32 scratch, shared by every layer.
absl::Status LayerKernels::AllocateBackwardScratch(DeviceArena* arena) {
  const LayerDims& d = dims_;
  const int64_t T = d.tokens, H = d.hidden, F = d.ffn, Tk = d.rows(), R = d.recv_rows();
  d_x_shared_.resize(d.shared);
  for (int s = 0; s < d.shared; ++s) {
    DROPLESS_RETURN_IF_ERROR(
        arena->Allocate(T * H, "shared expert input gradient", &d_x_shared_[s]));
  }
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(R * F, "activation gradient", &d_a_));
  if (!d.fp8_block_fused_quantizers) {  // else only its fp8-block forms exist
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(R * 2 * F, "w1 output gradient", &d_h_));
  }
  if (dispatcher_ == nullptr) {
    // Only its fp8-block forms exist when the combine's backward writes them.
    if (!fp8_block_local()) {
      DROPLESS_RETURN_IF_ERROR(arena->Allocate(R * H, "expert output gradient", &d_out_rows_));
    }
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(R * H, "expert input gradient", &d_rows_));
    d_out_send_ = d_out_rows_;
    d_rows_send_ = d_rows_;
  } else {
    // The received side: written or read by the peers.
    DROPLESS_RETURN_IF_ERROR(
        dispatcher_->AllocateShared(R * H, "expert output gradient", &d_out_rows_));
    DROPLESS_RETURN_IF_ERROR(dispatcher_->AllocateShared(R * H, "expert input gradient", &d_rows_));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk * H, "sent rows' output gradient", &d_out_send_));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk * H, "sent rows' input gradient", &d_rows_send_));
  }
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * H, "routed input gradient", &d_x_routed_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * H, "router input gradient", &d_x_router_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * d.topk, "gate gradient", &d_weights_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * d.experts, "logit gradient", &d_logits_));
  DROPLESS_RETURN_IF_ERROR(
      arena->Allocate(int64_t{d.experts} * H, "router weight gradient", &d_router_));
  if (d.shared > 0) {
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * F, "shared activation gradient", &d_shared_a_));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * 2 * F, "shared w1 output gradient", &d_shared_h_));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MoeLayerGpu>> MoeLayerGpu::Create(LayerKernels* kernels,
                                                                 DeviceArena* arena,
                                                                 SavedActivations* saved,
                                                                 int64_t layer_index) {
  auto layer = std::unique_ptr<MoeLayerGpu>(new MoeLayerGpu(kernels));
  const LayerDims& d = kernels->dims_;
  const int64_t T = d.tokens, H = d.hidden, F = d.ffn, Tk = d.rows(), E = d.experts;
  const int64_t R = d.recv_rows();
  const int64_t li = layer_index;
  MoeLayerGpu& l = *layer;
  DROPLESS_RETURN_IF_ERROR(saved->Allocate(li, T * E, "router logits", &l.logits_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk, "expert ids", &l.expert_ids_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk, "gates", &l.gates_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(E, "expert counts", &l.counts_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(E, "probability sums", &l.prob_sums_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(E + 1, "expert offsets", &l.offsets_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk, "slot of choice", &l.slot_of_choice_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(Tk, "choice of slot", &l.choice_of_slot_));
  ExpertDispatcher* dispatcher = kernels->dispatcher_;
  // The permuted rows are kept only when the experts read them in place and are not recomputed;
  // in fp8-block, as w1's column-wise operand only, or not at all when recomputed (so is the
  // SwiGLU output, below).
  const bool fp8_local = kernels->fp8_block_local();
  const bool operands_in_forward = kernels->fp8_block_operands_in_forward();
  // A layer's own column-wise fp8-block form of a [R][cols] weight-gradient operand.
  auto colwise = [&](int64_t cols, const char* what, kernels::Fp8BlockColwise* c) -> absl::Status {
    c->scaling = d.fp8_block_x_scaling();
    c->padded_rows = kernels->padded_rows_;
    DROPLESS_RETURN_IF_ERROR(saved->Allocate(li, c->padded_rows * cols, what, &c->data));
    DROPLESS_RETURN_IF_ERROR(saved->Allocate(
        li,
        c->padded_rows / kernels::kFp8Block * kernels::Fp8ColwiseScalesPerTile(cols, c->scaling),
        what, &c->scales));
    return arena->Allocate(d.local_experts() + 1, what, &c->group_offsets);
  };
  if (operands_in_forward) {
    DROPLESS_RETURN_IF_ERROR(colwise(H, "permuted rows, column-wise fp8-block", &l.fb_col_x_));
  } else if (fp8_local) {
    // Recomputed in fp8-block form by the backward: nothing kept.
  } else if (kernels->permuted_scratch_ != nullptr) {
    l.rows_ = kernels->permuted_scratch_;
  } else {
    DROPLESS_RETURN_IF_ERROR(saved->Allocate(li, Tk * H, "permuted rows", &l.rows_));
  }
  DROPLESS_RETURN_IF_ERROR(saved->Allocate(li, R * 2 * F, "w1 output", &l.h_));
  if (operands_in_forward) {
    DROPLESS_RETURN_IF_ERROR(colwise(F, "SwiGLU output, column-wise fp8-block", &l.fb_col_a_));
  } else if (fp8_local) {
    // Recomputed in fp8-block form by the backward: nothing kept.
  } else if (d.recompute) {
    l.a_ = kernels->swiglu_scratch_;
  } else {
    DROPLESS_RETURN_IF_ERROR(saved->Allocate(li, R * F, "SwiGLU output", &l.a_));
  }
  if (dispatcher == nullptr) {
    DROPLESS_RETURN_IF_ERROR(saved->Allocate(li, R * H, "expert output", &l.out_rows_));
    l.recv_rows_ = l.rows_;
    l.out_send_ = l.out_rows_;
  } else {
    // What peers write stays in the dispatcher's memory, one set per layer.
    DROPLESS_RETURN_IF_ERROR(dispatcher->AllocateShared(R * H, "expert output", &l.out_rows_));
    if (d.mxfp8()) {
      DROPLESS_RETURN_IF_ERROR(dispatcher->AllocateShared(R * H, "received mxfp8 rows", &l.mx_recv_.data));
      DROPLESS_RETURN_IF_ERROR(dispatcher->AllocateShared(R * (H / kernels::kMxBlock),
                                                          "received mxfp8 row scales", &l.mx_recv_.scales));
      l.recv_rows_ = kernels->dequantized_rows_;
    } else if (d.fp8_block()) {
      DROPLESS_RETURN_IF_ERROR(dispatcher->AllocateShared(R * H, "received fp8-block rows", &l.fb_recv_.data));
      DROPLESS_RETURN_IF_ERROR(dispatcher->AllocateShared(R * (H / kernels::kFp8Block),
                                                          "received fp8-block row scales", &l.fb_recv_.scales));
      l.recv_rows_ = kernels->dequantized_rows_;
    } else {
      DROPLESS_RETURN_IF_ERROR(dispatcher->AllocateShared(R * H, "received rows", &l.recv_rows_));
    }
    DROPLESS_RETURN_IF_ERROR(saved->Allocate(li, Tk * H, "expert outputs at their tokens' rank", &l.out_send_));
    DROPLESS_RETURN_IF_ERROR(AllocateExchangePlan(dispatcher, arena, &l.plan_));
    l.plan_.send_offsets = l.offsets_;
  }
  l.shared_h_.resize(d.shared);
  l.shared_a_.resize(d.shared);
  for (int s = 0; s < d.shared; ++s) {
    DROPLESS_RETURN_IF_ERROR(saved->Allocate(li, T * 2 * F, "shared w1 output", &l.shared_h_[s]));
    DROPLESS_RETURN_IF_ERROR(saved->Allocate(li, T * F, "shared SwiGLU output", &l.shared_a_[s]));
  }
  return layer;
}

absl::StatusOr<std::unique_ptr<MoeLayerGpu>> MoeLayerGpu::CreateOver(LayerKernels* kernels,
                                                                     const MoeLayerGpu& other) {
  const LayerDims& d = kernels->dims_;
  const LayerDims& o = other.k_->dims_;
  if (!kernels->forward_only() || !kernels->exchange() ||
      kernels->dispatcher_ != other.k_->dispatcher_ || d.tokens != o.tokens ||
      d.hidden != o.hidden || d.ffn != o.ffn || d.experts != o.experts || d.ep != o.ep ||
      d.topk != o.topk || d.shared != o.shared) {
    return absl::InvalidArgumentError(
        "MoeLayerGpu::CreateOver: a forward-only layer with the other layer's exchange and shapes");
  }
  auto layer = std::unique_ptr<MoeLayerGpu>(new MoeLayerGpu(kernels));
  MoeLayerGpu& l = *layer;
  l.logits_ = other.logits_;
  l.expert_ids_ = other.expert_ids_;
  l.gates_ = other.gates_;
  l.counts_ = other.counts_;
  l.prob_sums_ = other.prob_sums_;
  l.offsets_ = other.offsets_;
  l.slot_of_choice_ = other.slot_of_choice_;
  l.choice_of_slot_ = other.choice_of_slot_;
  l.rows_ = kernels->permuted_scratch_;  // the rows an exchange sends
  l.recv_rows_ = other.k_->d_rows_;
  l.h_ = other.h_;
  l.a_ = other.a_;
  l.out_rows_ = other.out_rows_;
  l.out_send_ = other.out_send_;
  l.plan_ = other.plan_;
  l.shared_h_ = other.shared_h_;
  l.shared_a_ = other.shared_a_;
  if (l.rows_ == nullptr || l.recv_rows_ == nullptr || l.h_ == nullptr || l.a_ == nullptr ||
      l.out_rows_ == nullptr || l.out_send_ == nullptr) {
    return absl::FailedPreconditionError(
        "MoeLayerGpu::CreateOver: the other layer keeps no bf16 form of a buffer the forward "
        "writes");
  }
  return layer;
}

kernels::RoutingShape MoeLayerGpu::RoutingShape() const {
  const LayerDims& d = k_->dims_;
  kernels::RoutingShape shape{d.tokens, d.experts, d.topk, d.score, d.renormalize};
  shape.aux_tokens = d.tokens * d.ep;  // the aux loss is over the EP group's tokens
  return shape;
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

size_t MoeLayerGpu::RowBytes(Rows rows) const {
  const size_t H = static_cast<size_t>(k_->dims_.hidden);
  if (rows == Rows::kTokenScales) {
    return k_->dims_.fp8_block() ? H / kernels::kFp8Block * sizeof(float) : H / kernels::kMxBlock;
  }
  if (rows == Rows::kTokens && quantized_tokens()) return H;
  return H * sizeof(Bf16);
}

RankCall MoeLayerGpu::ExchangeCall(Rows rows, cudaStream_t stream) {
  RankCall c;
  c.plan = &plan_;
  c.stream = stream;
  switch (rows) {
    case Rows::kTokens:
      c.send_rows = !quantized_tokens()      ? static_cast<void*>(rows_)
                    : k_->dims_.fp8_block() ? static_cast<void*>(k_->fb_send_.data)
                                          : static_cast<void*>(k_->mx_send_.data);
      c.recv_rows = !quantized_tokens()      ? static_cast<void*>(recv_rows_)
                    : k_->dims_.fp8_block() ? static_cast<void*>(fb_recv_.data)
                                          : static_cast<void*>(mx_recv_.data);
      break;
    case Rows::kTokenScales:
      c.send_rows = k_->dims_.fp8_block() ? static_cast<void*>(k_->fb_send_.scales)
                                        : static_cast<void*>(k_->mx_send_.scales);
      c.recv_rows = k_->dims_.fp8_block() ? static_cast<void*>(fb_recv_.scales)
                                        : static_cast<void*>(mx_recv_.scales);
      break;
    case Rows::kExpertOutputs:
      c.send_rows = out_send_;
      c.recv_rows = out_rows_;
      break;
    case Rows::kOutputGradients:
      c.send_rows = k_->d_out_send_;
      c.recv_rows = k_->d_out_rows_;
      break;
    case Rows::kInputGradients:
      c.send_rows = k_->d_rows_send_;
      c.recv_rows = k_->d_rows_;
      break;
  }
  return c;
}

absl::Status MoeLayerGpu::ForwardRoute(const LayerWeights& w, const Bf16* x, const LayerStreams& s) {
  const LayerDims& d = k_->dims_;
  const int64_t T = d.tokens, H = d.hidden;
  if (d.shared > 0) {
    DROPLESS_RETURN_IF_ERROR(s.links->Link(s.main, s.side));
    DROPLESS_RETURN_IF_ERROR(SharedForward(w, x, s));
  }
  // Router, top-k, aux loss statistics and the dispatch plan.
  DROPLESS_RETURN_IF_ERROR(k_->router_->Logits(T, x, w.router, logits_, s.main));
  if (w.router_bias != nullptr) {
    DROPLESS_RETURN_IF_ERROR(AddRowBias(T, d.experts, w.router_bias, logits_, s.main));
  }
  DROPLESS_RETURN_IF_ERROR(kc::RouteTopK(
      RoutingShape(), logits_, kernels::RoutingOutputs{expert_ids_, gates_, counts_, prob_sums_},
      s.main));
  DROPLESS_RETURN_IF_ERROR(kc::BuildDispatchPlan(
      kernels::DispatchPlanShape{T, d.experts, d.topk}, expert_ids_,
      kernels::DispatchPlan{offsets_, slot_of_choice_, choice_of_slot_}, k_->plan_workspace_,
      s.main));
  // The permutation into expert order (at EP = 1 the whole dispatch); tokens that travel in
  // MXFP8 or fp8-block are quantized once each on the way.
  DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kDispatch, s.main));
  if (quantized_tokens() && d.fp8_block()) {
    DROPLESS_RETURN_IF_ERROR(kc::PermuteFp8Block(kernels::PermuteShape{T, H, d.topk}, x,
                                                 slot_of_choice_, k_->fb_send_,
                                                 kernels::Fp8ScaleMode::kFloat32, s.main));
  } else if (quantized_tokens()) {
    DROPLESS_RETURN_IF_ERROR(kc::PermuteMxfp8(kernels::PermuteShape{T, H, d.topk}, x,
                                              slot_of_choice_, k_->mx_send_, s.main));
  } else if (k_->fp8_block_local()) {  // w1's operands (column-wise unless recomputed)
    DROPLESS_RETURN_IF_ERROR(kc::PermuteFp8BlockGrouped(
        kernels::PermuteShape{T, H, d.topk}, x, choice_of_slot_, ExpertOffsets(), d.local_experts(),
        &k_->fb_rows_, k_->fp8_block_operands_in_forward() ? &fb_col_x_ : nullptr,
        kernels::Fp8ScaleMode::kFloat32, s.main));
  } else {
    DROPLESS_RETURN_IF_ERROR(kc::Permute(kernels::PermuteShape{T, H, d.topk}, x, slot_of_choice_,
                                         rows_, s.main));
  }
  return End(s, PhaseTimer::kDispatch, s.main);
}

absl::Status MoeLayerGpu::ForwardExperts(const LayerWeights& w, const LayerStreams& s) {
  DROPLESS_RETURN_IF_ERROR(ForwardW1(w, LocalExperts{}, s));
  DROPLESS_RETURN_IF_ERROR(ForwardSwiglu(s));
  return ForwardW2(w, LocalExperts{}, s);
}

absl::Status MoeLayerGpu::ForwardW1(const LayerWeights& w, LocalExperts run, const LayerStreams& s) {
  const LayerDims& d = k_->dims_;
  const int El = d.local_experts();
  const int64_t R = d.recv_rows(), H = d.hidden;
  DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kGemmForward, s.main));
  // Without an exchange the permuted bf16 rows are quantized here, unless the permute did
  // (fp8_block_fused_quantizers; with an exchange they travel quantized: every run arrives so).
  if (d.mxfp8() && !quantized_tokens()) {
    DROPLESS_RETURN_IF_ERROR(kc::QuantizeMxfp8(kernels::MxQuantizeShape{R, H, El}, recv_rows_,
                                               ExpertOffsets(), &k_->mx_rows_, nullptr, s.main));
  }
  if (d.fp8_block() && !quantized_tokens() && !d.fp8_block_fused_quantizers) {
    DROPLESS_RETURN_IF_ERROR(kc::QuantizeFp8Block(kernels::Fp8BlockQuantizeShape{R, H, El},
                                                  recv_rows_, ExpertOffsets(), &k_->fb_rows_,
                                                  nullptr, s.main));
  }
  DROPLESS_RETURN_IF_ERROR(ExpertForward(Run(W1(w, {}), run), s.main));
  return End(s, PhaseTimer::kGemmForward, s.main);
}

absl::Status MoeLayerGpu::ForwardSwiglu(const LayerStreams& s) {
  const LayerDims& d = k_->dims_;
  const int64_t R = d.recv_rows(), F = d.ffn;
  const int32_t* live_rows = ExpertOffsets() + d.local_experts();
  DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kGemmForward, s.main));
  // SwiGLU writes the bf16 output (w2's weight-gradient operand) and, for the quantized
  // precisions, w2's forward operand in the same pass; or w2's fp8-block operands only
  // (column-wise unless recomputed).
  if (k_->fp8_block_local()) {
    DROPLESS_RETURN_IF_ERROR(kc::SwigluForwardFp8BlockGrouped(
        kernels::SwigluShape{R, F}, ExpertOffsets(), d.local_experts(), h_, &k_->fb_a_,
        k_->fp8_block_operands_in_forward() ? &fb_col_a_ : nullptr, kernels::Fp8ScaleMode::kFloat32,
        s.main));
  } else if (d.fp8_block()) {
    DROPLESS_RETURN_IF_ERROR(kc::SwigluForwardFp8Block(kernels::SwigluShape{R, F}, live_rows, h_,
                                                       a_, k_->fb_a_,
                                                       kernels::Fp8ScaleMode::kFloat32, s.main));
  } else {
    DROPLESS_RETURN_IF_ERROR(kc::SwigluForward(kernels::SwigluShape{R, F}, live_rows, h_, a_,
                                               d.mxfp8() ? &k_->mx_a_ : nullptr, s.main));
  }
  return End(s, PhaseTimer::kGemmForward, s.main);
}

absl::Status MoeLayerGpu::ForwardW2(const LayerWeights& w, LocalExperts run, const LayerStreams& s) {
  DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kGemmForward, s.main));
  DROPLESS_RETURN_IF_ERROR(ExpertForward(Run(W2(w, {}), run), s.main));
  return End(s, PhaseTimer::kGemmForward, s.main);
}

absl::Status MoeLayerGpu::ForwardCombine(const Bf16* x, Bf16* x_next, float* aux_loss,
                                         const LayerStreams& s) {
  const LayerDims& d = k_->dims_;
  const int64_t T = d.tokens, H = d.hidden;
  if (aux_loss != nullptr) {
    // The group's statistics: its counts and probability sums (over RoutingShape's aux_tokens).
    DROPLESS_RETURN_IF_ERROR(kc::AuxLoss(RoutingShape(), job_counts(), prob_sums_, aux_loss, s.main));
  }
  DROPLESS_RETURN_IF_ERROR(Begin(s, PhaseTimer::kCombine, s.main));
  DROPLESS_RETURN_IF_ERROR(kc::UnpermuteCombine(kernels::PermuteShape{T, H, d.topk}, out_send_,
                                                slot_of_choice_, gates_, k_->combined_, s.main));
  DROPLESS_RETURN_IF_ERROR(End(s, PhaseTimer::kCombine, s.main));
  // Residual stream.
  std::vector<const Bf16*> terms = {x, k_->combined_};
  if (d.shared > 0) {
    DROPLESS_RETURN_IF_ERROR(s.links->Link(s.side, s.main));
    for (int e = 0; e < d.shared; ++e) terms.push_back(k_->shared_out_[e]);
  }
  return SumBf16(T * H, terms, x_next, s.main);
}

absl::Status MoeLayerGpu::Forward(const LayerWeights& w, const Bf16* x, Bf16* x_next,
                                  float* aux_loss, const LayerStreams& s) {
  if (k_->exchange()) {
    return absl::FailedPreconditionError("MoeLayerGpu::Forward is the layer without a dispatcher; "
                                         "with one it runs in stages (moe_layer_group.h)");
  }
  DROPLESS_RETURN_IF_ERROR(ForwardRoute(w, x, s));
  DROPLESS_RETURN_IF_ERROR(ForwardExperts(w, s));
  return ForwardCombine(x, x_next, aux_loss, s);
}

}  // namespace dropless::cuda_engine
