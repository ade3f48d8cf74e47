// CudaEngine (cuda_engine.h): parameters, the step graph and the step's statistics.
#include "worker/engine/cuda/cuda_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/step_phase.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "worker/engine/cpu/moe_model.h"
#include "worker/engine/cpu/synthetic_task.h"
#include "worker/engine/cuda/cuda_checkpoint.h"
#include "worker/engine/cuda/device_memory.h"
#include "worker/engine/cuda/engine_kernels.h"
#include "worker/engine/cuda/moe_layer_gpu.h"

namespace dropless::cuda_engine {
namespace {

using kernels::cuda::CudaStatus;
using Clock = std::chrono::steady_clock;

// A trainable flat buffer (MoeParameterLayout's replicated or experts buffer) with its fp32
// gradient, AdamW moments and bf16 working copy.
struct TrainableBuffer {
  float* value = nullptr;
  float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  Bf16* bf16 = nullptr;
  int64_t size = 0;

  absl::Status Allocate(DeviceArena* arena, int64_t n) {
    size = n;
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(n, "master weights", &value));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(n, "weight gradients", &grad));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(n, "AdamW first moments", &m));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(n, "AdamW second moments", &v));
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(n, "bf16 weights", &bf16));
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemset(grad, 0, n * sizeof(float)));
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemset(m, 0, n * sizeof(float)));
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemset(v, 0, n * sizeof(float)));
    return absl::OkStatus();
  }
};

// The bf16 (and MXFP8) weights of a model: the student's working copies or the fixed teacher.
struct ModelWeights {
  Bf16* router = nullptr;      // [L][E][H]
  Bf16* replicated = nullptr;  // the replicated buffer's layout (router region unused)
  Bf16* experts = nullptr;     // the experts buffer's layout
  float* router_bias = nullptr;
  std::vector<MxWeight> mx_w1, mx_w2;  // per layer, precision mxfp8
};

// The AdamW tensors of one layer (FusedAdamW's list indices).
struct OptimizerGroups {
  int router_first = 0, router_count = 0;  // the router and, when there are any, shared experts
  int w1 = 0, w2 = 0;
};

class CudaEngineImpl final : public CudaEngine {
 public:
  explicit CudaEngineImpl(const EngineConfig& config, int rank, int world_size)
      : config_(config),
        rank_(rank),
        world_size_(world_size),
        layout_(config.model, config.parallel.ep, rank % config.parallel.ep,
                config.tokens_per_rank),
        seeds_(cpu::DeriveTaskSeeds(config.data.seed)),
        tokens_(seeds_.tokens, config.model.hidden) {}

  ~CudaEngineImpl() override {
    if (graph_exec_ != nullptr) cudaGraphExecDestroy(graph_exec_);
    for (cudaStream_t s : {streams_.main, streams_.side, streams_.wgrad, streams_.optimizer}) {
      if (s != nullptr) cudaStreamDestroy(s);
    }
  }

  absl::Status Initialize();
  absl::StatusOr<StepStats> Step() override;
  double PeakFlops() const override { return kHopperDenseBf16PeakFlops; }
  absl::Status SaveCheckpoint(const std::string& dir) override;
  int64_t StepsDone() const override { return steps_done_; }
  absl::StatusOr<GemmSeconds> TimeExpertGemms(int iterations) override;
  CudaStepDetails LastStepDetails() const override { return details_; }

 private:
  int64_t L() const { return layout_.layers(); }
  int64_t RepPerLayer() const { return layout_.replicated_size() / L(); }
  int64_t ExpPerLayer() const { return layout_.experts_size() / L(); }
  LayerWeights Weights(const ModelWeights& m, int64_t layer) const;
  LayerGrads Grads(int64_t layer) const;
  absl::Status InitializeWeights(uint64_t seed, float* replicated, float* experts);
  absl::Status RefreshWorkingCopies(const float* replicated, const float* experts,
                                    ModelWeights* weights, cudaStream_t stream);
  absl::Status QuantizeExperts(ModelWeights* weights, cudaStream_t stream);
  absl::Status RecordStep();
  absl::Status Restore(const std::string& dir);
  absl::Status MarkPhase(StepPhase phase) {
    return WriteMarker(phase_marker_, static_cast<int32_t>(phase), streams_.main);
  }
  absl::Status WaitForStep();

