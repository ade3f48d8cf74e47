// CudaEngine (cuda_engine.h): the EP ranks of this process (RankModel), the step graph over all of
// them, and the step's statistics.
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

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/status_context.h"
#include "common/status_macros.h"
#include "common/step_phase.h"
#include "kernels/cuda/cuda_check.h"
#include "worker/engine/checkpoint/checkpoint_agreement.h"
#include "worker/engine/cpu/moe_model.h"
#include "worker/engine/cpu/synthetic_task.h"
#include "worker/engine/cuda/device_memory.h"
#include "worker/engine/cuda/engine_kernels.h"
#include "worker/engine/cuda/engine_setup.h"
#include "worker/engine/cuda/ep/expert_dispatcher.h"
#include "worker/engine/cuda/moe_layer_gpu.h"
#include "worker/engine/cuda/moe_layer_group.h"
#include "worker/engine/cuda/rank_model.h"

namespace dropless::cuda_engine {
namespace {

using kernels::cuda::CudaStatus;
using Clock = std::chrono::steady_clock;


class CudaEngineImpl final : public CudaEngine {
 public:
  // world_size: ranks in the job; ep_local: EP ranks this process drives (the `local`
  // dispatcher when more than one), starting at job rank `rank`; groups: the rank's groups (their
  // rendezvous store sets up NCCL), null for `local`.
  CudaEngineImpl(const EngineConfig& config, int rank, int world_size, int ep_local,
                 RankGroups* groups)
      : config_(config),
        rank_(rank),
        world_size_(world_size),
        ep_local_(ep_local),
        groups_(groups),
        seeds_(cpu::DeriveTaskSeeds(config.data.seed)),
        tokens_(seeds_.tokens, config.model.hidden) {}

  ~CudaEngineImpl() override {
    // Teardown: a destructor has no caller to report a failed release to.
    if (graph_exec_ != nullptr) (void)cudaGraphExecDestroy(graph_exec_);
  }

  absl::Status Initialize();
  absl::StatusOr<StepStats> Step() override;
  double PeakFlops() const override { return kHopperDenseBf16PeakFlops; }
  absl::Status SaveCheckpoint(const std::string& dir) override;
  int64_t StepsDone() const override { return steps_done_; }
  absl::StatusOr<GemmSeconds> TimeExpertGemms(int iterations) override;
  CudaStepDetails LastStepDetails() const override { return details_; }
  absl::StatusOr<std::vector<float>> LastTargets() override;

 private:
  int64_t L() const { return ranks_[0]->layers(); }
  RankModel& lead() { return *ranks_[0]; }
  cudaStream_t main() { return ranks_[0]->streams().main; }
  std::vector<RankLayer> Group(int64_t layer, bool teacher);
  // In-place sums over the EP group of each local rank's buffer (no-op without a dispatcher).
  template <typename T>
  absl::Status SumOverGroup(const std::vector<T*>& data, size_t count) {
    if (dispatcher_ == nullptr) return absl::OkStatus();
    std::vector<cudaStream_t> streams;
    for (const std::unique_ptr<RankModel>& r : ranks_) streams.push_back(r->streams().main);
    return dispatcher_->AllReduceSum(absl::MakeConstSpan(data), count, streams);
  }
  // `call(ring, main stream)` for every rank that offloads its activations.
  template <typename Call>
  absl::Status ForEachRing(Call call) {
    for (const std::unique_ptr<RankModel>& r : ranks_) {
      if (r->activation_ring() != nullptr) {
        DROPLESS_RETURN_IF_ERROR(call(r->activation_ring(), r->streams().main));
      }
    }
    return absl::OkStatus();
  }
  // The checkpoint step every rank of the job resumes from (0: none; checkpoint_agreement.h).
  absl::StatusOr<int64_t> AgreedRestoreStep();
  // After the local ranks read `step`: the step every rank restored, once all agree on it (an
  // older one they hold when some rank's files of `step` are damaged), or the restore's error.
  absl::StatusOr<int64_t> AgreeOnRestore(int64_t step);
  // The group of every rank of the job, for the restore's agreements; null when this process's
  // ranks are the whole job.
  Communicator* World() const {
    return world_size_ > ep_local_ && groups_ != nullptr ? groups_->world.get() : nullptr;
  }
  absl::Status RecordStep();
  absl::Status RecordBackward();
  absl::Status MarkPhase(StepPhase phase) {
    return WriteMarker(phase_marker_, static_cast<int32_t>(phase), main());
  }
  absl::Status WaitForStep();

