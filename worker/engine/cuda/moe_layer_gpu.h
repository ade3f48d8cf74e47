// One MoE layer of one EP rank of the CUDA engine, forward and backward:
//   x_next = x + sum_j gate[t, j] * Expert_{id[t, j]}(x[t]) + sum_s Shared_s(x[t])
// composed from the kernel library: router GEMM (cuBLASLt), top-k routing and aux-loss
// statistics, the dispatch plan, permute, grouped GEMM w1, SwiGLU, grouped GEMM w2, unpermute with
// the weighted combine; shared experts are grouped GEMMs of one group. Backward runs through all
// of it, router included. Expert GEMMs run in bf16, MXFP8 (precision mxfp8) or fp8-block
// (precision fp8-block: 1x128 activation tiles, 128x128 weight blocks; fp8-block-wgrad128 scales
// the weight gradient's activations per 128x128 block too): the operands quantized by
// the kernels of mxfp8.h / fp8_block.h, the weights once per step by QuantizeWeight
// (moe_layer_expert_gemms.cc holds the precision-specific parts).
//
// At EP > 1 the routed rows go to the experts' owners through an ExpertDispatcher
// (ep/expert_dispatcher.h): forward and backward then run in stages around the collective calls
// (moe_layer_group.h drives every local rank through them); at EP = 1 the stages meet without any
// copy (the received rows are the permuted rows). With overlap the experts' stages run in chunks
// of the local experts (LayerDims::overlap_chunks), each chunk's GEMMs beside the exchange of the
// next (or previous) chunk's rows on the `comm` stream.
//
// Streams: `main` carries the routed path; `side` runs the shared experts beside it (and, in
// backward, the router's backward); `wgrad` runs the weight-gradient GEMMs, beside the data
// gradients in overlap's chunks, else in turn with them (LayerDims::serial_expert_backward). Every
// call ends with side and wgrad joined into main, so successive layers may reuse the scratch
// buffers. Nothing here synchronizes with the host: group sizes stay on the device.
#ifndef DROPLESS_WORKER_ENGINE_CUDA_MOE_LAYER_GPU_H_
#define DROPLESS_WORKER_ENGINE_CUDA_MOE_LAYER_GPU_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "dropless/kernels/fp8_block.h"
#include "dropless/kernels/fp8_block_grouped_gemm.h"
#include "dropless/kernels/grouped_gemm.h"
#include "dropless/kernels/grouped_wgrad_adamw.h"
#include "dropless/kernels/mx_grouped_gemm.h"
#include "dropless/kernels/mxfp8.h"
#include "dropless/kernels/router_gemm.h"
#include "dropless/kernels/routing.h"
#include "dropless/kernels/types.h"
#include "worker/engine/cuda/activation_offload.h"
#include "worker/engine/cuda/device_memory.h"
#include "worker/engine/cuda/ep/expert_dispatcher.h"

