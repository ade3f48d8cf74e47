// RankModel (rank_model.h).
#include "worker/engine/cuda/rank_model.h"

#include <utility>

#include "common/log.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "worker/engine/cpu/adamw.h"

namespace dropless::cuda_engine {
namespace {

// The teacher's layers: the student's shapes, routing and exchange in bf16, forward only.
LayerDims TeacherDims(LayerDims d) {
  d.precision = Precision::kBf16;
  d.recompute = false;
  d.fused_expert_adamw = false;
  d.bf16_expert_grad = false;
  d.mx_core = false;
  d.fp8_block_fused_quantizers = false;
  return d;
}

}  // namespace

absl::Status TrainableBuffer::Allocate(DeviceArena* arena, int64_t n, MomentDtype moment_dtype,
                                       uint32_t moment_stream, GradStorage grad_storage) {
  size = n;
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(n, "master weights", &value));
  if (grad_storage == GradStorage::kFp32) {
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(n, "weight gradients", &grad));
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemset(grad, 0, n * sizeof(float)));
  } else if (grad_storage == GradStorage::kBf16) {
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(n, "weight gradients (bf16)", &grad_bf16));
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemset(grad_bf16, 0, n * sizeof(Bf16)));
  }
  moments.bf16 = moment_dtype == MomentDtype::kBf16;
  moments.stream = moment_stream;
  moments.first = 0;
  const size_t moment_bytes = static_cast<size_t>(n) * moments.element_bytes();
  for (auto [what, out] : {std::pair{"AdamW first moments", &moments.m},
                           std::pair{"AdamW second moments", &moments.v}}) {
    absl::StatusOr<char*> p = arena->Allocate<char>(static_cast<int64_t>(moment_bytes), what);
    if (!p.ok()) return p.status();
    *out = *p;
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemset(*p, 0, moment_bytes));
  }
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(n, "bf16 weights", &bf16));
  return absl::OkStatus();
}

AdamWTensor TrainableBuffer::Tensor(int64_t offset, int64_t n) const {
  AdamWTensor t;
  t.param = value + offset;
  if (grad != nullptr) t.grad = grad + offset;
  if (grad_bf16 != nullptr) t.grad_bf16 = grad_bf16 + offset;
  t.moments = moments.At(offset);
  t.n = n;
  return t;
}

RankModel::RankModel(const EngineConfig& config, int rank, const LayerDims& dims)
    : config_(config),
      rank_(rank),
      dims_(dims),
      layout_(config.model, config.parallel.ep, rank % config.parallel.ep, config.tokens_per_rank),
      expert_runs_(layout_.ExpertRuns()) {}

RankModel::~RankModel() {
  // Teardown: a destructor has no caller to report a failed release to.
  for (cudaStream_t s : {streams_.main, streams_.comm, streams_.side, streams_.wgrad, streams_.optimizer}) {
    if (s != nullptr) (void)cudaStreamDestroy(s);
  }
}

LayerWeights RankModel::Weights(const ModelWeights& m, int64_t layer) const {
  const int64_t H = dims_.hidden, F = dims_.ffn, E = dims_.experts, S = dims_.shared;
  const int64_t El = dims_.local_experts();
  LayerWeights w;
  w.router = m.router + layer * E * H;
  w.router_bias = m.router_bias;
  w.w1 = m.experts + layer * ExpPerLayer();
  w.w2 = w.w1 + El * H * 2 * F;
  w.shared_w1 = m.replicated + layer * RepPerLayer() + H * E;
  w.shared_w2 = w.shared_w1 + S * H * 2 * F;
  if (!m.q_w1.empty()) {
    w.q_w1 = m.q_w1[layer];
    w.q_w2 = m.q_w2[layer];
  }
  return w;
}

LayerGrads RankModel::Grads(int64_t layer) const {
  const int64_t H = dims_.hidden, F = dims_.ffn, E = dims_.experts, S = dims_.shared;
  const int64_t El = dims_.local_experts();
  LayerGrads g;
  g.router = replicated_.grad + layer * RepPerLayer();
  g.shared_w1 = g.router + H * E;
  g.shared_w2 = g.shared_w1 + S * H * 2 * F;
  if (!dims_.fused_expert_adamw) {
    const int64_t w1 = layer * ExpPerLayer(), w2 = w1 + El * H * 2 * F;
    if (dims_.bf16_expert_grad) {
      g.w1_bf16 = experts_.grad_bf16 + w1;
      g.w2_bf16 = experts_.grad_bf16 + w2;
    } else {
      g.w1 = experts_.grad + w1;
      g.w2 = experts_.grad + w2;
    }
  } else {
    // No routed-expert gradient is stored: the weight-gradient GEMM applies AdamW to its tiles,
    // bf16 moments drawing their rounding from the single-rank index as the AdamW pass does.
    g.adamw_step = adamw_->step_scalars();
    auto state = [&](const cpu::MoeParameterLayout::ExpertRun& run) {
      kernels::AdamWMoments mv = experts_.moments.At(run.offset);
      mv.first = run.global_index;
      return kernels::AdamWTensors{experts_.value + run.offset, mv,
                                   reinterpret_cast<__nv_bfloat16*>(experts_.bf16 + run.offset)};
    };
    g.w1_adamw = state(expert_runs_[2 * layer]);
    g.w2_adamw = state(expert_runs_[2 * layer + 1]);
  }
  return g;
}