  const EngineConfig config_;
  const int rank_;
  const int world_size_;
  const int ep_local_;
  RankGroups* const groups_;
  std::vector<engine::HeldCheckpoints> held_;  // every rank's checkpoints (AgreedRestoreStep)
  const cpu::TaskSeeds seeds_;
  const cpu::TokenGenerator tokens_;
  LayerDims dims_;

  DeviceArena arena_;
  StreamLinks links_;
  PhaseTimer timer_;
  std::unique_ptr<ExpertDispatcher> dispatcher_;  // null at EP = 1 with dispatcher auto
  std::vector<std::unique_ptr<RankModel>> ranks_;
  double* basis_ = nullptr;
  // The step graph writes the phase it is entering here (mapped pinned memory); the host relays
  // it to the hang watchdog (common/step_phase.h) while it waits for the step.
  int32_t* phase_marker_ = nullptr;
  // Rank 0's statistics (RankModel::stats), read back after every step in one copy.
  uint8_t* host_stats_ = nullptr;

  bool use_graph_ = true;
  // Each weight's update beside the backward (LayerOptimizerHooks) or all after it:
  // DROPLESS_OPTIMIZER_OVERLAP=0 (for A/B runs of dropless-bench step --variants).
  bool overlap_optimizer_ = true;
  cudaGraphExec_t graph_exec_ = nullptr;
  int64_t steps_done_ = 0;
  CudaStepDetails details_;
};

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

  absl::StatusOr<LayerDims> dims = LayerDimsOf(config_);
  if (!dims.ok()) return dims.status();
  dims_ = *dims;
  if (dims_.fused_expert_adamw && rank_ == 0) {
    LogInfo(absl::StrFormat(
        "cuda engine: the routed experts' AdamW runs in their weight-gradient GEMM (%d rows "
        "expected per local expert; DROPLESS_FUSED_EXPERT_ADAMW=0 runs the two passes)",
        static_cast<int>(dims_.expected_rows_per_expert())));
  }
  if (dims_.mx_core && rank_ == 0) {
    LogInfo("cuda engine: mxfp8 expert GEMMs on the bf16 tensor cores over exact bf16 images of "
            "the MXFP8 operands (DROPLESS_MX_CORE=0: per-32 promotion)");
  }
  absl::StatusOr<std::unique_ptr<ExpertDispatcher>> dispatcher =
      CreateEngineDispatcher(config_, dims_, rank_, ep_local_, groups_, &links_, &arena_);
  if (!dispatcher.ok()) return dispatcher.status();
  dispatcher_ = *std::move(dispatcher);

  DROPLESS_RETURN_IF_ERROR(arena_.Allocate(static_cast<int64_t>(tokens_.basis().size()), "token basis", &basis_));
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemcpy(basis_, tokens_.basis().data(),
                                           tokens_.basis().size() * sizeof(double),
                                           cudaMemcpyHostToDevice));
  absl::StatusOr<void*> marker = arena_.AllocatePinnedHost(sizeof(int32_t), "phase marker");
  if (!marker.ok()) return marker.status();
  phase_marker_ = static_cast<int32_t*>(*marker);
  *phase_marker_ = static_cast<int32_t>(StepPhase::kForward);