namespace dropless::cuda_engine {

using kernels::Bf16;

struct LayerDims {
  int64_t tokens = 0;  // T
  int64_t hidden = 0;  // H
  int64_t ffn = 0;     // F
  int experts = 0;     // E, global (the router's)
  int ep = 1;          // EP ranks; this rank owns experts / ep of them
  int topk = 0;
  int shared = 0;      // shared experts
  kernels::ScoreFunction score = kernels::ScoreFunction::kSoftmax;
  bool renormalize = true;
  // The expert GEMMs' precision (the rest of the layer is bf16 with fp32 accumulation).
  Precision precision = Precision::kBf16;
  // Recompute the cheap saved activations in the backward instead of keeping them (with
  // activation offload: fewer bytes over PCIe): the permuted rows (one permute of x) and the
  // SwiGLU output (one SwiGLU of the w1 output).
  bool recompute = false;
  // Overlap: each exchange and the expert GEMMs it feeds run in this many chunks of the local
  // experts (at most local_experts(); 1: no overlap).
  int overlap_chunks = 1;
  // The routed experts' GEMMs stay on at most this many multiprocessors (0: all): with overlap,
  // the rest are left to the exchange kernels that run beside them.
  int expert_gemm_sms = 0;
  // Each expert weight's data- and weight-gradient GEMMs run one after the other, and w1's after
  // w2's, instead of beside each other on the main and wgrad streams (without overlap's chunks;
  // LayerDimsOf). Two persistent GEMMs side by side split the multiprocessors and the L2 between
  // them: on an H100 the mixtral bf16 step was 8.4% slower with them side by side (docs/
  // cuda_engine.md, "Backward order of the expert GEMMs").
  bool serial_expert_backward = false;
  // The routed experts' AdamW runs in the epilogue of their weight-gradient GEMM
  // (kernels::GroupedWgradAdamW; bf16 only): their gradients are never stored, and each weight's
  // update follows its data-gradient GEMM, the last reader of its working copy. Chosen by
  // LayerDimsOf (engine_setup.h) from expected_rows_per_expert().
  bool fused_expert_adamw = false;
  // The routed experts' weight gradient is stored in bf16 (the GEMM's fp32 accumulator rounded
  // once in its epilogue, as autograd gives bf16 weights theirs) and the AdamW pass reads it so:
  // 4 bytes a parameter less traffic than fp32, half the buffer. bf16 with the two passes only
  // (not fused_expert_adamw); opt-in by DROPLESS_BF16_EXPERT_GRAD=1 (LayerDimsOf): faster, but it
  // moves bf16's loss away from the quantized precisions' (docs/step_performance.md, session 50).
  bool bf16_expert_grad = false;
  // mxfp8: the expert GEMMs run on the bf16 tensor cores, every MXFP8 product exact in bf16 with
  // fp32 accumulation: the forward and data gradient over exact bf16 images of the quantized
  // weights (MxGroupedGemm's image products; the images written after every update), the weight
  // gradient as the bf16 grouped GEMM over the column-wise operands' exact bf16 rows
  // (kernels::MxColwiseImage); else with per-32 promotion on the fp8 tensor cores. Chosen by
  // LayerDimsOf (mxfp8 only; hidden and ffn multiples of 64; DROPLESS_MX_CORE=0 turns it off).
  bool mx_core = false;
  // fp8-block: activations quantized by the passes that produce them instead of passes of their
  // own: SwiGLU's backward writes w1's output gradient in its two fp8-block forms
  // (kernels::cuda::SwigluBackwardFp8Block; its bf16 form is neither stored nor allocated), and
  // without an exchange (LayerKernels::fp8_block_local) the permute and SwiGLU write w1's and
  // w2's inputs in fp8-block form only, and the combine's backward w2's output gradient in both
  // forms (UnpermuteCombineBackwardFp8Block; no bf16 copy of any of them is stored or allocated).
  // Chosen by LayerDimsOf (DROPLESS_FP8_BLOCK_FUSED_QUANTIZERS=0 keeps the separate quantization
  // passes, for A/B runs).
  bool fp8_block_fused_quantizers = false;