absl::Status RankModel::InitializeWeights(uint64_t seed, float* replicated, float* experts) {
  std::vector<DeviceNormalFill> fills;
  for (const cpu::MoeParameterLayout::NormalFill& f : layout_.InitialFills(seed)) {
    fills.push_back(DeviceNormalFill{f.buffer, f.offset, f.stream, f.count, f.scale});
  }
  return FillNormal(fills, replicated, experts, streams_.main);
}

// bf16 copies of fp32 weights: the router transposed to [E][H], everything else as laid out.
absl::Status RankModel::RefreshWorkingCopies(const float* replicated, const float* experts,
                                             ModelWeights* weights, cudaStream_t stream) {
  const int64_t H = dims_.hidden, E = dims_.experts;
  DROPLESS_RETURN_IF_ERROR(CastToBf16(layout_.replicated_size(), replicated, weights->replicated, stream));
  DROPLESS_RETURN_IF_ERROR(CastToBf16(layout_.experts_size(), experts, weights->experts, stream));
  for (int64_t l = 0; l < layers(); ++l) {
    DROPLESS_RETURN_IF_ERROR(Transpose(1, H, E, weights->replicated + l * RepPerLayer(),
                                       weights->router + l * E * H, stream));
  }
  return absl::OkStatus();
}

absl::Status RankModel::QuantizeExperts(ModelWeights* weights, cudaStream_t stream) {
  if (weights->q_w1.empty()) return absl::OkStatus();  // bf16 experts
  for (int64_t l = 0; l < layers(); ++l) {
    const LayerWeights w = Weights(*weights, l);
    DROPLESS_RETURN_IF_ERROR(kernels_->QuantizeWeight(w.w1, dims_.hidden, 2 * dims_.ffn,
                                                      weights->q_w1[l], stream));
    DROPLESS_RETURN_IF_ERROR(kernels_->QuantizeWeight(w.w2, dims_.ffn, dims_.hidden,
                                                      weights->q_w2[l], stream));
  }
  return absl::OkStatus();
}

absl::Status RankModel::UpdateExpertWeight(int64_t layer, bool w1, cudaStream_t stream) {
  if (dims_.fused_expert_adamw) return absl::OkStatus();  // done by the weight-gradient GEMM
  const OptimizerGroups& og = optimizer_groups_[layer];
  const int tensor = w1 ? og.w1 : og.w2;
  const int64_t k = w1 ? dims_.hidden : dims_.ffn, n = w1 ? 2 * dims_.ffn : dims_.hidden;
  const QuantizedWeight& q = w1 ? student_.q_w1[layer] : student_.q_w2[layer];
  if (dims_.fp8_block()) {
    return adamw_->UpdateFp8Block(
        tensor, kernels::Fp8BlockWeightShape{dims_.local_experts(), k, n}, q.fp8_block, stream);
  }
  DROPLESS_RETURN_IF_ERROR(adamw_->Update(tensor, 1, stream));
  if (!dims_.quantized()) return absl::OkStatus();
  const LayerWeights w = Weights(student_, layer);
  return kernels_->QuantizeWeight(w1 ? w.w1 : w.w2, k, n, q, stream);
}

