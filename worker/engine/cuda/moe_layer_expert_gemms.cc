// The routed experts' GEMMs of MoeLayerGpu (moe_layer_gpu.h) in the three expert precisions: the
// kernel objects and quantized scratch of the quantized ones, the weights' quantized copies, each
// weight's operands, and the forward / data-gradient / weight-gradient products.
#include <algorithm>
#include <memory>
#include <utility>

#include "common/status_macros.h"
#include "dropless/kernels/fp8_block.h"
#include "dropless/kernels/mxfp8.h"
#include "worker/engine/cuda/engine_kernels.h"
#include "worker/engine/cuda/moe_layer_gpu.h"
#include "worker/engine/cuda/moe_layer_gpu_internal.h"

namespace dropless::cuda_engine {
namespace {

namespace kc = kernels::cuda;
using layer_internal::Nv;

// A row-wise operand (MxRowwise or Fp8BlockRowwise: one scale per `block` elements of a row).
template <class Rowwise>
absl::Status AllocRowwise(DeviceArena* arena, int64_t rows, int64_t cols, int block, Rowwise* out) {
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(rows * cols, "quantized rows", &out->data));
  return arena->Allocate(rows * (cols / block), "quantized row scales", &out->scales);
}

// A column-wise operand (MxColwise or Fp8BlockColwise: groups padded to `block` rows).
template <class Colwise>
absl::Status AllocColwise(DeviceArena* arena, int64_t padded_rows, int64_t cols, int groups,
                          int block, Colwise* out) {
  out->padded_rows = padded_rows;
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(padded_rows * cols, "quantized columns", &out->data));
  DROPLESS_RETURN_IF_ERROR(
      arena->Allocate(padded_rows / block * cols, "quantized column scales", &out->scales));
  return arena->Allocate(groups + 1, "quantized padded offsets", &out->group_offsets);
}

}  // namespace

absl::Status LayerKernels::CreateExpertGemms(DeviceArena* arena) {
  const LayerDims& d = dims_;
  const int64_t H = d.hidden, F = d.ffn, Tk = d.rows(), R = d.recv_rows();
  const int El = d.local_experts();
  if (d.mxfp8()) {
    auto mx = [&](int64_t kdim, int64_t ndim, std::unique_ptr<kernels::MxGroupedGemm>* out) {
      kernels::MxGroupedGemmOptions o;
      o.num_groups = El;
      o.k = static_cast<int>(kdim);
      o.n = static_cast<int>(ndim);
      o.max_rows = R;
      o.expected_rows_per_group = std::max<int64_t>(1, Tk / El);
      absl::StatusOr<std::unique_ptr<kernels::MxGroupedGemm>> g = kernels::MxGroupedGemm::Create(o);
      if (!g.ok()) return g.status();
      *out = *std::move(g);
      return absl::OkStatus();
    };
    DROPLESS_RETURN_IF_ERROR(mx(H, 2 * F, &mx_w1_));
    DROPLESS_RETURN_IF_ERROR(mx(F, H, &mx_w2_));
    padded_rows_ = kernels::ColwisePaddedRows(R, El);
    if (dispatcher_ == nullptr) {
      DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, R, H, kernels::kMxBlock, &mx_rows_));
    } else {
      DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, Tk, H, kernels::kMxBlock, &mx_send_));
      DROPLESS_RETURN_IF_ERROR(arena->Allocate(R * H, "dequantized received rows", &dequantized_rows_));
    }
    DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, R, F, kernels::kMxBlock, &mx_a_));
    DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, R, H, kernels::kMxBlock, &mx_d_out_));
    DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, R, 2 * F, kernels::kMxBlock, &mx_d_h_));
    DROPLESS_RETURN_IF_ERROR(AllocColwise(arena, padded_rows_, H, El, kernels::kMxBlock, &col_rows_));
    DROPLESS_RETURN_IF_ERROR(AllocColwise(arena, padded_rows_, F, El, kernels::kMxBlock, &col_a_));
    DROPLESS_RETURN_IF_ERROR(AllocColwise(arena, padded_rows_, H, El, kernels::kMxBlock, &col_d_out_));
    DROPLESS_RETURN_IF_ERROR(AllocColwise(arena, padded_rows_, 2 * F, El, kernels::kMxBlock, &col_d_h_));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(int64_t{El} * H * 2 * F, "weight transpose scratch",
                                             &transpose_scratch_));
  }
  if (d.fp8_block()) {
    padded_rows_ = kernels::Fp8ColwisePaddedRows(R, El);
    auto fb = [&](int64_t kdim, int64_t ndim, std::unique_ptr<kernels::Fp8BlockGroupedGemm>* out) {
      kernels::Fp8BlockGroupedGemmOptions o;
      o.num_groups = El;
      o.k = static_cast<int>(kdim);
      o.n = static_cast<int>(ndim);
      o.max_rows = R;
      o.padded_rows = padded_rows_;
      absl::StatusOr<std::unique_ptr<kernels::Fp8BlockGroupedGemm>> g =
          kernels::Fp8BlockGroupedGemm::Create(o);
      if (!g.ok()) return g.status();
      *out = *std::move(g);
      return absl::OkStatus();
    };
    DROPLESS_RETURN_IF_ERROR(fb(H, 2 * F, &fb_w1_));
    DROPLESS_RETURN_IF_ERROR(fb(F, H, &fb_w2_));
    if (dispatcher_ == nullptr) {
      DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, R, H, kernels::kFp8Block, &fb_rows_));
    } else {
      DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, Tk, H, kernels::kFp8Block, &fb_send_));
      DROPLESS_RETURN_IF_ERROR(arena->Allocate(R * H, "dequantized received rows", &dequantized_rows_));
    }
    DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, R, F, kernels::kFp8Block, &fb_a_));
    DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, R, H, kernels::kFp8Block, &fb_d_out_));
    DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, R, 2 * F, kernels::kFp8Block, &fb_d_h_));
    DROPLESS_RETURN_IF_ERROR(AllocColwise(arena, padded_rows_, H, El, kernels::kFp8Block, &fb_col_rows_));
    DROPLESS_RETURN_IF_ERROR(AllocColwise(arena, padded_rows_, F, El, kernels::kFp8Block, &fb_col_a_));
    DROPLESS_RETURN_IF_ERROR(AllocColwise(arena, padded_rows_, H, El, kernels::kFp8Block, &fb_col_d_out_));
    DROPLESS_RETURN_IF_ERROR(AllocColwise(arena, padded_rows_, 2 * F, El, kernels::kFp8Block, &fb_col_d_h_));
  }
  return absl::OkStatus();
}