  bool mxfp8() const { return precision == Precision::kMxfp8; }
  bool fp8_block() const { return IsFp8Block(precision); }
  // The fp8-block weight gradient's X operand: per 128 x 128 block in fp8-block-wgrad128, else
  // per 1 x 128 column tile (its column-wise buffers and its GEMMs read this one value).
  kernels::Fp8ColwiseScaling fp8_block_x_scaling() const {
    return precision == Precision::kFp8BlockWgrad128 ? kernels::Fp8ColwiseScaling::kPerBlock
                                                     : kernels::Fp8ColwiseScaling::kPerColumn;
  }
  bool quantized() const { return precision != Precision::kBf16; }
  int64_t rows() const { return tokens * topk; }  // T*k routed rows
  int local_experts() const { return experts / ep; }
  // Capacity of the received rows: every rank's rows routed to this one (dropless).
  int64_t recv_rows() const { return rows() * ep; }
  // The rows a local expert receives under uniform routing: every rank's T*k rows spread over all
  // experts.
  int64_t expected_rows_per_expert() const { return rows() * ep / std::max(1, experts); }
  EpShape ep_shape() const { return EpShape{ep, experts, rows()}; }
  // The runs of the local experts that overlap's chunks cover, as even as can be ({every local
  // expert} without overlap).
  std::vector<LocalExperts> ExpertChunks() const;
};

struct LayerStreams;
// The runs a layer's exchanges and expert stages go through: ExpertChunks() when the streams
// have a comm stream for the exchanges, else one run of every local expert. The one decision the
// group driver and the layer's stages share.
std::vector<LocalExperts> ExpertRuns(const LayerDims& dims, const LayerStreams& streams);

// MXFP8 copies of one expert weight W [El][k][n]: quantized along n (the data gradient's operand,
// [El][k][n] + scales [El][k][n/32]) and along k (the forward's, W^T [El][n][k] + [El][n][k/32]).
struct MxWeight {
  uint8_t* along_n = nullptr;
  uint8_t* along_n_scales = nullptr;
  uint8_t* along_k = nullptr;
  uint8_t* along_k_scales = nullptr;
  // LayerDims::mx_core: instead of the four above, the exact bf16 images (kernels::MxWeightImages,
  // straight from the bf16 weight) of W quantized along n ([E][k][n], the data gradient's
  // operand) and of W^T quantized along k ([E][n][k], the forward's); null otherwise.
  Bf16* image_along_n = nullptr;
  Bf16* image_along_k = nullptr;
};

// The quantized copies of one expert weight that the precision's expert GEMMs read: MXFP8
// (mxfp8) or fp8-block 128x128 blocks in both orientations (fp8-block); unset otherwise.
struct QuantizedWeight {
  MxWeight mx;
  kernels::Fp8BlockWeights fp8_block;
};

// Device weights of one layer (bf16 working copies of the fp32 master weights).
struct LayerWeights {
  const Bf16* router = nullptr;       // [E][H]
  const float* router_bias = nullptr; // [E] logit offsets or null (the teacher's skew)
  const Bf16* w1 = nullptr;           // [El][H][2F] this rank's experts
  const Bf16* w2 = nullptr;           // [El][F][H]
  const Bf16* shared_w1 = nullptr;    // [S][H][2F]
  const Bf16* shared_w2 = nullptr;    // [S][F][H]
  QuantizedWeight q_w1, q_w2;         // precisions mxfp8 and fp8-block
};

// fp32 gradients, overwritten by Backward (the flat buffers' layout of MoeParameterLayout); the
// routed experts' in bf16 instead with LayerDims::bf16_expert_grad. (bf16 routed-expert gradients
// as the default were measured once, with the scalar AdamW pass: no faster step on an H200, and
// the 500-step mxfp8-vs-bf16 loss drifted by 3%; bench/results/step-h200-20261202-bf16-wgrad.json.)
struct LayerGrads {
  float* router = nullptr;     // [H][E]
  float* w1 = nullptr;         // [El][H][2F]
  float* w2 = nullptr;         // [El][F][H]
  Bf16* w1_bf16 = nullptr;     // w1 and w2 in bf16 (LayerDims::bf16_expert_grad; w1, w2 null)
  Bf16* w2_bf16 = nullptr;
  float* shared_w1 = nullptr;  // [S][H][2F]
  float* shared_w2 = nullptr;  // [S][F][H]
  // LayerDims::fused_expert_adamw: the step's AdamW scalars (device) and the routed experts'
  // AdamW state, which their weight-gradient GEMMs update in place of writing w1 and w2.
  const kernels::AdamWStep* adamw_step = nullptr;
  kernels::AdamWTensors w1_adamw, w2_adamw;
};

struct LayerStreams {
  cudaStream_t main = nullptr;
  cudaStream_t comm = nullptr;       // overlap's exchanges (null without overlap)
  cudaStream_t side = nullptr;
  cudaStream_t wgrad = nullptr;
  cudaStream_t optimizer = nullptr;  // where LayerOptimizerHooks run (joined by the caller)
  StreamLinks* links = nullptr;
  PhaseTimer* timer = nullptr;  // may be null
};

// Called by Backward on LayerStreams::optimizer as soon as a weight's gradient is complete and
// the backward reads its working copy no more, so the caller's optimizer update of that weight
// runs beside the rest of the backward. Empty hooks are skipped.
struct LayerOptimizerHooks {
  std::function<absl::Status(cudaStream_t)> experts_w2;
  std::function<absl::Status(cudaStream_t)> experts_w1;
  std::function<absl::Status(cudaStream_t)> router_and_shared;
};

// Kernel objects and scratch shared by every layer of an engine (the student's; the quantized
// precisions' bf16 teacher has a forward-only set of its own: RankModel::teacher_layer).
class LayerKernels {
 public:
  // dispatcher: how the routed rows reach the experts' owners, or null (EP = 1, no exchange:
  // the experts read the permuted rows in place). Buffers that peers access come from it.
  // forward_only: bf16 layers that run their forward only (the synthetic task's teacher): no
  // backward scratch is allocated and the backward refuses to run.
  static absl::StatusOr<std::unique_ptr<LayerKernels>> Create(const LayerDims& dims,
                                                              DeviceArena* arena,
                                                              ExpertDispatcher* dispatcher,
                                                              bool forward_only = false);
  bool exchange() const { return dispatcher_ != nullptr; }
  bool forward_only() const { return forward_only_; }
  // fp8-block (fused quantizers) without an exchange: the permute and SwiGLU write w1's and w2's
  // inputs in fp8-block form only (PermuteFp8BlockGrouped, SwigluForwardFp8BlockGrouped), the
  // combine's backward w2's output gradient (UnpermuteCombineBackwardFp8Block): the bf16 permuted
  // rows, SwiGLU output and expert output gradient are never stored.
  bool fp8_block_local() const {
    return dims_.fp8_block_fused_quantizers && dispatcher_ == nullptr;
  }
  // fp8_block_local without recomputation: the forward writes the weight gradients' column-wise
  // operands too, and each layer keeps them (MoeLayerGpu::fb_col_x_, fb_col_a_); with it, the
  // backward recomputes them into the shared fb_col_rows_ and fb_col_a_ (BackwardCombine).
  bool fp8_block_operands_in_forward() const { return fp8_block_local() && !dims_.recompute; }