absl::Status RankModel::Initialize(DeviceArena* arena, StreamLinks* links, PhaseTimer* timer,
                                   const cpu::TaskSeeds& seeds, ExpertDispatcher* dispatcher,
                                   int64_t restore_step) {
  arena_ = arena;
  for (cudaStream_t* s : {&streams_.main, &streams_.side, &streams_.wgrad, &streams_.optimizer}) {
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
  }
  if (dims_.overlap_chunks > 1) {
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&streams_.comm, cudaStreamNonBlocking));
  }
  streams_.links = links;
  streams_.timer = timer;

  absl::StatusOr<std::unique_ptr<LayerKernels>> k = LayerKernels::Create(dims_, arena, dispatcher);
  if (!k.ok()) return k.status();
  kernels_ = *std::move(k);
  if (rank_ == 0) LogInfo("cuda engine: expert GEMM kernels: " + kernels_->ExpertGemmKernels());
  if (config_.activation_offload) {
    absl::StatusOr<std::unique_ptr<ActivationRing>> ring = ActivationRing::Create(layers(), arena);
    if (!ring.ok()) return ring.status();
    ring_ = ring->get();
    saved_ = *std::move(ring);
  } else {
    saved_ = NewDeviceActivations(arena);
  }
  for (int64_t l = 0; l < layers(); ++l) {
    absl::StatusOr<std::unique_ptr<MoeLayerGpu>> layer =
        MoeLayerGpu::Create(kernels_.get(), arena, saved_.get(), l);
    if (!layer.ok()) return layer.status();
    layers_.push_back(*std::move(layer));
  }
  if (dims_.quantized()) {
    absl::StatusOr<std::unique_ptr<LayerKernels>> tk =
        LayerKernels::Create(TeacherDims(dims_), arena, dispatcher, /*forward_only=*/true);
    if (!tk.ok()) return tk.status();
    teacher_kernels_ = *std::move(tk);
    // With an exchange, over the student's layer 0 (no receive-sized buffer of its own: those
    // take the EP group's rows); without one, buffers of its own.
    absl::StatusOr<std::unique_ptr<MoeLayerGpu>> tl;
    if (dispatcher != nullptr) {
      tl = MoeLayerGpu::CreateOver(teacher_kernels_.get(), *layers_[0]);
    } else {
      teacher_saved_ = NewDeviceActivations(arena);
      tl = MoeLayerGpu::Create(teacher_kernels_.get(), arena, teacher_saved_.get(), 0);
    }
    if (!tl.ok()) return tl.status();
    teacher_layer_ = *std::move(tl);
  }

  const int64_t T = dims_.tokens, H = dims_.hidden, E = dims_.experts;
  const MomentDtype moment_dtype = config_.optimizer.moment_dtype;
  DROPLESS_RETURN_IF_ERROR(replicated_.Allocate(arena, layout_.replicated_size(), moment_dtype,
                                                cpu::kReplicatedMoments));
  // The fused update keeps the routed experts' gradients in registers: no buffer for them.
  const GradStorage expert_grad = dims_.fused_expert_adamw ? GradStorage::kNone
                                  : dims_.bf16_expert_grad ? GradStorage::kBf16
                                                           : GradStorage::kFp32;
  DROPLESS_RETURN_IF_ERROR(experts_.Allocate(arena, layout_.experts_size(), moment_dtype,
                                             cpu::kExpertMoments, expert_grad));
  for (ModelWeights* w : {&student_, &teacher_}) {
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(layers() * E * H, "bf16 router", &w->router));
  }
  if (dims_.quantized()) {
    for (int64_t l = 0; l < layers(); ++l) {
      absl::StatusOr<QuantizedWeight> w1 =
          kernels_->AllocateQuantizedWeight(H, 2 * dims_.ffn, arena);
      if (!w1.ok()) return w1.status();
      absl::StatusOr<QuantizedWeight> w2 = kernels_->AllocateQuantizedWeight(dims_.ffn, H, arena);
      if (!w2.ok()) return w2.status();
      student_.q_w1.push_back(*w1);
      student_.q_w2.push_back(*w2);
    }
  }
  student_.replicated = replicated_.bf16;
  student_.experts = experts_.bf16;
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(layout_.replicated_size(), "teacher weights", &teacher_.replicated));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(layout_.experts_size(), "teacher weights", &teacher_.experts));
  const std::vector<double> bias = cpu::TeacherRouterBias(config_.data, E);
  if (config_.data.distribution == RoutingDistribution::kZipf) {
    const std::vector<float> bias_f(bias.begin(), bias.end());
    DROPLESS_RETURN_IF_ERROR(arena->Allocate(E, "teacher router bias", &teacher_.router_bias));
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemcpy(teacher_.router_bias, bias_f.data(),
                                             E * sizeof(float), cudaMemcpyHostToDevice));
  }

  activations_.resize(layers() + 1);
  for (Bf16*& a : activations_) DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * H, "layer activations", &a));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * H, "targets", &target_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * H, "output gradient", &grad_a_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(T * H, "input gradient", &grad_b_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(1, "step counter", &step_counter_));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(static_cast<int64_t>(StatsBytes()), "step statistics", &stats_));

  // The teacher: fp32 draws (in the student's not yet initialized buffers), kept in bf16 (and
  // never quantized: teacher_layer()).
  DROPLESS_RETURN_IF_ERROR(InitializeWeights(seeds.teacher, replicated_.value, experts_.value));
  DROPLESS_RETURN_IF_ERROR(RefreshWorkingCopies(replicated_.value, experts_.value, &teacher_, streams_.main));
  DROPLESS_RETURN_IF_ERROR(InitializeWeights(seeds.student, replicated_.value, experts_.value));
  if (restore_step > 0) restore_status_ = Restore(config_.checkpoint.dir, restore_step);
  DROPLESS_RETURN_IF_ERROR(LoadWorkingState());
  DROPLESS_RETURN_IF_ERROR(CreateOptimizer());
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(streams_.main));
  return absl::OkStatus();
}