  const EngineConfig config_;
  const int rank_;
  const int world_size_;
  const cpu::MoeParameterLayout layout_;
  const cpu::TaskSeeds seeds_;
  const cpu::TokenGenerator tokens_;
  LayerDims dims_;

  DeviceArena arena_;
  StreamLinks links_;
  PhaseTimer timer_;
  LayerStreams streams_;
  std::unique_ptr<LayerKernels> kernels_;
  std::vector<std::unique_ptr<MoeLayerGpu>> layers_;
  std::unique_ptr<FusedAdamW> adamw_;
  std::vector<OptimizerGroups> optimizer_groups_;

  TrainableBuffer replicated_, experts_;
  ModelWeights student_, teacher_;
  std::vector<Bf16*> activations_;  // x_0 .. x_L
  Bf16* target_ = nullptr;
  Bf16* grad_a_ = nullptr;
  Bf16* grad_b_ = nullptr;
  double* basis_ = nullptr;
  int64_t* step_counter_ = nullptr;
  // The step graph writes the phase it is entering here (mapped pinned memory); the host relays
  // it to the hang watchdog (common/step_phase.h) while it waits for the step.
  int32_t* phase_marker_ = nullptr;
  // Read back after every step, in one copy to pinned memory: [squared error (double)]
  // [aux loss per layer (float)] [tokens per expert per layer (int32)], gathered by the graph.
  uint8_t* stats_ = nullptr;
  uint8_t* host_stats_ = nullptr;
  size_t StatsBytes() const { return sizeof(double) + L() * sizeof(float) + CountsBytes(); }
  size_t CountsOffset() const { return sizeof(double) + L() * sizeof(float); }
  size_t CountsBytes() const { return static_cast<size_t>(L() * dims_.experts) * sizeof(int32_t); }

  bool use_graph_ = true;
  // Each weight's update beside the backward (LayerOptimizerHooks) or all after it:
  // DROPLESS_OPTIMIZER_OVERLAP=0 (for A/B runs of dropless-bench step --variants).
  bool overlap_optimizer_ = true;
  cudaGraphExec_t graph_exec_ = nullptr;
  int64_t steps_done_ = 0;
  CudaStepDetails details_;
};

LayerWeights CudaEngineImpl::Weights(const ModelWeights& m, int64_t layer) const {
  const int64_t H = dims_.hidden, F = dims_.ffn, E = dims_.experts, S = dims_.shared;
  LayerWeights w;
  w.router = m.router + layer * E * H;
  w.router_bias = m.router_bias;
  w.w1 = m.experts + layer * ExpPerLayer();
  w.w2 = w.w1 + E * H * 2 * F;
  w.shared_w1 = m.replicated + layer * RepPerLayer() + H * E;
  w.shared_w2 = w.shared_w1 + S * H * 2 * F;
  if (dims_.mxfp8) {
    w.mx_w1 = m.mx_w1[layer];
    w.mx_w2 = m.mx_w2[layer];
  }
  return w;
}

LayerGrads CudaEngineImpl::Grads(int64_t layer) const {
  const int64_t H = dims_.hidden, F = dims_.ffn, E = dims_.experts, S = dims_.shared;
  LayerGrads g;
  g.router = replicated_.grad + layer * RepPerLayer();
  g.shared_w1 = g.router + H * E;
  g.shared_w2 = g.shared_w1 + S * H * 2 * F;
  g.w1 = experts_.grad + layer * ExpPerLayer();
  g.w2 = g.w1 + E * H * 2 * F;
  return g;
}