  // Quantizes a bf16 expert weight [E][k][n] into the precision's two forms (MXFP8 uses the
  // scratch transpose); nothing in bf16.
  absl::Status QuantizeWeight(const Bf16* w, int64_t k, int64_t n, const QuantizedWeight& out,
                              cudaStream_t stream);
  // Allocates the precision's two forms of an [E][k][n] weight (none in bf16).
  absl::StatusOr<QuantizedWeight> AllocateQuantizedWeight(int64_t k, int64_t n,
                                                          DeviceArena* arena) const;
  // The kernels the routed experts' GEMMs over every local expert run, per weight and product
  // ("w1 forward ..., data gradient ..., weight gradient ...; w2 ..."): the defaults follow the
  // shapes and the device (docs/grouped_gemm.md), so the engine logs them.
  std::string ExpertGemmKernels() const;

 private:
  friend class MoeLayerGpu;
  LayerKernels() = default;
  // The routed experts' GEMM objects of one group count (the precision's kind only).
  struct ExpertGemms {
    std::unique_ptr<kernels::GroupedGemm> w1, w2;
    std::unique_ptr<kernels::MxGroupedGemm> mx_w1, mx_w2;
    std::unique_ptr<kernels::Fp8BlockGroupedGemm> fb_w1, fb_w2;
    // fused_expert_adamw, every local expert only (the weight gradient is never chunked).
    std::unique_ptr<kernels::GroupedWgradAdamW> adamw_w1, adamw_w2;
  };
  // The expert GEMMs over `groups` local experts, and the quantized precisions' scratch
  // (moe_layer_expert_gemms.cc).
  absl::Status CreateExpertGemms(int groups, ExpertGemms* out) const;
  absl::Status AllocateQuantizedScratch(DeviceArena* arena);
  absl::Status AllocateBackwardScratch(DeviceArena* arena);