absl::StatusOr<QuantizedWeight> LayerKernels::AllocateQuantizedWeight(int64_t kdim, int64_t ndim,
                                                                      DeviceArena* arena) const {
  const int64_t n = int64_t{dims_.local_experts()} * kdim * ndim;
  QuantizedWeight w;
  if (dims_.mxfp8()) {
    MxWeight& mx = w.mx;
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(n, "mxfp8 weight (along n)", &mx.along_n));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(n / kernels::kMxBlock, "mxfp8 weight scales", &mx.along_n_scales));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(n, "mxfp8 weight (along k)", &mx.along_k));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(n / kernels::kMxBlock, "mxfp8 weight scales", &mx.along_k_scales));
  }
  if (dims_.fp8_block()) {
    kernels::Fp8BlockWeights& fb = w.fp8_block;
    const int64_t blocks = n / (int64_t{kernels::kFp8Block} * kernels::kFp8Block);
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(n, "fp8-block weight", &fb.data));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(blocks, "fp8-block weight scales", &fb.scales));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(n, "fp8-block weight (transposed)", &fb.data_t));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(blocks, "fp8-block weight scales (transposed)", &fb.scales_t));
  }
  return w;
}

absl::Status LayerKernels::QuantizeWeight(const Bf16* w, int64_t kdim, int64_t ndim,
                                          const QuantizedWeight& out, cudaStream_t stream) {
  const int64_t E = dims_.local_experts();
  if (dims_.fp8_block()) {
    return kc::QuantizeFp8BlockWeights(
        kernels::Fp8BlockWeightShape{static_cast<int>(E), kdim, ndim}, w, out.fp8_block, stream);
  }
  if (!dims_.mxfp8()) return absl::OkStatus();
  kernels::MxRowwise along_n{out.mx.along_n, out.mx.along_n_scales};
  DROPLESS_RETURN_IF_ERROR(kc::QuantizeMxfp8(kernels::MxQuantizeShape{E * kdim, ndim, 1}, w,
                                             nullptr, &along_n, nullptr, stream));
  DROPLESS_RETURN_IF_ERROR(Transpose(E, kdim, ndim, w, transpose_scratch_, stream));
  kernels::MxRowwise along_k{out.mx.along_k, out.mx.along_k_scales};
  return kc::QuantizeMxfp8(kernels::MxQuantizeShape{E * ndim, kdim, 1}, transpose_scratch_,
                           nullptr, &along_k, nullptr, stream);
}

