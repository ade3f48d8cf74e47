// CpuEngine: the float32 reference engine. Each step generates this rank's share of the global
// batch, runs the fixed teacher stack forward for the targets, the student stack forward and
// backward (expert parallel through the EP communicator), sums gradients (replicated parameters
// over the world group, experts over the dp group) and applies AdamW.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/engine_config.h"
#include "common/status_context.h"
#include "common/status_macros.h"
#include "common/step_phase.h"
#include "worker/engine/checkpoint/checkpoint_agreement.h"
#include "worker/engine/checkpoint/moe_checkpoint.h"
#include "worker/engine/cpu/adamw.h"
#include "worker/engine/cpu/blas_gemm.h"
#include "worker/engine/cpu/expert_exchange.h"
#include "worker/engine/cpu/moe_layer.h"
#include "worker/engine/cpu/moe_model.h"
#include "worker/engine/cpu/synthetic_task.h"
#include "worker/engine/engine.h"

namespace dropless {
namespace {

using cpu::MoeLayerCache;
using cpu::MoeLayerTimes;
using cpu::MoeParameterLayout;
using Clock = std::chrono::steady_clock;

// Nominal peak of one CPU rank: one AVX2 core with two 256-bit FMA units at ~3 GHz
// (2 units x 8 floats x 2 FLOP x 3e9 = 96 GFLOP/s). Override with DROPLESS_CPU_PEAK_FLOPS.
constexpr double kNominalCpuPeakFlops = 96e9;

template <typename V>
int64_t VectorBytes(const V& v) {
  return static_cast<int64_t>(v.capacity() * sizeof(typename V::value_type));
}

// A parameter buffer with its gradient and AdamW moments.
struct ParameterBuffer {
  std::vector<float> value, grad, m, v;
  void Resize(int64_t n) {
    value.assign(n, 0.f);
    grad.assign(n, 0.f);
    m.assign(n, 0.f);
    v.assign(n, 0.f);
  }
  int64_t Bytes() const {
    return VectorBytes(value) + VectorBytes(grad) + VectorBytes(m) + VectorBytes(v);
  }
};

absl::Status CheckContext(const EngineContext& ctx) {
  const EngineConfig& spec = ctx.config;
  // The config's fields are checked in one place, common/ (the spec validator runs the same).
  if (absl::Status st = CheckEngineSupport(Backend::kCpu, spec); !st.ok()) {
    return WithContext("cpu engine", st);
  }
  if (ctx.world_size != spec.world_size() || ctx.rank < 0 || ctx.rank >= ctx.world_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cpu engine: rank %d of world %d does not fit parallel.ep %d x parallel.dp %d", ctx.rank,
        ctx.world_size, spec.parallel.ep, spec.parallel.dp));
  }
  if (ctx.groups == nullptr || !ctx.groups->world || !ctx.groups->ep || !ctx.groups->dp) {
    return absl::InvalidArgumentError("cpu engine: groups: world, ep and dp are required");
  }
  const RankGroups& g = *ctx.groups;
  const int ep = static_cast<int>(spec.parallel.ep);
  if (g.world->size() != ctx.world_size || g.world->rank() != ctx.rank ||
      g.ep->size() != ep || g.ep->rank() != ctx.rank % ep ||
      g.dp->size() != static_cast<int>(spec.parallel.dp) || g.dp->rank() != ctx.rank / ep) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cpu engine: groups: rank %d expects world %d/%d, ep %d/%d, dp %d/%d; got %d/%d, %d/%d, "
        "%d/%d", ctx.rank, ctx.rank, ctx.world_size, ctx.rank % ep, ep, ctx.rank / ep,
        spec.parallel.dp, g.world->rank(), g.world->size(), g.ep->rank(), g.ep->size(),
        g.dp->rank(), g.dp->size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> PeakFlopsFromEnvironment() {
  const char* text = std::getenv("DROPLESS_CPU_PEAK_FLOPS");
  if (text == nullptr || *text == '\0') return kNominalCpuPeakFlops;
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || !(value > 0) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cpu engine: DROPLESS_CPU_PEAK_FLOPS must be a positive number of FLOP/s (got \"%s\")",
        text));
  }
  return value;
}