  LayerDims dims_;
  ExpertDispatcher* dispatcher_ = nullptr;
  bool forward_only_ = false;
  std::unique_ptr<kernels::cuda::RouterGemm> router_;
  std::unique_ptr<kernels::GroupedGemm> shared_w1_, shared_w2_;
  // By group count: every local expert, and the sizes of overlap's chunks.
  std::map<int, ExpertGemms> expert_gemms_;
  int32_t* shared_offsets_ = nullptr;  // {0, T}
  void* plan_workspace_ = nullptr;
  int64_t padded_rows_ = 0;            // MXFP8 column-wise rows

  // Forward scratch.
  Bf16* combined_ = nullptr;            // [T][H] routed output
  std::vector<Bf16*> shared_out_;       // [S][T][H]
  // Backward scratch (R = recv_rows(): the received side; at EP = 1 both sides are one buffer).
  Bf16* d_out_rows_ = nullptr;          // [R][H] the experts' output gradients
  Bf16* d_out_send_ = nullptr;          // [Tk][H] the same, as computed at the tokens' rank
  Bf16* d_a_ = nullptr;                 // [R][F]
  Bf16* d_h_ = nullptr;                 // [R][2F]
  Bf16* d_rows_ = nullptr;              // [R][H] the experts' input gradients
  Bf16* d_rows_send_ = nullptr;         // [Tk][H] the same, back at the tokens' rank
  Bf16* d_x_routed_ = nullptr;          // [T][H]
  Bf16* d_x_router_ = nullptr;          // [T][H]
  float* d_weights_ = nullptr;          // [T][k]
  float* d_logits_ = nullptr;           // [T][E]
  float* d_router_ = nullptr;           // [E][H]
  Bf16* d_shared_a_ = nullptr;          // [T][F]
  Bf16* d_shared_h_ = nullptr;          // [T][2F]
  std::vector<Bf16*> d_x_shared_;       // [S][T][H]
  // MXFP8 scratch (precision mxfp8). With an exchange the tokens are quantized at their rank
  // (mx_send_) and travel so; each layer keeps what it received (MoeLayerGpu::mx_recv_) and the
  // backward dequantizes it here for w1's column-wise operand.
  kernels::MxRowwise mx_rows_, mx_a_, mx_d_out_, mx_d_h_, mx_send_;
  Bf16* dequantized_rows_ = nullptr;    // [R][H]
  // Recomputed or per-layer-transient activations (LayerDims::recompute, or the rows an exchange
  // sends): one set for all layers, rewritten by each layer's forward and backward.
  Bf16* permuted_scratch_ = nullptr;    // [Tk][H]
  Bf16* swiglu_scratch_ = nullptr;      // [R][F]
  kernels::MxColwise col_rows_, col_a_, col_d_out_, col_d_h_;
  // LayerDims::mx_core: the weight gradient's column-wise operands as exact bf16 rows
  // (kernels::MxColwiseImage, [P][cols]) for the bf16 grouped GEMM; one pair for both weights
  // (their weight gradients run one after the other on the wgrad stream).
  Bf16* col_image_x_ = nullptr;         // [P][max(H, F)]
  Bf16* col_image_dy_ = nullptr;        // [P][max(H, 2F)]
  // fp8-block scratch (precision fp8-block; with an exchange the tokens are quantized at their
  // rank, fb_send_, and travel so, as in mxfp8): row-wise operands of the forward and data
  // gradient, column-wise of the weight gradient.
  kernels::Fp8BlockRowwise fb_rows_, fb_a_, fb_d_out_, fb_d_h_, fb_send_;
  kernels::Fp8BlockColwise fb_col_rows_, fb_col_a_, fb_col_d_out_, fb_col_d_h_;
  Bf16* transpose_scratch_ = nullptr;   // the largest [El][n][k] weight
};

class MoeLayerGpu {
 public:
  // Allocates what the forward keeps for the backward (the layer's activations): the large ones
  // from `saved` (per layer on the device, or the offload ring), the rest from the arena.
  static absl::StatusOr<std::unique_ptr<MoeLayerGpu>> Create(LayerKernels* kernels,
                                                             DeviceArena* arena,
                                                             SavedActivations* saved,
                                                             int64_t layer);
  // A forward-only layer (kernels->forward_only(), with an exchange) that runs over `other`'s
  // buffers: its routing, saved activations, exchange plan and expert outputs are other's, its
  // received rows other's kernels' input-gradient buffer (R x H bf16, written by the peers; free
  // outside the backward). For the bf16 teacher of a quantized engine at EP > 1, whose forward
  // ends before the student's layer 0 (`other`) writes any of them: no receive-sized buffer of
  // its own. `other` must keep bf16 forms of what a bf16 forward writes (any layer with an
  // exchange does).
  static absl::StatusOr<std::unique_ptr<MoeLayerGpu>> CreateOver(LayerKernels* kernels,
                                                                 const MoeLayerGpu& other);