absl::Status RankModel::LoadWorkingState() {
  // Copies in the main stream's order (the legacy stream's cudaMemcpy is not ordered with it):
  // after the student's draws, before the working copies read what was restored.
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(step_counter_, &steps_restored_, sizeof(int64_t),
                                                cudaMemcpyHostToDevice, streams_.main));
  DROPLESS_RETURN_IF_ERROR(
      RefreshWorkingCopies(replicated_.value, experts_.value, &student_, streams_.main));
  return QuantizeExperts(&student_, streams_.main);
}

void RankModel::RestoreAgain(int64_t step) {
  restore_status_ = Restore(config_.checkpoint.dir, step);
  restore_status_.Update(LoadWorkingState());
  restore_status_.Update(
      kernels::cuda::CudaStatus(cudaStreamSynchronize(streams_.main), "cudaStreamSynchronize"));
}

// AdamW over every tensor, in per-layer groups so that each weight is updated as soon as its
// gradient is complete (LayerOptimizerHooks): per layer the router (its bf16 copy transposed to
// [E][H]) and the shared experts, then the routed experts' w1 and w2.
absl::Status RankModel::CreateOptimizer() {
  const int64_t H = dims_.hidden, E = dims_.experts;
  std::vector<AdamWTensor> tensors;
  auto add = [&](TrainableBuffer& b, int64_t offset, int64_t n, Bf16* copy, int64_t rows,
                 int64_t cols) {
    AdamWTensor t = b.Tensor(offset, n);
    t.bf16_copy = copy;
    t.copy_rows = rows;
    t.copy_cols = cols;
    tensors.push_back(t);
    return static_cast<int>(tensors.size()) - 1;
  };
  // The routed experts' runs (w1, w2 per layer) carry their single-rank index, from which bf16
  // moments draw their rounding as the CPU engine does.
  auto add_run = [&](const cpu::MoeParameterLayout::ExpertRun& run) {
    const int t = add(experts_, run.offset, run.count, experts_.bf16 + run.offset, 0, 0);
    tensors[t].moments.first = run.global_index;
    return t;
  };
  for (int64_t l = 0; l < layers(); ++l) {
    OptimizerGroups g;
    const int64_t base = l * RepPerLayer();
    g.router_first = add(replicated_, base, H * E, student_.router + l * E * H, H, E);
    g.router_count = 1;
    if (RepPerLayer() > H * E) {
      add(replicated_, base + H * E, RepPerLayer() - H * E, replicated_.bf16 + base + H * E, 0, 0);
      g.router_count = 2;
    }
    if (!dims_.fused_expert_adamw) {  // else updated by their weight-gradient GEMMs
      g.w1 = add_run(expert_runs_[2 * l]);
      g.w2 = add_run(expert_runs_[2 * l + 1]);
    }
    optimizer_groups_.push_back(g);
  }
  absl::StatusOr<std::unique_ptr<FusedAdamW>> adamw =
      FusedAdamW::Create(config_.optimizer, tensors, step_counter_);
  if (!adamw.ok()) return adamw.status();
  adamw_ = *std::move(adamw);
  return absl::OkStatus();
}

absl::Status RankModel::SaveCheckpoint(const std::string& dir, int64_t step) {
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(streams_.main));
  return WriteCudaCheckpoint(dir, config_, rank_, layout_, step, replicated_.Optimizer(),
                             experts_.Optimizer(), streams_.main);
}

absl::Status RankModel::Restore(const std::string& dir, int64_t step) {
  absl::StatusOr<int64_t> restored =
      ReadCudaCheckpoint(dir, config_, rank_, layout_, step, replicated_.Optimizer(),
                         experts_.Optimizer(), streams_.main);
  if (!restored.ok()) return restored.status();
  steps_restored_ = *restored;
  return absl::OkStatus();
}

}  // namespace dropless::cuda_engine