  absl::StatusOr<int64_t> restore_step = AgreedRestoreStep();
  if (!restore_step.ok()) return restore_step.status();
  for (int r = 0; r < ep_local_; ++r) {
    auto rank = std::make_unique<RankModel>(config_, rank_ + r, dims_);
    DROPLESS_RETURN_IF_ERROR(rank->Initialize(&arena_, &links_, r == 0 ? &timer_ : nullptr, seeds_,
                                              dispatcher_.get(), *restore_step));
    ranks_.push_back(std::move(rank));
  }
  absl::StatusOr<int64_t> restored = AgreeOnRestore(*restore_step);
  if (!restored.ok()) return restored.status();
  steps_done_ = *restored;
  absl::StatusOr<void*> host_stats = arena_.AllocatePinnedHost(lead().StatsBytes(), "step statistics");
  if (!host_stats.ok()) return host_stats.status();
  host_stats_ = static_cast<uint8_t*>(*host_stats);
  // Set-up's cudaMemcpy calls from pageable memory (the token basis, the teacher's router bias,
  // the shared experts' offsets, the optimizer's tensor lists) may return before their DMA has
  // landed, on the legacy stream that the engine's non-blocking streams do not wait for: the first
  // step starts after all of it.
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CudaEngineImpl::AgreeOnRestore(int64_t step) {
  // Every rank learns whether all restored (each read its own files), so that all fail alike, or
  // all go back to an older step when some rank's files are damaged.
  auto statuses = [&]() {
    std::vector<absl::Status> local;
    for (const std::unique_ptr<RankModel>& r : ranks_) local.push_back(r->restore_status());
    return local;
  };
  return engine::RestoreAgreedStep(World(), world_size_, rank_, config_.checkpoint.dir, held_, step,
                                   statuses(), [&](int64_t older) {
                                     for (const std::unique_ptr<RankModel>& r : ranks_) {
                                       r->RestoreAgain(older);
                                     }
                                     return statuses();
                                   });
}

absl::StatusOr<int64_t> CudaEngineImpl::AgreedRestoreStep() {
  const std::string& dir = config_.checkpoint.dir;
  if (dir.empty()) return 0;
  std::vector<engine::MoeCheckpointIdentity> ids;
  for (int r = 0; r < ep_local_; ++r)
    ids.push_back(engine::MoeCheckpointIdentityOf(config_, rank_ + r));
  absl::Status unreadable;
  std::vector<engine::HeldCheckpoints> held = engine::ListHeldCheckpoints(dir, ids, &unreadable);
  absl::StatusOr<std::vector<engine::HeldCheckpoints>> all =
      engine::ExchangeHeldCheckpoints(World(), world_size_, rank_, held);
  if (!all.ok()) return all.status();
  held_ = *std::move(all);
  return engine::AgreeOnCheckpointStep(dir, held_, unreadable);
}

std::vector<RankLayer> CudaEngineImpl::Group(int64_t layer, bool teacher) {
  std::vector<RankLayer> group;
  for (const std::unique_ptr<RankModel>& r : ranks_) {
    RankLayer g;
    g.layer = teacher ? r->teacher_layer() : r->layer_list()[layer].get();
    g.weights = r->Weights(teacher ? r->teacher() : r->student(), layer);
    g.streams = r->streams();
    if (teacher) g.streams.timer = nullptr;
    g.grads = r->Grads(layer);
    group.push_back(g);
  }
  return group;
}

// The whole step on rank 0's main stream (every other stream forks from it and joins back):
// batch, targets, forward, loss, backward, optimizer, for every rank of this process. Recorded
// into a graph once, or run eagerly with DROPLESS_CUDA_GRAPH=0.
absl::Status CudaEngineImpl::RecordStep() {
  links_.Reset();
  timer_.Reset();
  const int64_t T = dims_.tokens, H = dims_.hidden;
  for (size_t r = 1; r < ranks_.size(); ++r) {
    DROPLESS_RETURN_IF_ERROR(links_.Link(main(), ranks_[r]->streams().main));
  }

  // The synthetic batch (the teacher's forward, with its exchanges at EP > 1) is reported to the
  // hang watchdog as forward, not as the previous step's optimizer that the marker still holds.
  DROPLESS_RETURN_IF_ERROR(MarkPhase(StepPhase::kForward));
  DROPLESS_RETURN_IF_ERROR(timer_.Begin(PhaseTimer::kData, main()));
  for (const std::unique_ptr<RankModel>& r : ranks_) {
    cudaStream_t s = r->streams().main;
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(r->stats(), 0, sizeof(double), s));
    TokenSource source;
    source.seed = tokens_.seed();
    source.first_token = static_cast<int64_t>(r->rank()) * T;
    source.tokens = T;
    source.hidden = H;
    source.latent_rank = static_cast<int>(tokens_.latent_rank());
    source.basis = basis_;
    source.step_counter = r->step_counter();
    DROPLESS_RETURN_IF_ERROR(GenerateTokens(source, r->activations()[0], s));
  }
  // Teacher forward in bf16 (RankModel::teacher_layer: in bf16 layer 0's buffers as scratch,
  // which the student's forward overwrites after), the student's activation buffers as the
  // ping-pong between layers, the last into the target.
  for (int64_t l = 0; l < L(); ++l) {
    std::vector<RankLayer> group = Group(l, /*teacher=*/true);
    for (size_t r = 0; r < ranks_.size(); ++r) {
      group[r].x = ranks_[r]->activations()[l];
      group[r].x_next = l + 1 == L() ? ranks_[r]->target() : ranks_[r]->activations()[l + 1];
    }
    DROPLESS_RETURN_IF_ERROR(ForwardLayerGroup(dispatcher_.get(), group));
  }
  DROPLESS_RETURN_IF_ERROR(timer_.End(PhaseTimer::kData, main()));