class CpuEngine final : public Engine {
 public:
  CpuEngine(const EngineContext& ctx, double peak_flops)
      : spec_(ctx.config),
        rank_(ctx.rank),
        world_size_(ctx.world_size),
        groups_(ctx.groups),
        peak_flops_(peak_flops),
        layout_(spec_.model, spec_.parallel.ep, ctx.rank % spec_.parallel.ep,
                spec_.tokens_per_rank),
        expert_runs_(layout_.ExpertRuns()),
        seeds_(cpu::DeriveTaskSeeds(spec_.data.seed)),
        token_generator_(seeds_.tokens, spec_.model.hidden),
        exchange_(cpu::NewCommunicatorExpertExchange(groups_->ep.get(), groups_->world.get())),
        teacher_exchange_(
            cpu::NewCommunicatorExpertExchange(groups_->ep.get(), groups_->world.get())) {}

  absl::Status Initialize() {
    cpu::UseSingleThreadedBlas();
    student_replicated_.Resize(layout_.replicated_size());
    student_experts_.Resize(layout_.experts_size());
    layout_.Initialize(seeds_.student, student_replicated_.value.data(),
                       student_experts_.value.data());
    teacher_replicated_.assign(layout_.replicated_size(), 0.f);
    teacher_experts_.assign(layout_.experts_size(), 0.f);
    layout_.Initialize(seeds_.teacher, teacher_replicated_.data(), teacher_experts_.data());
    const std::vector<double> bias = cpu::TeacherRouterBias(spec_.data, spec_.model.experts);
    teacher_router_bias_.assign(bias.begin(), bias.end());

    const int64_t tokens = spec_.tokens_per_rank, hidden = spec_.model.hidden;
    activations_.assign(spec_.model.layers + 1, std::vector<float>(tokens * hidden));
    caches_.resize(spec_.model.layers);
    teacher_cache_ = MoeLayerCache<float>();
    target_.assign(tokens * hidden, 0.f);
    scratch_.assign(tokens * hidden, 0.f);
    grad_a_.assign(tokens * hidden, 0.f);
    grad_b_.assign(tokens * hidden, 0.f);

    if (!spec_.checkpoint.dir.empty()) {
      if (absl::Status status = Restore(spec_.checkpoint.dir); !status.ok()) return status;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<StepStats> Step() override;
  double PeakFlops() const override { return peak_flops_; }
  absl::Status SaveCheckpoint(const std::string& dir) override;
  int64_t StepsDone() const override { return steps_done_; }

 private:
  static engine::MoeOptimizerBuffers Buffers(ParameterBuffer& buffer) {
    return {absl::MakeSpan(buffer.value), absl::MakeSpan(buffer.m), absl::MakeSpan(buffer.v)};
  }

  absl::Status Restore(const std::string& dir);
  absl::Status TeacherForward(const float* x, float* target);
  int64_t BytesHeld() const;

  const EngineConfig spec_;
  const int rank_;
  const int world_size_;
  RankGroups* const groups_;
  const double peak_flops_;
  const MoeParameterLayout layout_;
  // layout_'s routed-expert runs with their single-rank indices (bf16 moments' rounding keys).
  const std::vector<MoeParameterLayout::ExpertRun> expert_runs_;
  const cpu::TaskSeeds seeds_;
  const cpu::TokenGenerator token_generator_;
  std::unique_ptr<cpu::ExpertExchange> exchange_;
  std::unique_ptr<cpu::ExpertExchange> teacher_exchange_;

  ParameterBuffer student_replicated_;
  ParameterBuffer student_experts_;
  std::vector<float> teacher_replicated_;
  std::vector<float> teacher_experts_;
  std::vector<float> teacher_router_bias_;

  std::vector<std::vector<float>> activations_;  // layer inputs x_0 .. x_L (x_L: the output)
  std::vector<MoeLayerCache<float>> caches_;
  MoeLayerCache<float> teacher_cache_;
  std::vector<float> target_, scratch_, grad_a_, grad_b_;
  int64_t steps_done_ = 0;
};

absl::Status CpuEngine::TeacherForward(const float* x, float* target) {
  const cpu::MoeLayerShape& shape = layout_.layer_shape();
  MoeLayerTimes ignored;  // the teacher is the task, not the model: its time is not reported
  const int64_t values = shape.tokens * shape.hidden;
  std::copy(x, x + values, scratch_.data());
  for (int64_t layer = 0; layer < layout_.layers(); ++layer) {
    const auto weights = layout_.Weights<float>(teacher_replicated_.data(), teacher_experts_.data(),
                                                layer, teacher_router_bias_.data());
    absl::Status status = cpu::MoeLayerForward<float>(shape, weights, scratch_.data(),
                                                      /*compute_aux_loss=*/false,
                                                      teacher_exchange_.get(), &teacher_cache_,
                                                      &ignored, target);
    if (!status.ok()) return status;
    if (layer + 1 < layout_.layers()) std::copy(target, target + values, scratch_.data());
  }
  return absl::OkStatus();
}

absl::StatusOr<StepStats> CpuEngine::Step() {
  const Clock::time_point step_start = Clock::now();
  const int64_t step = steps_done_ + 1;
  const cpu::MoeLayerShape& shape = layout_.layer_shape();
  const int64_t tokens = shape.tokens, hidden = shape.hidden, experts = shape.experts;
  const int64_t layers = layout_.layers();
  const double job_tokens = static_cast<double>(tokens) * world_size_;

  EnterStepPhase(StepPhase::kForward);
  token_generator_.Generate<float>(step, static_cast<int64_t>(rank_) * tokens, tokens,
                                   activations_[0].data());
  if (absl::Status status = TeacherForward(activations_[0].data(), target_.data()); !status.ok()) {
    return status;
  }

  MoeLayerTimes times;
  double aux_loss = 0;
  for (int64_t layer = 0; layer < layers; ++layer) {
    const auto weights = layout_.Weights<float>(student_replicated_.value.data(),
                                                student_experts_.value.data(), layer, nullptr);
    absl::Status status = cpu::MoeLayerForward<float>(
        shape, weights, activations_[layer].data(), /*compute_aux_loss=*/true, exchange_.get(),
        &caches_[layer], &times, activations_[layer + 1].data());
    if (!status.ok()) return status;
    aux_loss += caches_[layer].aux_loss / static_cast<double>(layers);
  }

  // Objective: MSE over every token of the job + aux_loss_coeff * (mean over layers of aux).
  const std::vector<float>& output = activations_[layers];
  const double grad_scale = 2.0 / (job_tokens * static_cast<double>(hidden));
  double squared_error = 0;
  for (int64_t i = 0; i < tokens * hidden; ++i) {
    const double diff = static_cast<double>(output[i]) - static_cast<double>(target_[i]);
    squared_error += diff * diff;
    grad_a_[i] = static_cast<float>(grad_scale * diff);
  }
  const double aux_scale = spec_.model.aux_loss_coeff / static_cast<double>(layers);
  EnterStepPhase(StepPhase::kBackward);
  for (int64_t layer = layers - 1; layer >= 0; --layer) {
    const auto weights = layout_.Weights<float>(student_replicated_.value.data(),
                                                student_experts_.value.data(), layer, nullptr);
    const auto grads = layout_.Grads<float>(student_replicated_.grad.data(),
                                            student_experts_.grad.data(), layer);
    absl::Status status = cpu::MoeLayerBackward<float>(
        shape, weights, activations_[layer].data(), grad_a_.data(), aux_scale, exchange_.get(),
        &caches_[layer], &times, grads, grad_b_.data());
    if (!status.ok()) return status;
    std::swap(grad_a_, grad_b_);
  }

  // Gradient sums, the loss over the job, expert load over the EP group.
  EnterStepPhase(StepPhase::kOptimizer);
  if (world_size_ > 1) {
    absl::Status status = groups_->world->AllReduceSum(student_replicated_.grad.data(),
                                                       student_replicated_.grad.size());
    if (!status.ok()) return status;
    status = groups_->world->AllReduceSum(&squared_error, 1);
    if (!status.ok()) return status;
  }
  if (groups_->dp->size() > 1) {
    absl::Status status = groups_->dp->AllReduceSum(student_experts_.grad.data(),
                                                    student_experts_.grad.size());
    if (!status.ok()) return status;
  }
  std::vector<double> expert_load(layers * experts);
  for (int64_t layer = 0; layer < layers; ++layer) {
    for (int64_t e = 0; e < experts; ++e) {
      expert_load[layer * experts + e] = static_cast<double>(caches_[layer].rows_per_expert[e]);
    }
  }
  if (groups_->ep->size() > 1) {
    absl::Status status = groups_->ep->AllReduceSum(expert_load.data(), expert_load.size());
    if (!status.ok()) return status;
  }
  std::vector<int64_t> expert_tokens(experts, 0);
  double load_imbalance = 0;
  for (int64_t layer = 0; layer < layers; ++layer) {
    double max_load = 0, total_load = 0;
    for (int64_t e = 0; e < experts; ++e) {
      max_load = std::max(max_load, expert_load[layer * experts + e]);
      total_load += expert_load[layer * experts + e];
      expert_tokens[e] += static_cast<int64_t>(expert_load[layer * experts + e]);
    }
    const double mean_load = total_load / static_cast<double>(experts);
    load_imbalance += (mean_load > 0 ? max_load / mean_load : 1.0) / static_cast<double>(layers);
  }

  {
    ParameterBuffer& r = student_replicated_;
    cpu::AdamWUpdate<float>(spec_.optimizer, step, static_cast<int64_t>(r.value.size()),
                            r.grad.data(), r.value.data(), r.m.data(), r.v.data(),
                            cpu::kReplicatedMoments, 0);
  }
  // The routed experts run by run, so that bf16 moments draw by the single-rank index.
  for (const cpu::MoeParameterLayout::ExpertRun& run : expert_runs_) {
    ParameterBuffer& x = student_experts_;
    cpu::AdamWUpdate<float>(spec_.optimizer, step, run.count, x.grad.data() + run.offset,
                            x.value.data() + run.offset, x.m.data() + run.offset,
                            x.v.data() + run.offset, cpu::kExpertMoments, run.global_index);
  }
  steps_done_ = step;

  StepStats stats;
  stats.step = step;
  stats.loss = squared_error / (job_tokens * static_cast<double>(hidden));
  stats.aux_loss = aux_loss;
  stats.dispatch_seconds = times.dispatch_seconds;
  stats.combine_seconds = times.combine_seconds;
  stats.gemm_forward_seconds = times.gemm_forward_seconds;
  stats.gemm_dgrad_seconds = times.gemm_dgrad_seconds;
  stats.gemm_wgrad_seconds = times.gemm_wgrad_seconds;
  stats.gemm_seconds = times.gemm_seconds();
  const double t = static_cast<double>(tokens), h = static_cast<double>(hidden);
  const double f = static_cast<double>(shape.ffn);
  stats.flops = static_cast<double>(layers) *
                (18.0 * t * static_cast<double>(shape.topk) * h * f +
                 6.0 * t * h * static_cast<double>(experts) +
                 18.0 * t * h * f * static_cast<double>(shape.shared_experts));
  stats.tokens = tokens;
  stats.load_imbalance = load_imbalance;
  stats.expert_tokens = std::move(expert_tokens);
  // Per layer, each phase runs one Dispatch and one Combine (cpu/moe_layer.cc): the dispatch is
  // the forward's Dispatch of the tokens' rows and the backward's Combine of their gradients, the
  // combine the forward's Combine of the expert outputs and the backward's Dispatch of theirs.
  const size_t row_bytes = static_cast<size_t>(hidden) * sizeof(float);
  for (const MoeLayerCache<float>& cache : caches_) {
    const int64_t both_ways =
        cache.plan.DispatchSendBytes(row_bytes) + cache.plan.CombineSendBytes(row_bytes);
    stats.dispatch_bytes += both_ways;
    stats.combine_bytes += both_ways;
  }
  stats.device_memory_bytes = BytesHeld();

  stats.step_seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
  return stats;
}

absl::Status CpuEngine::SaveCheckpoint(const std::string& dir) {
  return engine::WriteMoeCheckpoint(dir, engine::MoeCheckpointIdentityOf(spec_, rank_), steps_done_,
                                    layout_, Buffers(student_replicated_),
                                    Buffers(student_experts_));
}

absl::Status CpuEngine::Restore(const std::string& dir) {
  // Every rank resumes from the same step: the newest that all of them hold.
  const engine::MoeCheckpointIdentity id = engine::MoeCheckpointIdentityOf(spec_, rank_);
  Communicator* const world = world_size_ > 1 ? groups_->world.get() : nullptr;
  absl::Status unreadable;
  std::vector<engine::HeldCheckpoints> held = engine::ListHeldCheckpoints(dir, {id}, &unreadable);
  absl::StatusOr<std::vector<engine::HeldCheckpoints>> all =
      engine::ExchangeHeldCheckpoints(world, world_size_, rank_, held);
  if (!all.ok()) return all.status();
  absl::StatusOr<int64_t> agreed = engine::AgreeOnCheckpointStep(dir, *all, unreadable);
  if (!agreed.ok()) return agreed.status();
  // Every rank learns whether all read their part, so that all fail alike, or all go back to an
  // older step when some rank's files are damaged.
  auto read = [&](int64_t at) {
    return engine::ReadMoeCheckpoint(dir, id, layout_, Buffers(student_replicated_),
                                     Buffers(student_experts_), at)
        .status();
  };
  const int64_t first = *agreed;
  absl::StatusOr<int64_t> restored = engine::RestoreAgreedStep(
      world, world_size_, rank_, dir, *all, first, {first > 0 ? read(first) : absl::OkStatus()},
      [&](int64_t at) { return std::vector<absl::Status>{read(at)}; });
  if (!restored.ok()) return restored.status();
  const int64_t step = *restored;
  if (step > 0) {
    // Files hold fp32 moments; a job with bf16 moments keeps them as it would have stored them.
    for (ParameterBuffer* b : {&student_replicated_, &student_experts_}) {
      for (std::vector<float>* moments : {&b->m, &b->v}) {
        cpu::RoundMomentsTo(spec_.optimizer.moment_dtype, static_cast<int64_t>(moments->size()),
                            moments->data());
      }
    }
  }
  steps_done_ = step;
  return absl::OkStatus();
}

int64_t CpuEngine::BytesHeld() const {
  int64_t bytes = student_replicated_.Bytes() + student_experts_.Bytes() +
                  VectorBytes(teacher_replicated_) + VectorBytes(teacher_experts_) +
                  VectorBytes(target_) + VectorBytes(scratch_) + VectorBytes(grad_a_) +
                  VectorBytes(grad_b_) + teacher_cache_.BytesHeld();
  for (const auto& x : activations_) bytes += VectorBytes(x);
  for (const auto& cache : caches_) bytes += cache.BytesHeld();
  return bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> CreateCpuEngine(const EngineContext& ctx) {
  if (absl::Status status = CheckContext(ctx); !status.ok()) return status;
  absl::StatusOr<double> peak = PeakFlopsFromEnvironment();
  if (!peak.ok()) return peak.status();
  auto engine = std::make_unique<CpuEngine>(ctx, *peak);
  if (absl::Status status = engine->Initialize(); !status.ok()) return status;
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace dropless