absl::Status CudaEngineImpl::InitializeWeights(uint64_t seed, float* replicated, float* experts) {
  std::vector<DeviceNormalFill> fills;
  for (const cpu::MoeParameterLayout::NormalFill& f : layout_.InitialFills(seed)) {
    fills.push_back(DeviceNormalFill{f.buffer, f.offset, f.stream, f.count, f.scale});
  }
  return FillNormal(fills, replicated, experts, streams_.main);
}

// bf16 copies of fp32 weights: the router transposed to [E][H], everything else as laid out.
absl::Status CudaEngineImpl::RefreshWorkingCopies(const float* replicated, const float* experts,
                                                  ModelWeights* weights, cudaStream_t stream) {
  const int64_t H = dims_.hidden, E = dims_.experts;
  DROPLESS_RETURN_IF_ERROR(CastToBf16(layout_.replicated_size(), replicated, weights->replicated, stream));
  DROPLESS_RETURN_IF_ERROR(CastToBf16(layout_.experts_size(), experts, weights->experts, stream));
  for (int64_t l = 0; l < L(); ++l) {
    DROPLESS_RETURN_IF_ERROR(Transpose(1, H, E, weights->replicated + l * RepPerLayer(),
                              weights->router + l * E * H, stream));
  }
  return absl::OkStatus();
}

absl::Status CudaEngineImpl::QuantizeExperts(ModelWeights* weights, cudaStream_t stream) {
  if (!dims_.mxfp8) return absl::OkStatus();
  for (int64_t l = 0; l < L(); ++l) {
    const LayerWeights w = Weights(*weights, l);
    DROPLESS_RETURN_IF_ERROR(kernels_->QuantizeWeight(w.w1, dims_.hidden, 2 * dims_.ffn, weights->mx_w1[l], stream));
    DROPLESS_RETURN_IF_ERROR(kernels_->QuantizeWeight(w.w2, dims_.ffn, dims_.hidden, weights->mx_w2[l], stream));
  }
  return absl::OkStatus();
}