  DROPLESS_RETURN_IF_ERROR(timer_.Begin(PhaseTimer::kForward, main()));
  for (int64_t l = 0; l < L(); ++l) {
    std::vector<RankLayer> group = Group(l, /*teacher=*/false);
    for (size_t r = 0; r < ranks_.size(); ++r) {
      group[r].x = ranks_[r]->activations()[l];
      group[r].x_next = ranks_[r]->activations()[l + 1];
      group[r].aux_loss = reinterpret_cast<float*>(ranks_[r]->stats() + sizeof(double)) + l;
    }
    DROPLESS_RETURN_IF_ERROR(ForEachRing([&](ActivationRing* ring, cudaStream_t s) {
      return ring->BeforeForward(l, s);
    }));
    DROPLESS_RETURN_IF_ERROR(ForwardLayerGroup(dispatcher_.get(), group));
    DROPLESS_RETURN_IF_ERROR(ForEachRing([&](ActivationRing* ring, cudaStream_t s) {
      return ring->AfterForward(l, s);
    }));
  }
  const double job_tokens = static_cast<double>(T) * world_size_;
  std::vector<double*> squared_errors;
  for (const std::unique_ptr<RankModel>& r : ranks_) {
    cudaStream_t s = r->streams().main;
    for (int64_t l = 0; l < L(); ++l) {
      DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          r->stats() + r->CountsOffset() + l * dims_.experts * sizeof(int32_t),
          r->layer_list()[l]->job_counts(), dims_.experts * sizeof(int32_t),
          cudaMemcpyDeviceToDevice, s));
    }
    double* squared_error = reinterpret_cast<double*>(r->stats());
    DROPLESS_RETURN_IF_ERROR(SquaredErrorAndGrad(T * H, r->activations()[L()], r->target(),
                                                 static_cast<float>(2.0 / (job_tokens * H)),
                                                 squared_error, r->grad_a(), s));
    squared_errors.push_back(squared_error);
  }
  DROPLESS_RETURN_IF_ERROR(SumOverGroup(squared_errors, 1));
  DROPLESS_RETURN_IF_ERROR(timer_.End(PhaseTimer::kForward, main()));
  return RecordBackward();
}

