// The routed experts' GEMMs of MoeLayerGpu (moe_layer_gpu.h) in the three expert precisions: the
// kernel objects and quantized scratch of the quantized ones, the weights' quantized copies, each
// weight's operands, and the forward / data-gradient / weight-gradient products.
#include <algorithm>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
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

// Scales a column-wise operand of `cols` columns holds per tile of padded rows.
int64_t ScalesPerTile(const kernels::MxColwise&, int64_t cols) { return cols; }
int64_t ScalesPerTile(const kernels::Fp8BlockColwise& c, int64_t cols) {
  return kernels::Fp8ColwiseScalesPerTile(cols, c.scaling);
}

// A column-wise operand (MxColwise or Fp8BlockColwise: groups padded to `block` rows; an
// Fp8BlockColwise's scaling set before).
template <class Colwise>
absl::Status AllocColwise(DeviceArena* arena, int64_t padded_rows, int64_t cols, int groups,
                          int block, Colwise* out) {
  out->padded_rows = padded_rows;
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(padded_rows * cols, "quantized columns", &out->data));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(padded_rows / block * ScalesPerTile(*out, cols),
                                           "quantized column scales", &out->scales));
  return arena->Allocate(groups + 1, "quantized padded offsets", &out->group_offsets);
}

}  // namespace

absl::Status LayerKernels::CreateExpertGemms(int groups, ExpertGemms* out) const {
  const LayerDims& d = dims_;
  const int64_t H = d.hidden, F = d.ffn, R = d.recv_rows();
  const int El = d.local_experts();
  // A chunk's groups are as large as the layer's.
  const int64_t expected_rows = std::max<int64_t>(1, d.expected_rows_per_expert());
  auto make = [&](auto options, auto* gemm) -> absl::Status {
    using Gemm = typename std::remove_reference_t<decltype(*gemm)>::element_type;
    auto g = Gemm::Create(options);
    if (!g.ok()) return g.status();
    *gemm = *std::move(g);
    return absl::OkStatus();
  };
  for (int product = 0; product < 2; ++product) {
    // The fields every family's options share: this product's shape over `groups` experts.
    auto shaped = [&](auto options) {
      options.num_groups = groups;
      options.k = static_cast<int>(product == 0 ? H : F);
      options.n = static_cast<int>(product == 0 ? 2 * F : H);
      options.max_rows = R;
      options.max_sms = d.expert_gemm_sms;
      return options;
    };
    if (d.mxfp8()) {
      kernels::MxGroupedGemmOptions o = shaped(kernels::MxGroupedGemmOptions{});
      o.padded_rows = kernels::ColwisePaddedRows(R, El);  // the layer's column-wise buffers
      o.expected_rows_per_group = expected_rows;
      DROPLESS_RETURN_IF_ERROR(make(o, product == 0 ? &out->mx_w1 : &out->mx_w2));
      if (d.mx_core) {
        // The weight gradient: bf16 over the column-wise images' padded rows.
        kernels::GroupedGemmOptions b = shaped(kernels::GroupedGemmOptions{});
        b.max_rows = o.padded_rows;
        b.expected_rows_per_group = expected_rows;
        b.weight_grad_type = kernels::GradType::kFloat32;
        DROPLESS_RETURN_IF_ERROR(make(b, product == 0 ? &out->w1 : &out->w2));
      }
    } else if (d.fp8_block()) {
      kernels::Fp8BlockGroupedGemmOptions o = shaped(kernels::Fp8BlockGroupedGemmOptions{});
      o.padded_rows = kernels::Fp8ColwisePaddedRows(R, El);
      o.x_scaling = d.fp8_block_x_scaling();
      o.expected_rows_per_group = expected_rows;
      DROPLESS_RETURN_IF_ERROR(make(o, product == 0 ? &out->fb_w1 : &out->fb_w2));
    } else {
      kernels::GroupedGemmOptions o = shaped(kernels::GroupedGemmOptions{});
      o.expected_rows_per_group = expected_rows;
      // bf16 with LayerDims::bf16_expert_grad, with overlap too: the weight gradient is never
      // chunked (it runs over every local expert once every chunk's output gradient is in).
      o.weight_grad_type =
          d.bf16_expert_grad ? kernels::GradType::kBFloat16 : kernels::GradType::kFloat32;
      DROPLESS_RETURN_IF_ERROR(make(o, product == 0 ? &out->w1 : &out->w2));
      if (d.fused_expert_adamw && groups == El) {
        kernels::WgradAdamWShape s{groups, o.k, o.n, R, d.expert_gemm_sms};
        DROPLESS_RETURN_IF_ERROR(make(s, product == 0 ? &out->adamw_w1 : &out->adamw_w2));
      }
    }
  }
  return absl::OkStatus();
}