absl::Status CudaEngineImpl::Initialize() {
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  int major = 0;
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major != 9) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cuda engine: needs a Hopper GPU (sm_90); device 0 is sm_%d0", major));
  }
  if (const char* g = std::getenv("DROPLESS_CUDA_GRAPH"); g != nullptr && std::strcmp(g, "0") == 0) {
    use_graph_ = false;
  }
  if (const char* o = std::getenv("DROPLESS_OPTIMIZER_OVERLAP"); o != nullptr && std::strcmp(o, "0") == 0) {
    overlap_optimizer_ = false;
  }
  for (cudaStream_t* s : {&streams_.main, &streams_.side, &streams_.wgrad, &streams_.optimizer}) {
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
  }
  streams_.links = &links_;
  streams_.timer = &timer_;

  const ModelSpec& m = config_.model;
  dims_.tokens = config_.tokens_per_rank;
  dims_.hidden = m.hidden;
  dims_.ffn = m.ffn;
  dims_.experts = static_cast<int>(m.experts);
  dims_.topk = static_cast<int>(m.topk);
  dims_.shared = static_cast<int>(m.shared_experts);
  dims_.score = m.router == RouterKind::kSigmoid ? kernels::ScoreFunction::kSigmoid
                                                 : kernels::ScoreFunction::kSoftmax;
  dims_.renormalize = m.renormalize;
  dims_.mxfp8 = config_.precision == Precision::kMxfp8;

  absl::StatusOr<std::unique_ptr<LayerKernels>> k = LayerKernels::Create(dims_, &arena_);
  if (!k.ok()) return k.status();
  kernels_ = *std::move(k);
  for (int64_t l = 0; l < L(); ++l) {
    absl::StatusOr<std::unique_ptr<MoeLayerGpu>> layer = MoeLayerGpu::Create(kernels_.get(), &arena_);
    if (!layer.ok()) return layer.status();
    layers_.push_back(*std::move(layer));
  }

  const int64_t T = dims_.tokens, H = dims_.hidden, E = dims_.experts;
  DROPLESS_RETURN_IF_ERROR(replicated_.Allocate(&arena_, layout_.replicated_size()));
  DROPLESS_RETURN_IF_ERROR(experts_.Allocate(&arena_, layout_.experts_size()));
  for (ModelWeights* w : {&student_, &teacher_}) {
    DROPLESS_RETURN_IF_ERROR(arena_.Allocate(L() * E * H, "bf16 router", &w->router));
    if (dims_.mxfp8) {
      for (int64_t l = 0; l < L(); ++l) {
        absl::StatusOr<MxWeight> w1 = kernels_->AllocateMxWeight(H, 2 * dims_.ffn, &arena_);
        if (!w1.ok()) return w1.status();
        absl::StatusOr<MxWeight> w2 = kernels_->AllocateMxWeight(dims_.ffn, H, &arena_);
        if (!w2.ok()) return w2.status();
        w->mx_w1.push_back(*w1);
        w->mx_w2.push_back(*w2);
      }
    }
  }
  student_.replicated = replicated_.bf16;
  student_.experts = experts_.bf16;
  DROPLESS_RETURN_IF_ERROR(arena_.Allocate(layout_.replicated_size(), "teacher weights", &teacher_.replicated));
  DROPLESS_RETURN_IF_ERROR(arena_.Allocate(layout_.experts_size(), "teacher weights", &teacher_.experts));
  const std::vector<double> bias = cpu::TeacherRouterBias(config_.data, E);
  if (config_.data.distribution == RoutingDistribution::kZipf) {
    const std::vector<float> bias_f(bias.begin(), bias.end());
    DROPLESS_RETURN_IF_ERROR(arena_.Allocate(E, "teacher router bias", &teacher_.router_bias));
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemcpy(teacher_.router_bias, bias_f.data(),
                                             E * sizeof(float), cudaMemcpyHostToDevice));
  }

  activations_.resize(L() + 1);
  for (Bf16*& a : activations_) DROPLESS_RETURN_IF_ERROR(arena_.Allocate(T * H, "layer activations", &a));
  DROPLESS_RETURN_IF_ERROR(arena_.Allocate(T * H, "targets", &target_));
  DROPLESS_RETURN_IF_ERROR(arena_.Allocate(T * H, "output gradient", &grad_a_));
  DROPLESS_RETURN_IF_ERROR(arena_.Allocate(T * H, "input gradient", &grad_b_));
  DROPLESS_RETURN_IF_ERROR(arena_.Allocate(static_cast<int64_t>(tokens_.basis().size()), "token basis", &basis_));
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemcpy(basis_, tokens_.basis().data(),
                                           tokens_.basis().size() * sizeof(double),
                                           cudaMemcpyHostToDevice));
  DROPLESS_RETURN_IF_ERROR(arena_.Allocate(1, "step counter", &step_counter_));
  absl::StatusOr<void*> marker = arena_.AllocatePinnedHost(sizeof(int32_t), "phase marker");
  if (!marker.ok()) return marker.status();
  phase_marker_ = static_cast<int32_t*>(*marker);
  *phase_marker_ = static_cast<int32_t>(StepPhase::kForward);
  DROPLESS_RETURN_IF_ERROR(arena_.Allocate(static_cast<int64_t>(StatsBytes()), "step statistics", &stats_));
  absl::StatusOr<void*> host_stats = arena_.AllocatePinnedHost(StatsBytes(), "step statistics");
  if (!host_stats.ok()) return host_stats.status();
  host_stats_ = static_cast<uint8_t*>(*host_stats);

  // The teacher: fp32 draws (in the student's not yet initialized buffers), kept in bf16.
  DROPLESS_RETURN_IF_ERROR(InitializeWeights(seeds_.teacher, replicated_.value, experts_.value));
  DROPLESS_RETURN_IF_ERROR(RefreshWorkingCopies(replicated_.value, experts_.value, &teacher_, streams_.main));
  DROPLESS_RETURN_IF_ERROR(InitializeWeights(seeds_.student, replicated_.value, experts_.value));
  if (!config_.checkpoint.dir.empty()) DROPLESS_RETURN_IF_ERROR(Restore(config_.checkpoint.dir));
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemcpy(step_counter_, &steps_done_, sizeof(int64_t),
                                           cudaMemcpyHostToDevice));
  DROPLESS_RETURN_IF_ERROR(RefreshWorkingCopies(replicated_.value, experts_.value, &student_, streams_.main));
  DROPLESS_RETURN_IF_ERROR(QuantizeExperts(&teacher_, streams_.main));
  DROPLESS_RETURN_IF_ERROR(QuantizeExperts(&student_, streams_.main));

  // AdamW over every tensor, in per-layer groups so that each weight is updated as soon as its
  // gradient is complete (LayerOptimizerHooks): per layer the router (its bf16 copy transposed to
  // [E][H]) and the shared experts, then the routed experts' w1 and w2.
  std::vector<AdamWTensor> tensors;
  auto add = [&](TrainableBuffer& b, int64_t offset, int64_t n, Bf16* copy, int64_t rows,
                 int64_t cols) {
    tensors.push_back(AdamWTensor{b.value + offset, b.grad + offset, b.m + offset, b.v + offset, n,
                                  copy, rows, cols});
    return static_cast<int>(tensors.size()) - 1;
  };
  const int64_t w1_size = E * H * 2 * dims_.ffn;
  for (int64_t l = 0; l < L(); ++l) {
    OptimizerGroups g;
    const int64_t base = l * RepPerLayer();
    g.router_first = add(replicated_, base, H * E, student_.router + l * E * H, H, E);
    g.router_count = 1;
    if (RepPerLayer() > H * E) {
      add(replicated_, base + H * E, RepPerLayer() - H * E, replicated_.bf16 + base + H * E, 0, 0);
      g.router_count = 2;
    }
    const int64_t exp = l * ExpPerLayer();
    g.w1 = add(experts_, exp, w1_size, experts_.bf16 + exp, 0, 0);
    g.w2 = add(experts_, exp + w1_size, ExpPerLayer() - w1_size, experts_.bf16 + exp + w1_size, 0, 0);
    optimizer_groups_.push_back(g);
  }
  absl::StatusOr<std::unique_ptr<FusedAdamW>> adamw =
      FusedAdamW::Create(config_.optimizer, tensors, step_counter_);
  if (!adamw.ok()) return adamw.status();
  adamw_ = *std::move(adamw);
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(streams_.main));
  return absl::OkStatus();
}