// Backward, with each weight's AdamW update (and its quantized copies) on the optimizer stream
// as soon as its gradient is complete; at EP > 1 the replicated weights' (router, shared
// experts) once their gradients are summed over the group after the backward.
absl::Status CudaEngineImpl::RecordBackward() {
  DROPLESS_RETURN_IF_ERROR(timer_.Begin(PhaseTimer::kBackward, main()));
  DROPLESS_RETURN_IF_ERROR(MarkPhase(StepPhase::kBackward));
  for (const std::unique_ptr<RankModel>& r : ranks_) {
    DROPLESS_RETURN_IF_ERROR(r->adamw()->PrepareStep(r->streams().main));
  }
  const float aux_coef = static_cast<float>(config_.model.aux_loss_coeff / static_cast<double>(L()));
  const bool replicated_in_backward = overlap_optimizer_ && dispatcher_ == nullptr;
  for (int64_t l = L() - 1; l >= 0; --l) {
    std::vector<RankLayer> group = Group(l, /*teacher=*/false);
    for (size_t i = 0; i < ranks_.size(); ++i) {
      RankModel* r = ranks_[i].get();
      // Backward of layer l reads grad_a (odd distance from the top: grad_b) and writes the other.
      const bool flip = (L() - 1 - l) % 2 == 1;
      RankLayer& g = group[i];
      g.x = r->activations()[l];
      g.d_x_next = flip ? r->grad_b() : r->grad_a();
      g.d_x = flip ? r->grad_a() : r->grad_b();
      if (!overlap_optimizer_) continue;
      const OptimizerGroups& og = r->optimizer_groups(l);
      if (replicated_in_backward) {
        g.hooks.router_and_shared = [r, og](cudaStream_t s) {
          return r->adamw()->Update(og.router_first, og.router_count, s);
        };
      }
      g.hooks.experts_w2 = [r, l](cudaStream_t s) { return r->UpdateExpertWeight(l, false, s); };
      g.hooks.experts_w1 = [r, l](cudaStream_t s) { return r->UpdateExpertWeight(l, true, s); };
    }
    DROPLESS_RETURN_IF_ERROR(ForEachRing([&](ActivationRing* ring, cudaStream_t s) {
      return ring->BeforeBackward(l, s);
    }));
    DROPLESS_RETURN_IF_ERROR(BackwardLayerGroup(dispatcher_.get(), group, aux_coef));
    DROPLESS_RETURN_IF_ERROR(ForEachRing([&](ActivationRing* ring, cudaStream_t s) {
      return ring->AfterBackward(l, s);
    }));
  }
  DROPLESS_RETURN_IF_ERROR(timer_.End(PhaseTimer::kBackward, main()));

  // What of the optimizer did not hide under the backward.
  DROPLESS_RETURN_IF_ERROR(timer_.Begin(PhaseTimer::kOptimizer, main()));
  DROPLESS_RETURN_IF_ERROR(MarkPhase(StepPhase::kOptimizer));
  std::vector<float*> grads;
  for (const std::unique_ptr<RankModel>& r : ranks_) grads.push_back(r->replicated().grad);
  DROPLESS_RETURN_IF_ERROR(SumOverGroup(grads, static_cast<size_t>(lead().replicated().size)));
  for (const std::unique_ptr<RankModel>& r : ranks_) {
    const LayerStreams& s = r->streams();
    if (overlap_optimizer_) {
      if (!replicated_in_backward) {
        for (int64_t l = 0; l < L(); ++l) {
          const OptimizerGroups& og = r->optimizer_groups(l);
          DROPLESS_RETURN_IF_ERROR(r->adamw()->Update(og.router_first, og.router_count, s.main));
        }
      }
      DROPLESS_RETURN_IF_ERROR(links_.Link(s.optimizer, s.main));
    } else {
      for (int64_t l = 0; l < L(); ++l) {
        const OptimizerGroups& og = r->optimizer_groups(l);
        DROPLESS_RETURN_IF_ERROR(r->adamw()->Update(og.router_first, og.router_count, s.main));
        DROPLESS_RETURN_IF_ERROR(r->UpdateExpertWeight(l, true, s.main));
        DROPLESS_RETURN_IF_ERROR(r->UpdateExpertWeight(l, false, s.main));
      }
    }
  }
  for (size_t r = 1; r < ranks_.size(); ++r) {
    DROPLESS_RETURN_IF_ERROR(links_.Link(ranks_[r]->streams().main, main()));
  }
  return timer_.End(PhaseTimer::kOptimizer, main());
}