  // x [T][H] -> x_next [T][H] (must not alias x) at EP = 1 (the three stages below in a row).
  // With train, keeps what Backward needs; aux_loss (device float) receives the layer's aux loss
  // (before its coefficient). aux_loss may be null (the teacher).
  absl::Status Forward(const LayerWeights& w, const Bf16* x, Bf16* x_next, float* aux_loss,
                       const LayerStreams& s);

  // Forward stages. Route: shared experts forked to side, router, top-k, the dispatch plan, the
  // rows permuted into expert order (the exchange plan's send_offsets). Experts: the routed
  // experts on the received rows. Combine: the weighted combine, the residual sum and (aux_loss
  // not null) the aux loss from the group's statistics (job_counts() and prob_sums(), which the
  // caller sums over the EP group first at EP > 1).
  absl::Status ForwardRoute(const LayerWeights& w, const Bf16* x, const LayerStreams& s);
  absl::Status ForwardExperts(const LayerWeights& w, const LayerStreams& s);
  // ForwardExperts in parts, for overlap's chunks: w1 on the received rows of a run of the local
  // experts, SwiGLU on every received row, w2 on a run (all on main).
  absl::Status ForwardW1(const LayerWeights& w, LocalExperts run, const LayerStreams& s);
  absl::Status ForwardSwiglu(const LayerStreams& s);
  absl::Status ForwardW2(const LayerWeights& w, LocalExperts run, const LayerStreams& s);
  absl::Status ForwardCombine(const Bf16* x, Bf16* x_next, float* aux_loss, const LayerStreams& s);

  // d_x_next -> d_x (both [T][H], no alias), every gradient in `grads`, at EP = 1. aux_coef:
  // d objective / d aux_loss of this layer. Side and wgrad are joined into main at the end; the
  // optimizer stream (the hooks' work) is not.
  absl::Status Backward(const LayerWeights& w, const Bf16* x, const Bf16* d_x_next, float aux_coef,
                        const LayerGrads& grads, Bf16* d_x, const LayerStreams& s,
                        const LayerOptimizerHooks& hooks = {});

  // Backward stages. Combine: shared experts' backward forked, the combine's backward (the
  // experts' output gradients at the tokens' rank, the gate gradients), the router's backward on
  // side. Experts: the routed experts' backward on the received rows (with the hooks). Route: the
  // permutation's backward into d_x and the sum of every input gradient.
  absl::Status BackwardCombine(const LayerWeights& w, const Bf16* x, const Bf16* d_x_next,
                               float aux_coef, const LayerGrads& grads, const LayerStreams& s,
                               const LayerOptimizerHooks& hooks);
  absl::Status BackwardExperts(const LayerWeights& w, const LayerGrads& grads,
                               const LayerStreams& s, const LayerOptimizerHooks& hooks);
  // BackwardExperts in parts, for overlap's chunks. W2Data: w2's data gradient of a run (its
  // output gradient quantized row-wise first in mxfp8 / fp8-block; for every expert at once also
  // column-wise, the weight gradient starting beside it unless serial_expert_backward). Middle,
  // once every run's W2Data is queued: w2's weight gradient (after the data gradients when
  // serial) and hook, SwiGLU's backward, w1's operands and weight gradient. W1Data: w1's data
  // gradient of a run (when serial, after the weight gradients queued before it). End: w1's
  // hook. With fused_expert_adamw each weight gradient waits for every data gradient of its
  // weight, and w1's moves to End.
  absl::Status BackwardW2Data(const LayerWeights& w, const LayerGrads& grads, LocalExperts run,
                              const LayerStreams& s);
  absl::Status BackwardExpertsMiddle(const LayerWeights& w, const LayerGrads& grads,
                                     const LayerStreams& s, const LayerOptimizerHooks& hooks);
  absl::Status BackwardW1Data(const LayerWeights& w, const LayerGrads& grads, LocalExperts run,
                              const LayerStreams& s);
  absl::Status BackwardExpertsEnd(const LayerWeights& w, const LayerGrads& grads,
                                  const LayerStreams& s, const LayerOptimizerHooks& hooks);
  absl::Status BackwardRoute(const Bf16* d_x_next, Bf16* d_x, const LayerStreams& s);