// The whole step on streams_.main (forks join back): batch, targets, forward, loss, backward,
// optimizer. Recorded into a graph once, or run eagerly with DROPLESS_CUDA_GRAPH=0.
absl::Status CudaEngineImpl::RecordStep() {
  links_.Reset();
  timer_.Reset();
  const int64_t T = dims_.tokens, H = dims_.hidden;
  cudaStream_t main = streams_.main;
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(stats_, 0, sizeof(double), main));

  DROPLESS_RETURN_IF_ERROR(timer_.Begin(PhaseTimer::kData, main));
  TokenSource source;
  source.seed = tokens_.seed();
  source.first_token = static_cast<int64_t>(rank_) * T;
  source.tokens = T;
  source.hidden = H;
  source.latent_rank = static_cast<int>(tokens_.latent_rank());
  source.basis = basis_;
  source.step_counter = step_counter_;
  DROPLESS_RETURN_IF_ERROR(GenerateTokens(source, activations_[0], main));
  // Teacher forward: layer 0's buffers as scratch (the student's forward overwrites them after),
  // the student's activation buffers as the ping-pong between layers, the last into target_.
  LayerStreams untimed = streams_;
  untimed.timer = nullptr;
  for (int64_t l = 0; l < L(); ++l) {
    Bf16* out = l + 1 == L() ? target_ : activations_[l + 1];
    DROPLESS_RETURN_IF_ERROR(layers_[0]->Forward(Weights(teacher_, l), activations_[l], out, nullptr, untimed));
  }
  DROPLESS_RETURN_IF_ERROR(timer_.End(PhaseTimer::kData, main));

  DROPLESS_RETURN_IF_ERROR(timer_.Begin(PhaseTimer::kForward, main));
  DROPLESS_RETURN_IF_ERROR(MarkPhase(StepPhase::kForward));
  float* aux = reinterpret_cast<float*>(stats_ + sizeof(double));
  for (int64_t l = 0; l < L(); ++l) {
    DROPLESS_RETURN_IF_ERROR(layers_[l]->Forward(Weights(student_, l), activations_[l], activations_[l + 1],
                                        aux + l, streams_));
  }
  for (int64_t l = 0; l < L(); ++l) {
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        stats_ + CountsOffset() + l * dims_.experts * sizeof(int32_t), layers_[l]->expert_counts(),
        dims_.experts * sizeof(int32_t), cudaMemcpyDeviceToDevice, main));
  }
  const double job_tokens = static_cast<double>(T) * world_size_;
  DROPLESS_RETURN_IF_ERROR(SquaredErrorAndGrad(T * H, activations_[L()], target_,
                                      static_cast<float>(2.0 / (job_tokens * H)),
                                      reinterpret_cast<double*>(stats_), grad_a_, main));
  DROPLESS_RETURN_IF_ERROR(timer_.End(PhaseTimer::kForward, main));

  // Backward, with each weight's AdamW update (and MXFP8 re-quantization) on the optimizer
  // stream as soon as its gradient is complete.
  DROPLESS_RETURN_IF_ERROR(timer_.Begin(PhaseTimer::kBackward, main));
  DROPLESS_RETURN_IF_ERROR(MarkPhase(StepPhase::kBackward));
  DROPLESS_RETURN_IF_ERROR(adamw_->PrepareStep(main));
  const float aux_coef = static_cast<float>(config_.model.aux_loss_coeff / static_cast<double>(L()));
  Bf16* grad_in = grad_a_;
  Bf16* grad_out = grad_b_;
  for (int64_t l = L() - 1; l >= 0; --l) {
    const OptimizerGroups& g = optimizer_groups_[l];
    const LayerWeights w = Weights(student_, l);
    LayerOptimizerHooks hooks;
    if (overlap_optimizer_) {
      hooks.router_and_shared = [&](cudaStream_t s) {
        return adamw_->Update(g.router_first, g.router_count, s);
      };
      hooks.experts_w2 = [&](cudaStream_t s) -> absl::Status {
        DROPLESS_RETURN_IF_ERROR(adamw_->Update(g.w2, 1, s));
        if (!dims_.mxfp8) return absl::OkStatus();
        return kernels_->QuantizeWeight(w.w2, dims_.ffn, dims_.hidden, student_.mx_w2[l], s);
      };
      hooks.experts_w1 = [&](cudaStream_t s) -> absl::Status {
        DROPLESS_RETURN_IF_ERROR(adamw_->Update(g.w1, 1, s));
        if (!dims_.mxfp8) return absl::OkStatus();
        return kernels_->QuantizeWeight(w.w1, dims_.hidden, 2 * dims_.ffn, student_.mx_w1[l], s);
      };
    }
    DROPLESS_RETURN_IF_ERROR(layers_[l]->Backward(w, activations_[l], grad_in, aux_coef, Grads(l), grad_out,
                                         streams_, hooks));
    std::swap(grad_in, grad_out);
  }
  DROPLESS_RETURN_IF_ERROR(timer_.End(PhaseTimer::kBackward, main));

  // What of the optimizer did not hide under the backward.
  DROPLESS_RETURN_IF_ERROR(timer_.Begin(PhaseTimer::kOptimizer, main));
  DROPLESS_RETURN_IF_ERROR(MarkPhase(StepPhase::kOptimizer));
  if (overlap_optimizer_) {
    DROPLESS_RETURN_IF_ERROR(links_.Link(streams_.optimizer, main));
  } else {
    DROPLESS_RETURN_IF_ERROR(adamw_->Update(0, adamw_->num_tensors(), main));
    DROPLESS_RETURN_IF_ERROR(QuantizeExperts(&student_, main));
  }
  return timer_.End(PhaseTimer::kOptimizer, main);
}

