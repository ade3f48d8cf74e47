// Shared by the CUDA engine's GPU tests (local_ep_gpu_test.cc, overlap_gpu_test.cc,
// cuda_engine_gpu_test.cc, expert_dispatcher_gpu_test.cc, precision_loss_gpu_test.cc): a small
// skewed MoE job, the engine at EP 1 or in-process EP, the group's weights read back from its
// checkpoint in the EP = 1 layout, whether this process can run nccl-lsa, and the learning tests'
// job and loss curves.
#ifndef DROPLESS_TESTS_GPU_ENGINE_LOCAL_EP_TEST_SUPPORT_H_
#define DROPLESS_TESTS_GPU_ENGINE_LOCAL_EP_TEST_SUPPORT_H_

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/engine/checkpoint/moe_checkpoint.h"
#include "worker/engine/cpu/moe_model.h"
#include "worker/engine/cuda/cuda_engine.h"
#include "worker/engine/cuda/ep/expert_dispatcher.h"
#include "worker/engine/engine.h"

namespace dropless::local_ep_testing {

// Why nccl-lsa cannot run in this process, or "" when it can: the dispatcher's own runtime check
// (NcclGroupGpu.AutoProbeAnswersByTheRuntimeVersion tests its refusal), so the tests that exchange
// through nccl-lsa skip with this reason on an older NCCL.
inline std::string NcclLsaUnavailableReason() {
  const absl::Status supported = cuda_engine::NcclLsaRuntimeSupported();
  return supported.ok() ? "" : absl::StrCat("SKIPPED: ", supported.message());
}

constexpr int64_t kTokensPerRank = 24;

inline EngineConfig Config(int ep) {
  EngineConfig c;
  c.model.hidden = 128;
  c.model.ffn = 64;
  c.model.experts = 64;
  c.model.topk = 2;
  c.model.shared_experts = 1;
  c.model.layers = 2;
  c.model.router = RouterKind::kSoftmax;
  c.model.renormalize = true;
  c.model.aux_loss_coeff = 0.01;
  c.parallel.ep = ep;
  c.tokens_per_rank = kTokensPerRank;
  c.steps = 1000;
  c.optimizer.lr = 1e-3;
  c.data.seed = 91;
  c.data.distribution = RoutingDistribution::kZipf;
  c.data.zipf_exponent = 1.5;
  return c;
}

// EP = 1 over the group's tokens: one rank with ep x the tokens (the token stream of ranks
// 0..ep-1 laid end to end).
inline EngineConfig Reference(int ep) {
  EngineConfig c = Config(1);
  c.tokens_per_rank = kTokensPerRank * ep;
  return c;
}

inline std::unique_ptr<cuda_engine::CudaEngine> Make(const EngineConfig& c) {
  absl::StatusOr<std::unique_ptr<cuda_engine::CudaEngine>> e =
      c.parallel.ep == 1 ? cuda_engine::CreateCudaEngine(c, 0, 1, nullptr)
                         : cuda_engine::CreateLocalEpCudaEngine(c);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *std::move(e) : nullptr;
}

// The replicated buffer (rank 0's) and the experts of every rank laid out as at EP = 1.
struct Params {
  std::vector<float> replicated, experts;
};

inline Params ReadGroup(const EngineConfig& c, const std::string& dir) {
  const int ep = static_cast<int>(c.parallel.ep);
  const int64_t H = c.model.hidden, F = c.model.ffn, E = c.model.experts, L = c.model.layers;
  const int64_t El = E / ep;
  Params p;
  p.experts.resize(L * E * 3 * H * F);
  for (int r = 0; r < ep; ++r) {
    const cpu::MoeParameterLayout layout(c.model, ep, r, c.tokens_per_rank);
    std::vector<float> rep(layout.replicated_size()), exp(layout.experts_size());
    std::vector<float> m1(rep.size()), v1(rep.size()), m2(exp.size()), v2(exp.size());
    absl::StatusOr<int64_t> step = engine::ReadMoeCheckpoint(
        dir, engine::MoeCheckpointIdentityOf(c, r), layout,
        {absl::MakeSpan(rep), absl::MakeSpan(m1), absl::MakeSpan(v1)},
        {absl::MakeSpan(exp), absl::MakeSpan(m2), absl::MakeSpan(v2)});
    EXPECT_TRUE(step.ok()) << step.status();
    if (r == 0) p.replicated = rep;
    // Per layer: w1 [El][H][2F] then w2 [El][F][H] -> the EP = 1 layer's [E][H][2F], [E][F][H].
    for (int64_t l = 0; l < L; ++l) {
      const float* src = exp.data() + l * El * 3 * H * F;
      float* dst = p.experts.data() + l * E * 3 * H * F;
      std::copy(src, src + El * 2 * H * F, dst + r * El * 2 * H * F);
      std::copy(src + El * 2 * H * F, src + El * 3 * H * F, dst + E * 2 * H * F + r * El * H * F);
    }
  }
  return p;
}

inline std::vector<double> Gradient(const std::vector<float>& before, const std::vector<float>& after) {
  std::vector<double> g(before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    const double d = static_cast<double>(before[i]) - after[i];
    g[i] = d / (1.0 - std::fabs(d));
  }
  return g;
}

inline double RelativeError(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// The losses of `steps` steps (fewer when a step fails, which fails the test).
inline std::vector<double> Losses(Engine* engine, int steps) {
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    absl::StatusOr<StepStats> s = engine->Step();
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) break;
    losses.push_back(s->loss);
  }
  return losses;
}

// The learning tests' job: 500 steps of a one-layer model large enough to learn for a while.
inline EngineConfig LearningConfig(Precision precision) {
  EngineConfig c;
  c.model.hidden = 256;
  c.model.ffn = 128;
  c.model.experts = 16;
  c.model.topk = 2;
  c.model.shared_experts = 1;
  c.model.layers = 1;
  c.model.aux_loss_coeff = 0.01;
  c.tokens_per_rank = 1024;
  c.steps = 500;
  c.optimizer.lr = 3e-3;
  c.optimizer.warmup_steps = 20;
  c.data.seed = 5;
  c.precision = precision;
  return c;
}

}  // namespace dropless::local_ep_testing

#endif  // DROPLESS_TESTS_GPU_ENGINE_LOCAL_EP_TEST_SUPPORT_H_