std::string LayerKernels::ExpertGemmKernels() const {
  const auto it = expert_gemms_.find(dims_.local_experts());
  if (it == expert_gemms_.end()) return "";
  const ExpertGemms& g = it->second;
  std::string out;
  for (int product = 0; product < 2; ++product) {
    absl::StrAppend(&out, product == 0 ? "w1 " : "; w2 ");
    const kernels::GroupedGemm* bf16 = (product == 0 ? g.w1 : g.w2).get();
    if (dims_.fp8_block()) {
      // "<forward>+<data gradient>+<weight gradient>"
      absl::StrAppend(&out, (product == 0 ? g.fb_w1 : g.fb_w2)->KernelName());
    } else if (dims_.mxfp8()) {
      const kernels::MxGroupedGemm* mx = (product == 0 ? g.mx_w1 : g.mx_w2).get();
      absl::StrAppend(&out, dims_.mx_core ? mx->CoreKernelName() : mx->KernelName());
      if (bf16 != nullptr) {
        absl::StrAppend(&out, ", weight gradient ",
                        bf16->KernelName(kernels::GroupedGemmOp::kBackwardWeight));
      }
    } else {
      absl::StrAppend(&out, "forward ", bf16->KernelName(kernels::GroupedGemmOp::kForward),
                      ", data gradient ", bf16->KernelName(kernels::GroupedGemmOp::kBackwardData),
                      ", weight gradient ",
                      dims_.fused_expert_adamw
                          ? std::string("fused with AdamW")
                          : absl::StrCat(bf16->KernelName(kernels::GroupedGemmOp::kBackwardWeight),
                                         dims_.bf16_expert_grad ? " to bf16" : ""));
    }
  }
  return out;
}

absl::Status LayerKernels::AllocateQuantizedScratch(DeviceArena* arena) {
  const LayerDims& d = dims_;
  const int64_t H = d.hidden, F = d.ffn, Tk = d.rows(), R = d.recv_rows();
  const int El = d.local_experts();
  if (d.mxfp8()) {
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
    if (!d.mx_core) {
      DROPLESS_RETURN_IF_ERROR(arena->Allocate(int64_t{El} * H * 2 * F,
                                               "weight transpose scratch", &transpose_scratch_));
    } else {
      DROPLESS_RETURN_IF_ERROR(arena->Allocate(padded_rows_ * std::max(H, F),
                                               "column-wise image (x)", &col_image_x_));
      DROPLESS_RETURN_IF_ERROR(arena->Allocate(padded_rows_ * std::max(H, 2 * F),
                                               "column-wise image (dy)", &col_image_dy_));
    }
  }
  if (d.fp8_block()) {
    padded_rows_ = kernels::Fp8ColwisePaddedRows(R, El);
    if (dispatcher_ == nullptr) {
      DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, R, H, kernels::kFp8Block, &fb_rows_));
    } else {
      DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, Tk, H, kernels::kFp8Block, &fb_send_));
      DROPLESS_RETURN_IF_ERROR(arena->Allocate(R * H, "dequantized received rows", &dequantized_rows_));
    }
    DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, R, F, kernels::kFp8Block, &fb_a_));
    DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, R, H, kernels::kFp8Block, &fb_d_out_));
    DROPLESS_RETURN_IF_ERROR(AllocRowwise(arena, R, 2 * F, kernels::kFp8Block, &fb_d_h_));
    fb_col_rows_.scaling = fb_col_a_.scaling = d.fp8_block_x_scaling();
    if (!fp8_block_operands_in_forward()) {  // else each layer keeps its own
      DROPLESS_RETURN_IF_ERROR(
          AllocColwise(arena, padded_rows_, H, El, kernels::kFp8Block, &fb_col_rows_));
      DROPLESS_RETURN_IF_ERROR(
          AllocColwise(arena, padded_rows_, F, El, kernels::kFp8Block, &fb_col_a_));
    }
    DROPLESS_RETURN_IF_ERROR(AllocColwise(arena, padded_rows_, H, El, kernels::kFp8Block, &fb_col_d_out_));
    DROPLESS_RETURN_IF_ERROR(AllocColwise(arena, padded_rows_, 2 * F, El, kernels::kFp8Block, &fb_col_d_h_));
  }
  return absl::OkStatus();
}