absl::StatusOr<StepStats> CudaEngineImpl::Step() {
  const Clock::time_point start = Clock::now();
  // The previous step has ended (WaitForStep): the marker still says its optimizer until the
  // device's first write of this step, which the first poll may precede.
  *reinterpret_cast<volatile int32_t*>(phase_marker_) = static_cast<int32_t>(StepPhase::kForward);
  if (!use_graph_) {
    DROPLESS_RETURN_IF_ERROR(RecordStep());
  } else {
    if (graph_exec_ == nullptr) {
      cudaGraph_t graph = nullptr;
      DROPLESS_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(main(), cudaStreamCaptureModeThreadLocal));
      const absl::Status recorded = RecordStep();
      const cudaError_t ended = cudaStreamEndCapture(main(), &graph);
      if (!recorded.ok()) {
        // The capture's error is the one to report; the graph is dropped either way.
        if (graph != nullptr) (void)cudaGraphDestroy(graph);
        return WithContext("capturing the step graph", recorded);
      }
      DROPLESS_CUDA_RETURN_IF_ERROR(ended);
      const cudaError_t instantiated = cudaGraphInstantiate(&graph_exec_, graph, 0);
      const cudaError_t destroyed = cudaGraphDestroy(graph);  // the executable graph lives on
      DROPLESS_CUDA_RETURN_IF_ERROR(instantiated);
      DROPLESS_CUDA_RETURN_IF_ERROR(destroyed);
    }
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph_exec_, main()));
  }
  // The one host wait of a step: its loss and statistics.
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_stats_, lead().stats(), lead().StatsBytes(),
                                                cudaMemcpyDeviceToHost, main()));
  DROPLESS_RETURN_IF_ERROR(WaitForStep());
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  ++steps_done_;

  const int64_t E = dims_.experts;
  double squared_error = 0;
  std::memcpy(&squared_error, host_stats_, sizeof(double));
  std::vector<int32_t> counts(static_cast<size_t>(L() * E));
  std::memcpy(counts.data(), host_stats_ + lead().CountsOffset(), lead().CountsBytes());
  const double job_tokens = static_cast<double>(dims_.tokens) * world_size_;
  StepStats out;
  out.step = steps_done_;
  out.loss = squared_error / (job_tokens * static_cast<double>(dims_.hidden));
  out.expert_tokens.assign(static_cast<size_t>(E), 0);
  for (int64_t l = 0; l < L(); ++l) {
    for (int64_t e = 0; e < E; ++e) out.expert_tokens[e] += counts[l * E + e];
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
  // Every rank of this process: its tokens through its share of the routed experts.
  const double t = static_cast<double>(dims_.tokens) * ep_local_, h = static_cast<double>(dims_.hidden);
  const double f = static_cast<double>(dims_.ffn);
  out.flops = static_cast<double>(L()) *
              (18.0 * t * dims_.topk * h * f + 6.0 * t * h * dims_.experts + 18.0 * t * h * f * dims_.shared);
  out.tokens = dims_.tokens * ep_local_;
  if (dispatcher_ != nullptr) {
    // Rows this process's ranks sent through the dispatcher (rows that stay on their rank
    // included), as the phases are timed: dispatch = the tokens out and the input gradients
    // back, combine = the expert outputs back and the output gradients out.
    const int64_t rows = dims_.rows() * ep_local_ * L();
    const int64_t bf16_row = dims_.hidden * static_cast<int64_t>(sizeof(Bf16));
    // Quantized tokens: e4m3 rows and their scales (E8M0 per 32 or fp32 per 128: H / 32 bytes).
    const int64_t token_row =
        dims_.quantized() ? dims_.hidden + dims_.hidden / 32 : bf16_row;
    out.dispatch_bytes = rows * (token_row + bf16_row);
    out.combine_bytes = rows * 2 * bf16_row;
  }
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
    const cudaError_t state = cudaStreamQuery(main());
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
  for (const std::unique_ptr<RankModel>& r : ranks_) {
    for (int64_t l = 0; l < L(); ++l) {
      double s[3] = {0, 0, 0};
      DROPLESS_RETURN_IF_ERROR(r->layer_list()[l]->TimeExpertGemms(
          r->Weights(r->student(), l), r->Grads(l), iterations, main(), s));
      total.forward += s[0];
      total.dgrad += s[1];
      total.wgrad += s[2];
    }
  }
  return total;
}