  // The exchanges of this rank (EP > 1): the plan, and the rows each stage moves.
  // With mxfp8 and fp8-block the tokens travel quantized: kTokens then carries the e4m3 rows (H
  // bytes each) and kTokenScales their scales (H / 32 bytes: E8M0 per 32, or fp32 per 128),
  // 0.52x the bf16 bytes.
  enum class Rows { kTokens, kTokenScales, kExpertOutputs, kOutputGradients, kInputGradients };
  RankCall ExchangeCall(Rows rows, cudaStream_t stream);
  size_t RowBytes(Rows rows) const;
  bool quantized_tokens() const {
    return k_->exchange() && k_->dims_.quantized();
  }
  const ExchangePlan& plan() const { return plan_; }
  const LayerDims& dims() const { return k_->dims_; }

  // Tokens per global expert of the last forward: this rank's, and the EP group's.
  const int32_t* expert_counts() const { return counts_; }
  const int32_t* job_counts() const { return k_->exchange() ? plan_.job_counts : counts_; }
  // Per-expert sums of the routing distribution; summed over the group in place by the caller
  // when the layer exchanges rows.
  float* prob_sums() { return prob_sums_; }

  // The routed experts' GEMMs of the last forward and backward, each product timed alone on
  // `stream` over `iterations` runs: seconds of one run of forward (w1 + w2), dgrad (w2 + w1)
  // and wgrad (w2 + w1). For the benchmark's step-vs-GEMM comparison.
  absl::Status TimeExpertGemms(const LayerWeights& w, const LayerGrads& grads, int iterations,
                               cudaStream_t stream, double seconds[3]);

 private:
  explicit MoeLayerGpu(LayerKernels* kernels) : k_(kernels) {}
  kernels::RoutingShape RoutingShape() const;
  // The received rows' groups: [El + 1] offsets per local expert.
  const int32_t* ExpertOffsets() const {
    return k_->exchange() ? plan_.recv_offsets : offsets_;
  }