MoeLayerGpu::ExpertOperands MoeLayerGpu::W1(const LayerWeights& w, const LayerGrads& g) {
  LayerKernels& k = *k_;
  ExpertOperands o;
  o.gemm = k.w1_.get();
  o.mx_gemm = k.mx_w1_.get();
  o.fb_gemm = k.fb_w1_.get();
  o.w = w.w1;
  o.q_w = &w.q_w1;
  o.dw = g.w1;
  o.x = recv_rows_;
  o.x_mx = quantized_tokens() ? &mx_recv_ : &k.mx_rows_;
  o.x_col = &k.col_rows_;
  o.x_fb = quantized_tokens() ? &fb_recv_ : &k.fb_rows_;
  o.x_fb_col = &k.fb_col_rows_;
  o.y = h_;
  o.dy = k.d_h_;
  o.dy_mx = &k.mx_d_h_;
  o.dy_col = &k.col_d_h_;
  o.dy_fb = &k.fb_d_h_;
  o.dy_fb_col = &k.fb_col_d_h_;
  o.dx = k.d_rows_;
  return o;
}

MoeLayerGpu::ExpertOperands MoeLayerGpu::W2(const LayerWeights& w, const LayerGrads& g) {
  LayerKernels& k = *k_;
  ExpertOperands o;
  o.gemm = k.w2_.get();
  o.mx_gemm = k.mx_w2_.get();
  o.fb_gemm = k.fb_w2_.get();
  o.w = w.w2;
  o.q_w = &w.q_w2;
  o.dw = g.w2;
  o.x = a_;
  o.x_mx = &k.mx_a_;
  o.x_col = &k.col_a_;
  o.x_fb = &k.fb_a_;
  o.x_fb_col = &k.fb_col_a_;
  o.y = out_rows_;
  o.dy = k.d_out_rows_;
  o.dy_mx = &k.mx_d_out_;
  o.dy_col = &k.col_d_out_;
  o.dy_fb = &k.fb_d_out_;
  o.dy_fb_col = &k.fb_col_d_out_;
  o.dx = k.d_a_;
  return o;
}

absl::Status MoeLayerGpu::ExpertForward(const ExpertOperands& o, cudaStream_t stream) {
  if (k_->dims_.fp8_block()) {
    const kernels::Fp8BlockWeights& q = o.q_w->fp8_block;
    return o.fb_gemm->Forward({o.x_fb->data, o.x_fb->scales}, {q.data_t, q.scales_t},
                              ExpertOffsets(), o.y, stream);
  }
  if (k_->dims_.mxfp8()) {
    const MxWeight& q = o.q_w->mx;
    return o.mx_gemm->Forward({o.x_mx->data, o.x_mx->scales}, {q.along_k, q.along_k_scales},
                              ExpertOffsets(), o.y, stream);
  }
  return o.gemm->Forward(Nv(o.x), Nv(o.w), ExpertOffsets(), Nv(o.y), stream);
}

absl::Status MoeLayerGpu::ExpertBackwardData(const ExpertOperands& o, cudaStream_t stream) {
  if (k_->dims_.fp8_block()) {
    const kernels::Fp8BlockWeights& q = o.q_w->fp8_block;
    return o.fb_gemm->BackwardData({o.dy_fb->data, o.dy_fb->scales}, {q.data, q.scales},
                                   ExpertOffsets(), o.dx, stream);
  }
  if (k_->dims_.mxfp8()) {
    const MxWeight& q = o.q_w->mx;
    return o.mx_gemm->BackwardData({o.dy_mx->data, o.dy_mx->scales},
                                   {q.along_n, q.along_n_scales}, ExpertOffsets(), o.dx, stream);
  }
  return o.gemm->BackwardData(Nv(o.dy), Nv(o.w), ExpertOffsets(), Nv(o.dx), stream);
}

absl::Status MoeLayerGpu::ExpertBackwardWeight(const ExpertOperands& o, cudaStream_t stream) {
  if (k_->dims_.fp8_block()) {
    return o.fb_gemm->BackwardWeight({o.x_fb_col->data, o.x_fb_col->scales},
                                     {o.dy_fb_col->data, o.dy_fb_col->scales},
                                     o.x_fb_col->group_offsets, o.dw, stream);
  }
  if (k_->dims_.mxfp8()) {
    return o.mx_gemm->BackwardWeight({o.x_col->data, o.x_col->scales},
                                     {o.dy_col->data, o.dy_col->scales},
                                     o.x_col->group_offsets, o.dw, stream);
  }
  return o.gemm->BackwardWeight(Nv(o.x), Nv(o.dy), ExpertOffsets(), o.dw, stream);
}

}  // namespace dropless::cuda_engine