absl::StatusOr<StepStats> CudaEngineImpl::Step() {
  const Clock::time_point start = Clock::now();
  cudaStream_t main = streams_.main;
  if (!use_graph_) {
    DROPLESS_RETURN_IF_ERROR(RecordStep());
  } else {
    if (graph_exec_ == nullptr) {
      cudaGraph_t graph = nullptr;
      DROPLESS_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(main, cudaStreamCaptureModeThreadLocal));
      const absl::Status recorded = RecordStep();
      const cudaError_t ended = cudaStreamEndCapture(main, &graph);
      if (!recorded.ok()) {
        if (graph != nullptr) cudaGraphDestroy(graph);
        return absl::Status(recorded.code(),
                            absl::StrCat("capturing the step graph: ", recorded.message()));
      }
      DROPLESS_CUDA_RETURN_IF_ERROR(ended);
      const cudaError_t instantiated = cudaGraphInstantiate(&graph_exec_, graph, 0);
      cudaGraphDestroy(graph);
      DROPLESS_CUDA_RETURN_IF_ERROR(instantiated);
    }
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph_exec_, main));
  }
  // The one host wait of a step: its loss and statistics.
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_stats_, stats_, StatsBytes(),
                                                cudaMemcpyDeviceToHost, main));
  DROPLESS_RETURN_IF_ERROR(WaitForStep());
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  ++steps_done_;

  const int64_t E = dims_.experts;
  double squared_error = 0;
  std::memcpy(&squared_error, host_stats_, sizeof(double));
  std::vector<int32_t> counts(static_cast<size_t>(L() * E));
  std::memcpy(counts.data(), host_stats_ + CountsOffset(), CountsBytes());
  const double job_tokens = static_cast<double>(dims_.tokens) * world_size_;
  StepStats out;
  out.step = steps_done_;
  out.loss = squared_error / (job_tokens * static_cast<double>(dims_.hidden));
  for (int64_t l = 0; l < L(); ++l) {
    float aux = 0;
    std::memcpy(&aux, host_stats_ + sizeof(double) + l * sizeof(float), sizeof(float));
    out.aux_loss += aux / static_cast<double>(L());
    int64_t max_load = 0, total = 0;
    for (int64_t e = 0; e < E; ++e) {
      max_load = std::max<int64_t>(max_load, counts[l * E + e]);
      total += counts[l * E + e];
    }
    const double mean = static_cast<double>(total) / static_cast<double>(E);
    out.load_imbalance += (mean > 0 ? max_load / mean : 1.0) / static_cast<double>(L());
  }
  absl::StatusOr<std::vector<double>> phases = timer_.Collect();
  if (!phases.ok()) return phases.status();
  const std::vector<double>& p = *phases;
  details_.data_seconds = p[PhaseTimer::kData];
  details_.forward_seconds = p[PhaseTimer::kForward];
  details_.backward_seconds = p[PhaseTimer::kBackward];
  details_.optimizer_seconds = p[PhaseTimer::kOptimizer];
  details_.engine_bytes = arena_.device_bytes();
  // The training step proper; the synthetic batch (tokens and the teacher's forward) stands in
  // for a data loader and is reported apart (data_seconds).
  out.step_seconds = p[PhaseTimer::kForward] + p[PhaseTimer::kBackward] + p[PhaseTimer::kOptimizer];
  if (!(out.step_seconds > 0)) out.step_seconds = wall;
  out.dispatch_seconds = p[PhaseTimer::kDispatch];
  out.combine_seconds = p[PhaseTimer::kCombine];
  out.gemm_forward_seconds = p[PhaseTimer::kGemmForward];
  out.gemm_dgrad_seconds = p[PhaseTimer::kGemmDgrad];
  out.gemm_wgrad_seconds = p[PhaseTimer::kGemmWgrad];
  out.gemm_seconds = out.gemm_forward_seconds + out.gemm_dgrad_seconds + out.gemm_wgrad_seconds;
  const double t = static_cast<double>(dims_.tokens), h = static_cast<double>(dims_.hidden);
  const double f = static_cast<double>(dims_.ffn);
  out.flops = static_cast<double>(L()) *
              (18.0 * t * dims_.topk * h * f + 6.0 * t * h * dims_.experts + 18.0 * t * h * f * dims_.shared);
  out.tokens = dims_.tokens;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    out.device_memory_bytes = static_cast<int64_t>(total_bytes - free_bytes);
  } else {
    out.device_memory_bytes = arena_.device_bytes();
  }
  return out;
}