  absl::Status SharedForward(const LayerWeights& w, const Bf16* x, const LayerStreams& s);
  absl::Status SharedBackward(const LayerWeights& w, const Bf16* x, const Bf16* d_x_next,
                              const LayerGrads& grads, const LayerStreams& s);
  // The operands of one routed expert weight's three products, bf16, MXFP8 or fp8-block (w1:
  // rows -> h; w2: a -> out_rows).
  struct ExpertOperands {
    bool is_w1 = false;                         // w1 (rows -> h) or w2 (a -> out_rows)
    kernels::GroupedGemm* gemm = nullptr;
    kernels::MxGroupedGemm* mx_gemm = nullptr;
    kernels::Fp8BlockGroupedGemm* fb_gemm = nullptr;
    int64_t k = 0, n = 0;                       // the weight is [El][k][n]
    const int32_t* offsets = nullptr;           // the received rows' groups
    const Bf16* w = nullptr;
    QuantizedWeight q_w;
    float* dw = nullptr;
    Bf16* dw_bf16 = nullptr;  // instead of dw with LayerDims::bf16_expert_grad
    // Set (fused_expert_adamw): the weight gradient applies AdamW to `adamw` instead of writing dw.
    kernels::GroupedWgradAdamW* wgrad_adamw = nullptr;
    const kernels::AdamWStep* adamw_step = nullptr;
    kernels::AdamWTensors adamw;
    const Bf16* x = nullptr;                    // forward input
    const kernels::MxRowwise* x_mx = nullptr;   // its row-wise MXFP8 (mxfp8)
    const kernels::MxColwise* x_col = nullptr;  // its column-wise MXFP8 (mxfp8, weight gradient)
    const kernels::Fp8BlockRowwise* x_fb = nullptr;      // the same two in fp8-block
    const kernels::Fp8BlockColwise* x_fb_col = nullptr;
    Bf16* y = nullptr;                          // forward output
    const Bf16* dy = nullptr;                   // output gradient
    const kernels::MxRowwise* dy_mx = nullptr;
    const kernels::MxColwise* dy_col = nullptr;
    const kernels::Fp8BlockRowwise* dy_fb = nullptr;
    const kernels::Fp8BlockColwise* dy_fb_col = nullptr;
    Bf16* dx = nullptr;                         // input gradient
  };
  ExpertOperands W1(const LayerWeights& w, const LayerGrads& g);
  ExpertOperands W2(const LayerWeights& w, const LayerGrads& g);
  // The operands of a run of the local experts (forward and data gradient): its GEMM objects,
  // weights and offsets. Every expert: o itself.
  ExpertOperands Run(const ExpertOperands& o, LocalExperts run) const;
  bool Whole(LocalExperts run) const {
    return run.count == 0 || run.count == k_->dims_.local_experts();
  }
  // The weight gradient's operands (the tokens dequantized, column-wise forms; dy's too when
  // dy_colwise) and product on the wgrad stream.
  absl::Status WeightGradient(const ExpertOperands& o, int64_t in_cols, int64_t out_cols,
                              bool dy_colwise, const LayerStreams& s);
  absl::Status ExpertForward(const ExpertOperands& o, cudaStream_t stream);
  absl::Status ExpertBackwardData(const ExpertOperands& o, cudaStream_t stream);
  absl::Status ExpertBackwardWeight(const ExpertOperands& o, cudaStream_t stream);

  LayerKernels* const k_;
  // Saved activations (R = recv_rows(); at EP = 1 the send and receive sides are one buffer).
  float* logits_ = nullptr;        // [T][E]
  int32_t* expert_ids_ = nullptr;  // [T][k]
  float* gates_ = nullptr;         // [T][k]
  int32_t* counts_ = nullptr;      // [E]
  float* prob_sums_ = nullptr;     // [E]
  int32_t* offsets_ = nullptr;     // [E + 1] this rank's rows per global expert
  int32_t* slot_of_choice_ = nullptr;
  int32_t* choice_of_slot_ = nullptr;
  Bf16* rows_ = nullptr;  // [Tk][H] permuted input (null with fp8_block_local)
  // With fp8_block_operands_in_forward: the column-wise forms of the permuted input and of the
  // SwiGLU output (w1's and w2's weight-gradient operands).
  kernels::Fp8BlockColwise fb_col_x_, fb_col_a_;
  Bf16* recv_rows_ = nullptr;      // [R][H] the experts' input (quantized tokens: the kernels'
                                   // dequantization scratch, filled in the backward)
  kernels::MxRowwise mx_recv_;     // [R][H] quantized tokens as received (mxfp8)
  kernels::Fp8BlockRowwise fb_recv_;  // the same in fp8-block
  Bf16* h_ = nullptr;              // [R][2F]
  Bf16* a_ = nullptr;              // [R][F] (null with fp8_block_local)
  Bf16* out_rows_ = nullptr;       // [R][H] expert outputs
  Bf16* out_send_ = nullptr;       // [Tk][H] expert outputs back at the tokens' rank
  ExchangePlan plan_;              // with a dispatcher
  std::vector<Bf16*> shared_h_;    // [S][T][2F]
  std::vector<Bf16*> shared_a_;    // [S][T][F]
};

}  // namespace dropless::cuda_engine

#endif  // DROPLESS_WORKER_ENGINE_CUDA_MOE_LAYER_GPU_H_