absl::StatusOr<QuantizedWeight> LayerKernels::AllocateQuantizedWeight(int64_t kdim, int64_t ndim,
                                                                      DeviceArena* arena) const {
  const int64_t n = int64_t{dims_.local_experts()} * kdim * ndim;
  QuantizedWeight w;
  if (dims_.mx_core) {
    MxWeight& mx = w.mx;
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(n, "mxfp8 weight image (along n)", &mx.image_along_n));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(n, "mxfp8 weight image (along k)", &mx.image_along_k));
  } else if (dims_.mxfp8()) {
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
  if (dims_.mx_core) {  // the images straight from the bf16 weight, one read
    return kc::MxWeightImages(kernels::MxWeightImagesShape{E, kdim, ndim}, w, out.mx.image_along_n,
                              out.mx.image_along_k, stream);
  }
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
  const LayerKernels::ExpertGemms& gemms = k.expert_gemms_.at(k.dims_.local_experts());
  ExpertOperands o;
  o.is_w1 = true;
  o.gemm = gemms.w1.get();
  o.mx_gemm = gemms.mx_w1.get();
  o.fb_gemm = gemms.fb_w1.get();
  o.k = k.dims_.hidden;
  o.n = 2 * k.dims_.ffn;
  o.offsets = ExpertOffsets();
  o.w = w.w1;
  o.q_w = w.q_w1;
  o.dw = g.w1;
  o.dw_bf16 = g.w1_bf16;
  if (g.adamw_step != nullptr) {
    o.wgrad_adamw = gemms.adamw_w1.get();
    o.adamw_step = g.adamw_step;
    o.adamw = g.w1_adamw;
  }
  o.x = recv_rows_;
  o.x_mx = quantized_tokens() ? &mx_recv_ : &k.mx_rows_;
  o.x_col = &k.col_rows_;
  o.x_fb = quantized_tokens() ? &fb_recv_ : &k.fb_rows_;
  o.x_fb_col = k.fp8_block_operands_in_forward() ? &fb_col_x_ : &k.fb_col_rows_;
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
  const LayerKernels::ExpertGemms& gemms = k.expert_gemms_.at(k.dims_.local_experts());
  ExpertOperands o;
  o.gemm = gemms.w2.get();
  o.mx_gemm = gemms.mx_w2.get();
  o.fb_gemm = gemms.fb_w2.get();
  o.k = k.dims_.ffn;
  o.n = k.dims_.hidden;
  o.offsets = ExpertOffsets();
  o.w = w.w2;
  o.q_w = w.q_w2;
  o.dw = g.w2;
  o.dw_bf16 = g.w2_bf16;
  if (g.adamw_step != nullptr) {
    o.wgrad_adamw = gemms.adamw_w2.get();
    o.adamw_step = g.adamw_step;
    o.adamw = g.w2_adamw;
  }
  o.x = a_;
  o.x_mx = &k.mx_a_;
  o.x_col = &k.col_a_;
  o.x_fb = &k.fb_a_;
  o.x_fb_col = k.fp8_block_operands_in_forward() ? &fb_col_a_ : &k.fb_col_a_;
  o.y = out_rows_;
  o.dy = k.d_out_rows_;
  o.dy_mx = &k.mx_d_out_;
  o.dy_col = &k.col_d_out_;
  o.dy_fb = &k.fb_d_out_;
  o.dy_fb_col = &k.fb_col_d_out_;
  o.dx = k.d_a_;
  return o;
}

MoeLayerGpu::ExpertOperands MoeLayerGpu::Run(const ExpertOperands& o, LocalExperts run) const {
  if (Whole(run)) return o;
  const LayerKernels::ExpertGemms& gemms = k_->expert_gemms_.at(run.count);
  const bool w1 = o.is_w1;
  ExpertOperands r = o;
  r.gemm = w1 ? gemms.w1.get() : gemms.w2.get();
  r.mx_gemm = w1 ? gemms.mx_w1.get() : gemms.mx_w2.get();
  r.fb_gemm = w1 ? gemms.fb_w1.get() : gemms.fb_w2.get();
  r.offsets = o.offsets + run.first;
  const int64_t elements = int64_t{run.first} * o.k * o.n;  // experts before the run
  r.w = o.w + elements;
  MxWeight& mx = r.q_w.mx;
  if (mx.along_n != nullptr) {
    mx.along_n += elements;
    mx.along_n_scales += elements / kernels::kMxBlock;
    mx.along_k += elements;
    mx.along_k_scales += elements / kernels::kMxBlock;
  }
  if (mx.image_along_n != nullptr) {
    mx.image_along_n += elements;
    mx.image_along_k += elements;
  }
  kernels::Fp8BlockWeights& fb = r.q_w.fp8_block;
  if (fb.data != nullptr) {
    const int64_t blocks = elements / (int64_t{kernels::kFp8Block} * kernels::kFp8Block);
    fb.data += elements;
    fb.scales += blocks;
    fb.data_t += elements;
    fb.scales_t += blocks;
  }
  return r;
}

