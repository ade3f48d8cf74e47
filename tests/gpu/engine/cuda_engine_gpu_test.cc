// The CUDA engine against the CPU engine (the float32 reference) on small shapes with the same
// seed: the step-1 loss, and every gradient recovered from the weights after one AdamW step (with
// eps = 1 and lr = 1 the first update of a parameter is d = g / (|g| + 1), so g = d / (1 - |d|)),
// in bf16 and mxfp8, softmax and sigmoid routers, skewed routing and experts that receive no
// token. Then (learning over 500 steps: precision_loss_gpu_test.cc): a run stopped and resumed from
// its checkpoint continues the uninterrupted loss curve (fp32 and bf16 moments, and every quantized
// precision); a CPU-engine checkpoint resumes on the CUDA engine.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_error.h"
#include "dropless/kernels/types.h"
#include "gtest/gtest.h"
#include "tests/gpu/engine/local_ep_test_support.h"
#include "tests/gpu/kernels/gpu_test_util.h"
#include "worker/engine/checkpoint/moe_checkpoint.h"
#include "worker/engine/cpu/moe_model.h"
#include "worker/engine/cuda/cuda_engine.h"
#include "worker/engine/engine.h"
#include "worker/transport/transport_factory.h"

namespace dropless {
namespace {

using kernels::testing::GpuTest;
using local_ep_testing::LearningConfig;
using local_ep_testing::Losses;

class CudaEngineGpu : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("dropless-cuda-engine-", getpid(), "-", counter_++);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string Dir(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;
  static inline int counter_ = 0;
};

// Experts that receive no token: 40 tokens x top-2 over 64 experts leaves most experts empty,
// and the zipf teacher skews the targets.
EngineConfig SmallConfig() {
  EngineConfig c = local_ep_testing::Config(1);
  c.tokens_per_rank = 40;
  c.data.seed = 77;
  c.data.zipf_exponent = 1.2;
  return c;
}

struct Engines {
  std::vector<RankGroups> groups;
  std::unique_ptr<Engine> engine;
};

Engines MakeCpu(const EngineConfig& c) {
  Engines e;
  e.groups = CreateLocalGroups(1, 1);
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      CreateCpuEngine(EngineContext{c, 0, 1, &e.groups[0]});
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (engine.ok()) e.engine = *std::move(engine);
  return e;
}

std::unique_ptr<Engine> MakeCuda(const EngineConfig& c) {
  absl::StatusOr<std::unique_ptr<cuda_engine::CudaEngine>> engine =
      cuda_engine::CreateCudaEngine(c, 0, 1, nullptr);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return nullptr;
  return std::unique_ptr<Engine>(std::move(*engine));
}

// The parameters in a rank-0 checkpoint.
struct Params {
  std::vector<float> replicated, experts;
};

Params ReadParams(const EngineConfig& c, const std::string& dir) {
  const cpu::MoeParameterLayout layout(c.model, 1, 0, c.tokens_per_rank);
  Params p;
  p.replicated.resize(layout.replicated_size());
  p.experts.resize(layout.experts_size());
  std::vector<float> m1(p.replicated.size()), v1(p.replicated.size()), m2(p.experts.size()),
      v2(p.experts.size());
  const engine::MoeCheckpointIdentity id = engine::MoeCheckpointIdentityOf(c, 0);
  absl::StatusOr<int64_t> step = engine::ReadMoeCheckpoint(
      dir, id, layout, {absl::MakeSpan(p.replicated), absl::MakeSpan(m1), absl::MakeSpan(v1)},
      {absl::MakeSpan(p.experts), absl::MakeSpan(m2), absl::MakeSpan(v2)});
  EXPECT_TRUE(step.ok()) << step.status();
  return p;
}

// g = d / (1 - |d|) with d = (before - after) / lr: the first AdamW step with eps 1, no decay.
std::vector<double> RecoverGradient(const std::vector<float>& before,
                                    const std::vector<float>& after, double lr) {
  std::vector<double> g(before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    const double d = (static_cast<double>(before[i]) - after[i]) / lr;
    g[i] = d / (1.0 - std::fabs(d));
  }
  return g;
}

// Relative error of a against the reference b in the 2-norm.
double RelativeError(const std::vector<double>& a, const std::vector<double>& b, size_t begin,
                     size_t end) {
  double diff = 0, norm = 0;
  for (size_t i = begin; i < end; ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

struct MatchCase {
  const char* name;
  Precision precision;
  RouterKind router;
  double loss_tolerance;      // relative, step-1 loss
  double gradient_tolerance;  // relative 2-norm, per tensor
  // DROPLESS_FUSED_EXPERT_ADAMW for the CUDA engine: "1" the routed experts' AdamW in their
  // weight-gradient GEMM, "0" the two passes (these small shapes would pick the fused update).
  const char* fused_expert_adamw = "0";
  // DROPLESS_MX_CORE for mxfp8: "1" the bf16-core expert GEMMs (the default), "0" the per-32
  // promotion kernels.
  const char* mx_core = "1";
  // DROPLESS_SERIAL_EXPERT_BACKWARD: "1" the backward's expert GEMMs one at a time (the default),
  // "0" the weight gradients beside the data gradients.
  const char* serial_expert_backward = "1";
  // DROPLESS_BF16_EXPERT_GRAD: "1" the routed experts' weight gradient stored in bf16 (bf16 with
  // the two passes), "0" in fp32 (the default).
  const char* bf16_expert_grad = "0";
  // model.shared_experts when >= 0 (else SmallConfig's).
  int64_t shared_experts = -1;
};

// The fp8-block precisions need hidden and ffn multiples of 128.
void ShapeFor(Precision precision, EngineConfig* c) {
  if (IsFp8Block(precision)) {
    c->model.hidden = 256;
    c->model.ffn = 128;
  }
}

class CudaMatchesCpu : public CudaEngineGpu, public ::testing::WithParamInterface<MatchCase> {};

TEST_P(CudaMatchesCpu, LossAndGradientsOfOneStep) {
  const MatchCase& mc = GetParam();
  EngineConfig c = SmallConfig();
  c.precision = mc.precision;
  if (mc.shared_experts >= 0) c.model.shared_experts = mc.shared_experts;
  ShapeFor(mc.precision, &c);
  c.model.router = mc.router;
  c.optimizer.lr = 1.0;
  c.optimizer.eps = 1.0;
  c.optimizer.weight_decay = 0.0;
  c.optimizer.warmup_steps = 0;

  // The reference computes in float32 whatever the precision (and refuses mxfp8 as a job would).
  EngineConfig reference = c;
  reference.precision = Precision::kBf16;
  Engines cpu = MakeCpu(reference);
  setenv("DROPLESS_FUSED_EXPERT_ADAMW", mc.fused_expert_adamw, 1);
  setenv("DROPLESS_MX_CORE", mc.mx_core, 1);
  setenv("DROPLESS_SERIAL_EXPERT_BACKWARD", mc.serial_expert_backward, 1);
  setenv("DROPLESS_BF16_EXPERT_GRAD", mc.bf16_expert_grad, 1);
  std::unique_ptr<Engine> gpu = MakeCuda(c);
  unsetenv("DROPLESS_FUSED_EXPERT_ADAMW");
  unsetenv("DROPLESS_MX_CORE");
  unsetenv("DROPLESS_SERIAL_EXPERT_BACKWARD");
  unsetenv("DROPLESS_BF16_EXPERT_GRAD");
  ASSERT_TRUE(cpu.engine && gpu);
  ASSERT_TRUE(cpu.engine->SaveCheckpoint(Dir("cpu0")).ok());
  ASSERT_TRUE(gpu->SaveCheckpoint(Dir("gpu0")).ok());
  absl::StatusOr<StepStats> cpu_step = cpu.engine->Step();
  absl::StatusOr<StepStats> gpu_step = gpu->Step();
  ASSERT_TRUE(cpu_step.ok()) << cpu_step.status();
  ASSERT_TRUE(gpu_step.ok()) << gpu_step.status();
  std::printf("%s: step-1 loss cpu %.6f cuda %.6f, aux %.5f / %.5f\n", mc.name, cpu_step->loss,
              gpu_step->loss, cpu_step->aux_loss, gpu_step->aux_loss);
  EXPECT_NEAR(gpu_step->loss, cpu_step->loss, mc.loss_tolerance * cpu_step->loss);
  EXPECT_NEAR(gpu_step->aux_loss, cpu_step->aux_loss, 0.05 * cpu_step->aux_loss + 1e-3);
  ASSERT_TRUE(cpu.engine->SaveCheckpoint(Dir("cpu1")).ok());
  ASSERT_TRUE(gpu->SaveCheckpoint(Dir("gpu1")).ok());

  // Both engines start from the same weights.
  const Params c0 = ReadParams(c, Dir("cpu0")), g0 = ReadParams(c, Dir("gpu0"));
  const Params c1 = ReadParams(c, Dir("cpu1")), g1 = ReadParams(c, Dir("gpu1"));
  for (size_t i = 0; i < c0.experts.size(); ++i) ASSERT_NEAR(c0.experts[i], g0.experts[i], 1e-6f);
  for (size_t i = 0; i < c0.replicated.size(); ++i) {
    ASSERT_NEAR(c0.replicated[i], g0.replicated[i], 1e-6f);
  }

  // Gradients, tensor by tensor (router, shared experts, routed experts w1 and w2, per layer).
  const std::vector<double> rep_cpu = RecoverGradient(c0.replicated, c1.replicated, 1.0);
  const std::vector<double> rep_gpu = RecoverGradient(g0.replicated, g1.replicated, 1.0);
  const std::vector<double> exp_cpu = RecoverGradient(c0.experts, c1.experts, 1.0);
  const std::vector<double> exp_gpu = RecoverGradient(g0.experts, g1.experts, 1.0);
  const int64_t H = c.model.hidden, F = c.model.ffn, E = c.model.experts;
  const int64_t S = c.model.shared_experts, L = c.model.layers;
  const size_t rep_layer = rep_cpu.size() / L, exp_layer = exp_cpu.size() / L;
  for (int64_t l = 0; l < L; ++l) {
    const size_t r0 = l * rep_layer, e0 = l * exp_layer;
    const size_t router_end = r0 + H * E, shared_end = r0 + rep_layer;
    const size_t w1_end = e0 + E * H * 2 * F, w2_end = e0 + exp_layer;
    const double router = RelativeError(rep_gpu, rep_cpu, r0, router_end);
    const double shared = S > 0 ? RelativeError(rep_gpu, rep_cpu, router_end, shared_end) : 0;
    const double w1 = RelativeError(exp_gpu, exp_cpu, e0, w1_end);
    const double w2 = RelativeError(exp_gpu, exp_cpu, w1_end, w2_end);
    std::printf("%s layer %ld: gradient relative error router %.4f shared %.4f w1 %.4f w2 %.4f\n",
                mc.name, static_cast<long>(l), router, shared, w1, w2);
    EXPECT_LT(router, mc.gradient_tolerance) << "layer " << l << " router";
    EXPECT_LT(shared, mc.gradient_tolerance) << "layer " << l << " shared experts";
    EXPECT_LT(w1, mc.gradient_tolerance) << "layer " << l << " experts w1";
    EXPECT_LT(w2, mc.gradient_tolerance) << "layer " << l << " experts w2";
  }
}

// Tolerances: bf16 operands and a bf16 residual stream give ~1% relative gradient error on these
// shapes (measured on an H200: 0.7-1.3%); MXFP8 (e4m3, 3 mantissa bits, every expert operand
// quantized, the gradients too) 5-21% against the fp32 reference (measured: 5-14% for the experts,
// up to 21% for a router, whose gradient sums the quantized expert outputs). The fp8-block
// precisions quantize the same operands to e4m3 (hidden 256, ffn 128) and get MXFP8's bounds.
INSTANTIATE_TEST_SUITE_P(
    Precisions, CudaMatchesCpu,
    ::testing::Values(
        MatchCase{"bf16_softmax", Precision::kBf16, RouterKind::kSoftmax, 0.02, 0.05},
        MatchCase{"bf16_sigmoid", Precision::kBf16, RouterKind::kSigmoid, 0.02, 0.05},
        // The routed experts' AdamW in their weight-gradient GEMM's epilogue.
        MatchCase{"bf16_fused_adamw", Precision::kBf16, RouterKind::kSoftmax, 0.02, 0.05, "1"},
        // The weight gradients beside the data gradients (two passes, fused).
        MatchCase{"bf16_side_by_side", Precision::kBf16, RouterKind::kSoftmax, 0.02, 0.05, "0", "1",
                  "0"},
        MatchCase{"bf16_fused_adamw_side_by_side", Precision::kBf16, RouterKind::kSoftmax, 0.02,
                  0.05, "1", "1", "0"},
        // The routed experts' weight gradient stored in bf16 between the two passes: its one
        // rounding moves g by at most 2^-9 relative, far inside the bf16 bounds.
        MatchCase{"bf16_expert_grad", Precision::kBf16, RouterKind::kSoftmax, 0.02, 0.05, "0", "1",
                  "1", "1"},
        MatchCase{"fp8_block_side_by_side", Precision::kFp8Block, RouterKind::kSigmoid, 0.05, 0.3,
                  "0", "1", "0"},
        MatchCase{"mxfp8_softmax", Precision::kMxfp8, RouterKind::kSoftmax, 0.05, 0.3},
        // The per-32 promotion kernels instead of the bf16-core ones.
        MatchCase{"mxfp8_promotion", Precision::kMxfp8, RouterKind::kSoftmax, 0.05, 0.3, "0", "0"},
        MatchCase{"fp8_block", Precision::kFp8Block, RouterKind::kSigmoid, 0.05, 0.3},
        MatchCase{"fp8_block_wgrad128", Precision::kFp8BlockWgrad128, RouterKind::kSigmoid, 0.05,
                  0.3},
        // Four shared experts: the residual sums take more terms than SumBf16 has instances for.
        MatchCase{"bf16_four_shared_experts", Precision::kBf16, RouterKind::kSoftmax, 0.02, 0.05,
                  "0", "1", "1", "0", 4}),
    [](const ::testing::TestParamInfo<MatchCase>& info) { return std::string(info.param.name); });

// Device memory the engine allocates for `c` with DROPLESS_FUSED_EXPERT_ADAMW and
// DROPLESS_BF16_EXPERT_GRAD set as given, after one step.
int64_t EngineBytes(const EngineConfig& c, const char* fused_expert_adamw,
                    const char* bf16_expert_grad) {
  setenv("DROPLESS_FUSED_EXPERT_ADAMW", fused_expert_adamw, 1);
  setenv("DROPLESS_BF16_EXPERT_GRAD", bf16_expert_grad, 1);
  absl::StatusOr<std::unique_ptr<cuda_engine::CudaEngine>> e =
      cuda_engine::CreateCudaEngine(c, 0, 1, nullptr);
  unsetenv("DROPLESS_FUSED_EXPERT_ADAMW");
  unsetenv("DROPLESS_BF16_EXPERT_GRAD");
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return -1;
  absl::StatusOr<StepStats> step = (*e)->Step();
  EXPECT_TRUE(step.ok()) << step.status();
  return (*e)->LastStepDetails().engine_bytes;
}

// The fused update keeps each tile's gradient in registers: the engine allocates no gradient for
// the routed experts, exactly 4 bytes per routed-expert parameter less than the two passes.
TEST_F(CudaEngineGpu, FusedExpertUpdateAllocatesNoRoutedExpertGradient) {
  const EngineConfig c = SmallConfig();
  const int64_t two_passes = EngineBytes(c, "0", "0"), fused = EngineBytes(c, "1", "0");
  const cpu::MoeParameterLayout layout(c.model, 1, 0, c.tokens_per_rank);
  std::printf("engine bytes: two passes %lld, fused %lld\n", static_cast<long long>(two_passes),
              static_cast<long long>(fused));
  EXPECT_EQ(two_passes - fused, layout.experts_size() * static_cast<int64_t>(sizeof(float)));
}

// DROPLESS_BF16_EXPERT_GRAD=1: the two passes keep the routed experts' gradient in bf16, 2 bytes
// per routed-expert parameter less than in fp32.
TEST_F(CudaEngineGpu, Bf16ExpertGradientHalvesTheRoutedExpertGradient) {
  const EngineConfig c = SmallConfig();
  const int64_t fp32 = EngineBytes(c, "0", "0"), bf16 = EngineBytes(c, "0", "1");
  const cpu::MoeParameterLayout layout(c.model, 1, 0, c.tokens_per_rank);
  std::printf("engine bytes: fp32 routed-expert gradient %lld, bf16 %lld\n",
              static_cast<long long>(fp32), static_cast<long long>(bf16));
  EXPECT_EQ(fp32 - bf16, layout.experts_size() * static_cast<int64_t>(sizeof(kernels::Bf16)));
}

class CudaEngineMomentsGpu : public CudaEngineGpu,
                             public ::testing::WithParamInterface<MomentDtype> {};

// 30 steps straight, and 15 steps, a checkpoint in `dir`, the engine "killed" and a new one
// resumed from the checkpoint for 15 more: the resumed curve must continue the straight one.
void ExpectResumedRunContinuesTheLossCurve(EngineConfig c, const std::string& dir) {
  std::vector<double> straight;
  {
    std::unique_ptr<Engine> e = MakeCuda(c);
    ASSERT_TRUE(e);
    straight = Losses(e.get(), 30);
  }
  c.checkpoint.dir = dir;
  std::vector<double> first, second;
  {
    std::unique_ptr<Engine> e = MakeCuda(c);
    ASSERT_TRUE(e);
    first = Losses(e.get(), 15);
    ASSERT_TRUE(e->SaveCheckpoint(c.checkpoint.dir).ok());
  }  // the "killed" run
  {
    std::unique_ptr<Engine> e = MakeCuda(c);
    ASSERT_TRUE(e);
    ASSERT_EQ(e->StepsDone(), 15);
    second = Losses(e.get(), 15);
  }
  ASSERT_EQ(straight.size(), 30u);
  ASSERT_EQ(second.size(), 15u);
  for (int i = 0; i < 15; ++i) {
    // Routing statistics use fp32 atomics (order unspecified): equal to a few ulps, not bits.
    EXPECT_NEAR(first[i], straight[i], 1e-4 * straight[i]) << "step " << i + 1;
    EXPECT_NEAR(second[i], straight[15 + i], 1e-3 * straight[15 + i]) << "step " << 16 + i;
  }
}

TEST_P(CudaEngineMomentsGpu, ResumedRunContinuesTheLossCurve) {
  EngineConfig c = LearningConfig(Precision::kBf16);
  c.optimizer.moment_dtype = GetParam();
  const std::string dir = Dir("resume");
  ExpectResumedRunContinuesTheLossCurve(c, dir);
  if (HasFatalFailure()) return;
  // The checkpoint's moments (fp32 in the file) are the engine's: bf16 values with bf16 moments.
  const cpu::MoeParameterLayout layout(c.model, 1, 0, c.tokens_per_rank);
  std::vector<float> rp(layout.replicated_size()), rm(rp.size()), rv(rp.size());
  std::vector<float> ep(layout.experts_size()), em(ep.size()), ev(ep.size());
  absl::StatusOr<int64_t> step =
      engine::ReadMoeCheckpoint(dir, engine::MoeCheckpointIdentityOf(c, 0), layout,
                                {absl::MakeSpan(rp), absl::MakeSpan(rm), absl::MakeSpan(rv)},
                                {absl::MakeSpan(ep), absl::MakeSpan(em), absl::MakeSpan(ev)});
  ASSERT_TRUE(step.ok()) << step.status();
  int64_t not_bf16 = 0, nonzero = 0;
  for (const std::vector<float>* moments : {&rm, &rv, &em, &ev}) {
    for (float x : *moments) {
      nonzero += x != 0.0f;
      not_bf16 += kernels::Bf16ToFloat(kernels::FloatToBf16(x)) != x;
    }
  }
  EXPECT_GT(nonzero, 0);
  if (GetParam() == MomentDtype::kBf16) {
    EXPECT_EQ(not_bf16, 0);
  } else {
    EXPECT_GT(not_bf16, 0);  // fp32 moments use their low bits
  }
}

// The quantized precisions resume too: their quantized weights are made again from the restored
// masters, as the update made them.
TEST_F(CudaEngineGpu, ResumedRunContinuesTheLossCurveInTheQuantizedPrecisions) {
  for (Precision p : {Precision::kMxfp8, Precision::kFp8Block, Precision::kFp8BlockWgrad128}) {
    SCOPED_TRACE(std::string(ToString(p)));
    ExpectResumedRunContinuesTheLossCurve(LearningConfig(p),
                                          Dir("resume-" + std::string(ToString(p))));
  }
}

INSTANTIATE_TEST_SUITE_P(MomentDtypes, CudaEngineMomentsGpu,
                         ::testing::Values(MomentDtype::kFp32, MomentDtype::kBf16),
                         [](const ::testing::TestParamInfo<MomentDtype>& info) {
                           return info.param == MomentDtype::kBf16 ? "bf16_moments"
                                                                   : "fp32_moments";
                         });

// bf16 moments updated by the weight-gradient GEMM (DROPLESS_FUSED_EXPERT_ADAMW=1; the engine
// fuses the update by itself with fp32 moments only) take the AdamW pass's steps: losses equal to
// the routing statistics' ulps, and the checkpoint's expert moments are bf16 values, every one of
// them rounded from the same fp32 moment as the pass's (equal, or one bf16 step apart where the
// gradients' last bits flipped a draw).
TEST_F(CudaEngineGpu, Bf16MomentsFusedIntoTheWeightGradientAsThePassUpdatesThem) {
  EngineConfig c = SmallConfig();
  c.optimizer.moment_dtype = MomentDtype::kBf16;
  setenv("DROPLESS_FUSED_EXPERT_ADAMW", "1", 1);
  ASSERT_TRUE(cuda_engine::FusesExpertUpdate(c));
  unsetenv("DROPLESS_FUSED_EXPERT_ADAMW");
  EXPECT_FALSE(cuda_engine::FusesExpertUpdate(c));
  std::vector<double> losses[2];
  const cpu::MoeParameterLayout layout(c.model, 1, 0, c.tokens_per_rank);
  std::vector<float> em[2], ev[2];
  for (int fused = 0; fused < 2; ++fused) {
    setenv("DROPLESS_FUSED_EXPERT_ADAMW", fused ? "1" : "0", 1);
    std::unique_ptr<Engine> e = MakeCuda(c);
    unsetenv("DROPLESS_FUSED_EXPERT_ADAMW");
    ASSERT_TRUE(e);
    losses[fused] = Losses(e.get(), 10);
    const std::string dir = Dir(fused ? "fused" : "pass");
    ASSERT_TRUE(e->SaveCheckpoint(dir).ok());
    std::vector<float> rp(layout.replicated_size()), rm(rp.size()), rv(rp.size());
    std::vector<float> ep(layout.experts_size());
    em[fused].resize(ep.size());
    ev[fused].resize(ep.size());
    absl::StatusOr<int64_t> step = engine::ReadMoeCheckpoint(
        dir, engine::MoeCheckpointIdentityOf(c, 0), layout,
        {absl::MakeSpan(rp), absl::MakeSpan(rm), absl::MakeSpan(rv)},
        {absl::MakeSpan(ep), absl::MakeSpan(em[fused]), absl::MakeSpan(ev[fused])});
    ASSERT_TRUE(step.ok()) << step.status();
  }
  ASSERT_EQ(losses[0].size(), 10u);
  ASSERT_EQ(losses[1].size(), 10u);
  for (int i = 0; i < 10; ++i) {
    EXPECT_NEAR(losses[1][i], losses[0][i], 1e-4 * losses[0][i]) << "step " << i + 1;
  }
  int64_t not_bf16 = 0, nonzero = 0, apart = 0;
  for (int w = 0; w < 2; ++w) {
    const std::vector<float>& pass = w == 0 ? em[0] : ev[0];
    const std::vector<float>& fused = w == 0 ? em[1] : ev[1];
    for (size_t i = 0; i < fused.size(); ++i) {
      nonzero += fused[i] != 0.0f;
      not_bf16 += kernels::Bf16ToFloat(kernels::FloatToBf16(fused[i])) != fused[i];
      // One bf16 step: at most 2^-7 of the larger value.
      const float larger = std::max(std::fabs(fused[i]), std::fabs(pass[i]));
      apart += std::fabs(fused[i] - pass[i]) > std::ldexp(larger, -7);
    }
  }
  EXPECT_GT(nonzero, 0);
  EXPECT_EQ(not_bf16, 0);
  EXPECT_EQ(apart, 0) << "of " << 2 * em[0].size() << " expert moments";
}

TEST_F(CudaEngineGpu, CpuCheckpointResumesOnTheCudaEngine) {
  EngineConfig c = SmallConfig();
  c.checkpoint.dir = Dir("shared");
  Engines cpu = MakeCpu(c);
  ASSERT_TRUE(cpu.engine);
  Losses(cpu.engine.get(), 5);
  ASSERT_TRUE(cpu.engine->SaveCheckpoint(c.checkpoint.dir).ok());
  const std::vector<double> cpu_next = Losses(cpu.engine.get(), 1);
  std::unique_ptr<Engine> gpu = MakeCuda(c);
  ASSERT_TRUE(gpu);
  EXPECT_EQ(gpu->StepsDone(), 5);
  const std::vector<double> gpu_next = Losses(gpu.get(), 1);
  ASSERT_EQ(cpu_next.size(), 1u);
  ASSERT_EQ(gpu_next.size(), 1u);
  std::printf("step 6 after a cpu checkpoint: cpu %.6f cuda %.6f\n", cpu_next[0], gpu_next[0]);
  EXPECT_NEAR(gpu_next[0], cpu_next[0], 0.02 * cpu_next[0]);
}

TEST_F(CudaEngineGpu, GraphReplayMatchesEagerSteps) {
  const EngineConfig c = LearningConfig(Precision::kBf16);
  std::vector<double> graph, eager;
  {
    std::unique_ptr<Engine> e = MakeCuda(c);
    ASSERT_TRUE(e);
    graph = Losses(e.get(), 5);
  }
  setenv("DROPLESS_CUDA_GRAPH", "0", 1);
  {
    std::unique_ptr<Engine> e = MakeCuda(c);
    ASSERT_TRUE(e);
    eager = Losses(e.get(), 5);
  }
  unsetenv("DROPLESS_CUDA_GRAPH");
  ASSERT_EQ(graph.size(), 5u);
  ASSERT_EQ(eager.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(graph[i], eager[i], 1e-4 * eager[i]) << "step " << i + 1;
}

TEST_F(CudaEngineGpu, StepStatisticsAreFilled) {
  std::unique_ptr<Engine> e = MakeCuda(LearningConfig(Precision::kBf16));
  ASSERT_TRUE(e);
  absl::StatusOr<StepStats> s = e->Step();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GT(s->step_seconds, 0);
  EXPECT_GT(s->gemm_forward_seconds, 0);
  EXPECT_GT(s->gemm_dgrad_seconds, 0);
  EXPECT_GT(s->gemm_wgrad_seconds, 0);
  EXPECT_GT(s->dispatch_seconds, 0);
  EXPECT_GT(s->combine_seconds, 0);
  EXPECT_GT(s->device_memory_bytes, 0);
  EXPECT_GE(s->load_imbalance, 1.0);
  EXPECT_EQ(s->tokens, 1024);
  EXPECT_GT(s->flops, 0);
}

// A job that needs more device memory than the whole GPU holds is the job's property on a GPU of
// this size, not a node problem: the engine says so (the rank exits kRankExitDeviceTooSmall, and
// the coordinator places the job on larger GPUs only, or fails it when there are none) and names
// what to change. 2^20 tokens (the spec's limit) at top-8 over H = 8192, F = 4096 need hundreds
// of GiB of activations.
TEST_F(CudaEngineGpu, AJobLargerThanTheDeviceSaysTheDeviceIsTooSmall) {
  EngineConfig c = SmallConfig();
  c.model.hidden = 8192;
  c.model.ffn = 4096;
  c.model.topk = 8;
  c.tokens_per_rank = int64_t{1} << 20;
  absl::StatusOr<std::unique_ptr<cuda_engine::CudaEngine>> e =
      cuda_engine::CreateCudaEngine(c, 0, 1, nullptr);
  ASSERT_FALSE(e.ok());
  std::printf("%s\n", std::string(e.status().message()).c_str());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted) << e.status();
  EXPECT_TRUE(IsDeviceTooSmall(e.status())) << e.status();
  EXPECT_FALSE(IsJobError(e.status())) << e.status();
  EXPECT_EQ(RankExitCodeFor(e.status()), kRankExitDeviceTooSmall);
  EXPECT_NE(e.status().message().find("tokens_per_rank"), absl::string_view::npos) << e.status();
  // The device is usable again: a small engine still runs.
  std::unique_ptr<Engine> small = MakeCuda(SmallConfig());
  ASSERT_TRUE(small);
  EXPECT_TRUE(small->Step().ok());
}

}  // namespace
}  // namespace dropless