// The one host wait of a step: polls the stream (every 50 us) instead of blocking in the driver,
// relaying the graph's phase markers to the hang watchdog as they change.
absl::Status CudaEngineImpl::WaitForStep() {
  int32_t reported = -1;
  while (true) {
    const cudaError_t state = cudaStreamQuery(streams_.main);
    const int32_t phase = *reinterpret_cast<volatile int32_t*>(phase_marker_);
    if (phase != reported) {
      EnterStepPhase(static_cast<StepPhase>(phase));
      reported = phase;
    }
    if (state == cudaSuccess) return absl::OkStatus();
    if (state != cudaErrorNotReady) return kernels::cuda::CudaStatus(state, "the step");
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

absl::StatusOr<CudaEngine::GemmSeconds> CudaEngineImpl::TimeExpertGemms(int iterations) {
  if (steps_done_ == 0) {
    return absl::FailedPreconditionError("TimeExpertGemms: run a step first (it times that step's routing)");
  }
  GemmSeconds total;
  for (int64_t l = 0; l < L(); ++l) {
    double s[3] = {0, 0, 0};
    DROPLESS_RETURN_IF_ERROR(layers_[l]->TimeExpertGemms(Weights(student_, l), Grads(l), iterations,
                                                streams_.main, s));
    total.forward += s[0];
    total.dgrad += s[1];
    total.wgrad += s[2];
  }
  return total;
}

absl::Status CudaEngineImpl::SaveCheckpoint(const std::string& dir) {
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(streams_.main));
  return WriteCudaCheckpoint(dir, config_, rank_, layout_, steps_done_,
                             DeviceOptimizerBuffers{replicated_.value, replicated_.m, replicated_.v,
                                                    replicated_.size},
                             DeviceOptimizerBuffers{experts_.value, experts_.m, experts_.v,
                                                    experts_.size});
}

absl::Status CudaEngineImpl::Restore(const std::string& dir) {
  absl::StatusOr<int64_t> step = ReadCudaCheckpoint(
      dir, config_, rank_, layout_,
      DeviceOptimizerBuffers{replicated_.value, replicated_.m, replicated_.v, replicated_.size},
      DeviceOptimizerBuffers{experts_.value, experts_.m, experts_.v, experts_.size});
  if (absl::IsNotFound(step.status())) return absl::OkStatus();
  if (!step.ok()) return step.status();
  steps_done_ = *step;
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckCudaEngineConfig(const EngineConfig& config, int world_size) {
  if (world_size != config.world_size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cuda engine: world size %d does not match parallel.ep %d x parallel.dp %d", world_size,
        config.parallel.ep, config.parallel.dp));
  }
  return CheckEngineSupport(Backend::kCuda, config);
}

absl::StatusOr<std::unique_ptr<CudaEngine>> CreateCudaEngine(const EngineConfig& config, int rank,
                                                             int world_size, RankGroups* groups) {
  (void)groups;  // one rank: no peers to reach yet
  DROPLESS_RETURN_IF_ERROR(CheckCudaEngineConfig(config, world_size));
  auto engine = std::make_unique<CudaEngineImpl>(config, rank, world_size);
  DROPLESS_RETURN_IF_ERROR(engine->Initialize());
  return std::unique_ptr<CudaEngine>(std::move(engine));
}

}  // namespace dropless::cuda_engine