absl::StatusOr<std::vector<float>> CudaEngineImpl::LastTargets() {
  if (steps_done_ == 0) return absl::FailedPreconditionError("LastTargets: run a step first");
  const size_t n = static_cast<size_t>(dims_.tokens * dims_.hidden);
  std::vector<Bf16> target(n);
  std::vector<float> out;
  out.reserve(n * ranks_.size());
  for (const std::unique_ptr<RankModel>& r : ranks_) {
    DROPLESS_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(target.data(), r->target(), n * sizeof(Bf16), cudaMemcpyDeviceToHost));
    for (Bf16 v : target) out.push_back(kernels::Bf16ToFloat(v));
  }
  return out;
}

absl::Status CudaEngineImpl::SaveCheckpoint(const std::string& dir) {
  for (const std::unique_ptr<RankModel>& r : ranks_) {
    DROPLESS_RETURN_IF_ERROR(r->SaveCheckpoint(dir, steps_done_));
  }
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
  DROPLESS_RETURN_IF_ERROR(CheckCudaEngineConfig(config, world_size));
  auto engine = std::make_unique<CudaEngineImpl>(config, rank, world_size, /*ep_local=*/1, groups);
  DROPLESS_RETURN_IF_ERROR(engine->Initialize());
  return std::unique_ptr<CudaEngine>(std::move(engine));
}

absl::StatusOr<std::unique_ptr<CudaEngine>> CreateLocalEpCudaEngine(const EngineConfig& config) {
  if (config.parallel.dp != 1 || config.parallel.ep < 1 || config.parallel.ep > kMaxLocalRanks) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cuda engine (local EP): parallel: ep must be 1 to %d and dp 1; got ep %d, dp %d",
        kMaxLocalRanks, config.parallel.ep, config.parallel.dp));
  }
  EngineConfig one_rank = config;
  one_rank.parallel.ep = 1;  // every check but the EP size, which the local dispatcher honours
  one_rank.overlap = false;
  DROPLESS_RETURN_IF_ERROR(CheckEngineSupport(Backend::kCuda, one_rank));
  if (config.overlap) {
    EngineConfig local = config;
    local.dispatcher = Dispatcher::kAuto;  // `local` exchanges chunks whatever the spec names
    DROPLESS_RETURN_IF_ERROR(CheckEngineSupport(Backend::kCuda, local));
  }
  const int ep = static_cast<int>(config.parallel.ep);
  auto engine = std::make_unique<CudaEngineImpl>(config, 0, ep, ep, nullptr);
  DROPLESS_RETURN_IF_ERROR(engine->Initialize());
  return std::unique_ptr<CudaEngine>(std::move(engine));
}

}  // namespace dropless::cuda_engine