absl::Status MoeLayerGpu::ExpertForward(const ExpertOperands& o, cudaStream_t stream) {
  if (k_->dims_.fp8_block()) {
    const kernels::Fp8BlockWeights& q = o.q_w.fp8_block;
    return o.fb_gemm->Forward({o.x_fb->data, o.x_fb->scales}, {q.data_t, q.scales_t}, o.offsets,
                              o.y, stream);
  }
  if (k_->dims_.mxfp8()) {
    const MxWeight& q = o.q_w.mx;
    if (q.image_along_k != nullptr) {
      return o.mx_gemm->Forward({o.x_mx->data, o.x_mx->scales}, q.image_along_k, o.offsets, o.y,
                                stream);
    }
    return o.mx_gemm->Forward({o.x_mx->data, o.x_mx->scales}, {q.along_k, q.along_k_scales},
                              o.offsets, o.y, stream);
  }
  return o.gemm->Forward(Nv(o.x), Nv(o.w), o.offsets, Nv(o.y), stream);
}

absl::Status MoeLayerGpu::ExpertBackwardData(const ExpertOperands& o, cudaStream_t stream) {
  if (k_->dims_.fp8_block()) {
    const kernels::Fp8BlockWeights& q = o.q_w.fp8_block;
    return o.fb_gemm->BackwardData({o.dy_fb->data, o.dy_fb->scales}, {q.data, q.scales},
                                   o.offsets, o.dx, stream);
  }
  if (k_->dims_.mxfp8()) {
    const MxWeight& q = o.q_w.mx;
    if (q.image_along_n != nullptr) {
      return o.mx_gemm->BackwardData({o.dy_mx->data, o.dy_mx->scales}, q.image_along_n,
                                     o.offsets, o.dx, stream);
    }
    return o.mx_gemm->BackwardData({o.dy_mx->data, o.dy_mx->scales},
                                   {q.along_n, q.along_n_scales}, o.offsets, o.dx, stream);
  }
  return o.gemm->BackwardData(Nv(o.dy), Nv(o.w), o.offsets, Nv(o.dx), stream);
}

absl::Status MoeLayerGpu::ExpertBackwardWeight(const ExpertOperands& o, cudaStream_t stream) {
  if (k_->dims_.fp8_block()) {
    return o.fb_gemm->BackwardWeight({o.x_fb_col->data, o.x_fb_col->scales},
                                     {o.dy_fb_col->data, o.dy_fb_col->scales},
                                     o.x_fb_col->group_offsets, o.dw, stream);
  }
  if (k_->dims_.mx_core) {
    LayerKernels& k = *k_;
    const int El = k.dims_.local_experts();
    DROPLESS_RETURN_IF_ERROR(kc::MxColwiseImage(o.k, El, *o.x_col, k.col_image_x_, stream));
    DROPLESS_RETURN_IF_ERROR(kc::MxColwiseImage(o.n, El, *o.dy_col, k.col_image_dy_, stream));
    return o.gemm->BackwardWeight(Nv(k.col_image_x_), Nv(k.col_image_dy_),
                                  o.x_col->group_offsets, o.dw, stream);
  }
  if (k_->dims_.mxfp8()) {
    return o.mx_gemm->BackwardWeight({o.x_col->data, o.x_col->scales},
                                     {o.dy_col->data, o.dy_col->scales},
                                     o.x_col->group_offsets, o.dw, stream);
  }
  if (o.adamw_step != nullptr) {
    return o.wgrad_adamw->Update(Nv(o.x), Nv(o.dy), o.offsets, o.adamw_step, o.adamw, stream);
  }
  if (o.dw_bf16 != nullptr) {  // LayerDims::bf16_expert_grad
    return o.gemm->BackwardWeight(Nv(o.x), Nv(o.dy), o.offsets, Nv(o.dw_bf16), stream);
  }
  return o.gemm->BackwardWeight(Nv(o.x), Nv(o.dy), o.offsets, o.dw, stream);
}

}  // namespace dropless::cuda_engine
