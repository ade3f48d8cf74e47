// What the engine's narrower choices cost in learning the synthetic task, 500 steps from the same
// seeds: the quantized precisions against bf16, and where a gap in the end loss comes from (the
// trained weights evaluated in both precisions); bf16 AdamW moments against fp32 ones; the routed
// experts' gradient stored in bf16 against fp32.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gpu/engine/local_ep_test_support.h"
#include "tests/gpu/kernels/gpu_test_util.h"
#include "worker/engine/cuda/cuda_engine.h"

namespace dropless {
namespace {

using kernels::testing::GpuTest;
using local_ep_testing::LearningConfig;
using local_ep_testing::Losses;
using local_ep_testing::Make;

class PrecisionLossGpu : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    dir_ =
        std::filesystem::temp_directory_path() / absl::StrCat("dropless-precision-loss-", getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string Dir(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;
};

double Mean(const std::vector<double>& v, size_t first) {
  double s = 0;
  for (size_t i = first; i < v.size(); ++i) s += v[i];
  return s / static_cast<double>(v.size() - first);
}

// The loss of the weights checkpointed in `dir` evaluated in `precision`: the mean over the 10
// batches after the checkpoint's step, with a learning rate of 1e-9 (each step's loss is computed
// before its update, and the updates leave the weights where they were to about 1e-9).
double EvaluatedLoss(EngineConfig config, Precision precision, const std::string& dir) {
  config.precision = precision;
  config.checkpoint.dir = dir;
  config.steps = 1000;
  config.optimizer.lr = 1e-9;
  config.optimizer.warmup_steps = 0;
  std::unique_ptr<cuda_engine::CudaEngine> e = Make(config);
  if (e == nullptr) return NAN;
  EXPECT_EQ(e->StepsDone(), 500) << "the checkpoint in " << dir;
  const std::vector<double> losses = Losses(e.get(), 10);
  return losses.size() == 10 ? Mean(losses, 0) : NAN;
}

// The last-20 mean of 500 steps of `config` (NAN if the engine could not run them), printed with
// `what`; the loss must have halved.
double EndLoss(const EngineConfig& config, const std::string& what) {
  std::unique_ptr<cuda_engine::CudaEngine> e = Make(config);
  if (e == nullptr) return NAN;
  const std::vector<double> losses = Losses(e.get(), 500);
  if (losses.size() != 500u) {
    ADD_FAILURE() << what << ": " << losses.size() << " of 500 steps";
    return NAN;
  }
  const double end = Mean(losses, 480);
  std::printf("500 steps, %s: %.5f -> last-20 mean %.5f\n", what.c_str(), losses.front(), end);
  EXPECT_LT(end, 0.5 * losses.front()) << what;
  return end;
}

// Mean and standard error of the per-seed ratios a[i] / b[i] - 1.
struct RatioSummary {
  double mean = 0, se = 0;
};
RatioSummary Ratios(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n = a.size();
  RatioSummary r;
  for (size_t i = 0; i < n; ++i) r.mean += (a[i] / b[i] - 1.0) / n;
  double square = 0;
  for (size_t i = 0; i < n; ++i) square += std::pow(a[i] / b[i] - 1.0 - r.mean, 2);
  r.se = std::sqrt(square / (n - 1) / n);
  return r;
}

// The quantized precisions learn the synthetic task as bf16 does: the issues' goal is 500 steps
// ending within 1% of bf16's loss (issue 15 for mxfp8, issue 17 for the fp8-block precisions).
// The end loss is the mean of the last 20 steps, averaged over 24 data seeds: one seed's end loss
// moves by up to 6% between precisions (three seeds read anything from 0.3% below to 2.8% above
// as the code changed). Measured on an H100 (2026-12-06, loss-h100-20261206-bf16-teacher.json):
// mxfp8 +0.78%, fp8-block +0.56%, fp8-block-wgrad128 +0.63% (standard errors of the per-seed
// ratios 0.36-0.44%). Then each trained model is evaluated on the 10 batches after training in
// its own precision and in bf16, which splits the gap: its weights in bf16 are as good as bf16's
// (-0.32%, -0.04%, -0.07%, within their standard errors) and its forward's quantization costs
// +0.72-0.74% (standard error 0.03%): training in the precision costs nothing measurable. Before
// the teacher computed in bf16 in every precision (RankModel::teacher_layer), each precision
// fitted a quantized teacher of its own and ended 1.2-1.5% above bf16. Ending far below bf16
// would mean the quantized step computes another function: with the OCP spec's floor scale
// (mxfp8.h), MXFP8 saturated the top elements of the blocks whose amax significand is above 1.75
// (about one in four) and ended 3.5% below bf16 (three seeds; 1.3% below at step 1).
TEST_F(PrecisionLossGpu, LearnsIn500StepsInEveryPrecisionNearBf16) {
  std::vector<uint64_t> seeds;
  for (uint64_t seed = 5; seed < 5 + 24; ++seed) seeds.push_back(seed);
  const std::vector<Precision> precisions = {Precision::kBf16, Precision::kMxfp8,
                                             Precision::kFp8Block, Precision::kFp8BlockWgrad128};
  const size_t P = precisions.size();
  // Per precision, per seed: the last-20 mean of training; the trained weights' loss evaluated
  // in their own precision and in bf16 (after the 500 steps, on the same 10 batches).
  std::vector<std::vector<double>> end(P), own(P), in_bf16(P);
  for (uint64_t seed : seeds) {
    for (size_t p = 0; p < P; ++p) {
      const std::string name(ToString(precisions[p]));
      SCOPED_TRACE(name + " seed " + std::to_string(seed));
      EngineConfig config = LearningConfig(precisions[p]);
      config.data.seed = seed;
      std::unique_ptr<cuda_engine::CudaEngine> e = Make(config);
      ASSERT_TRUE(e);
      const std::vector<double> losses = Losses(e.get(), 500);
      ASSERT_EQ(losses.size(), 500u);
      const std::string dir = Dir(absl::StrCat(name, "-", seed));
      ASSERT_TRUE(e->SaveCheckpoint(dir).ok());
      e.reset();
      end[p].push_back(Mean(losses, 480));
      own[p].push_back(EvaluatedLoss(config, precisions[p], dir));
      in_bf16[p].push_back(p == 0 ? own[p].back() : EvaluatedLoss(config, Precision::kBf16, dir));
      std::filesystem::remove_all(dir);
      std::printf(
          "500 steps, seed %llu: %-18s loss %.5f -> %.5f (last-20 mean %.5f); trained "
          "weights on the next 10 batches: %.5f, in bf16 %.5f\n",
          static_cast<unsigned long long>(seed), name.c_str(), losses.front(), losses.back(),
          end[p].back(), own[p].back(), in_bf16[p].back());
      EXPECT_LT(end[p].back(), 0.5 * losses.front());
      EXPECT_LT(own[p].back(), 0.5 * losses.front()) << "the checkpoint did not load";
    }
  }
  std::vector<double> mean_end(P, 0.0);
  for (size_t p = 0; p < P; ++p) mean_end[p] = Mean(end[p], 0);
  for (size_t p = 1; p < P; ++p) {
    const std::string name(ToString(precisions[p]));
    // The per-seed ratios' spread, so that a reader can tell a miss from noise.
    const RatioSummary training = Ratios(end[p], end[0]);
    const RatioSummary evaluated = Ratios(own[p], own[0]);
    const RatioSummary weights = Ratios(in_bf16[p], own[0]);
    const RatioSummary forward = Ratios(own[p], in_bf16[p]);
    std::printf(
        "500 steps over %zu seeds: bf16 %.5f, %s %.5f (%+.2f%%; per-seed ratios %+.2f%% +- "
        "%.2f%%; the issues' goal is within 1%%). Evaluated after training: %+.2f%% +- %.2f%% = "
        "its weights in bf16 %+.2f%% +- %.2f%% (what training in %s cost) and its forward's "
        "quantization %+.2f%% +- %.2f%%\n",
        seeds.size(), mean_end[0], name.c_str(), mean_end[p],
        100.0 * (mean_end[p] / mean_end[0] - 1.0), 100.0 * training.mean, 100.0 * training.se,
        100.0 * evaluated.mean, 100.0 * evaluated.se, 100.0 * weights.mean, 100.0 * weights.se,
        name.c_str(), 100.0 * forward.mean, 100.0 * forward.se);
    EXPECT_LE(mean_end[p], 1.01 * mean_end[0]) << name << ": the issues' goal";
    EXPECT_GE(mean_end[p], 0.99 * mean_end[0]) << name;
    EXPECT_LT(forward.mean, 0.01) << name << ": the forward's quantization alone";
    EXPECT_LT(weights.mean, 0.01) << name << ": the trained weights evaluated in bf16";
  }
}

// bf16 AdamW moments learn as fp32 ones do: over eight data seeds, 500 steps end no more than 1%
// above fp32 moments' loss, and no more than 3% below, in the AdamW pass. The update fused into the
// weight gradient is the pass's arithmetic with either width: its runs end within 1e-4 (fp32
// moments; the routing statistics' fp32 atomics leave a few ulps between runs) and 1e-3 (bf16,
// where such an ulp may flip a rounding draw) of the pass's. Measured on an H200: bf16 moments
// end 0.94% below fp32 moments (per seed -2.2% .. +0.2%; the mean's standard error about 0.3%),
// so the lower bound is loose: that the rounding keeps the moments unbiased is adamw_test's
// Bf16SecondMomentsDecayAsFp32OnesDo's job (rounding to nearest froze v at beta2 = 0.999 and ended
// 1.7% below here).
TEST_F(PrecisionLossGpu, Bf16MomentsLearnAsFp32MomentsDo) {
  // fp32 pass, bf16 pass, fp32 fused, bf16 fused
  const char* names[4] = {"fp32 moments", "bf16 moments", "fp32 moments, fused",
                          "bf16 moments, fused"};
  double end[4] = {0, 0, 0, 0};
  const std::vector<uint64_t> seeds = {5, 6, 7, 8, 9, 10, 11, 12};
  for (uint64_t seed : seeds) {
    for (int run = 0; run < 4; ++run) {
      EngineConfig config = LearningConfig(Precision::kBf16);
      config.data.seed = seed;
      config.optimizer.moment_dtype = run % 2 == 1 ? MomentDtype::kBf16 : MomentDtype::kFp32;
      setenv("DROPLESS_FUSED_EXPERT_ADAMW", run >= 2 ? "1" : "0", 1);
      const double tail = EndLoss(config, absl::StrCat("seed ", seed, ", ", names[run]));
      unsetenv("DROPLESS_FUSED_EXPERT_ADAMW");
      end[run] += tail / seeds.size();
    }
  }
  std::printf("500 steps over %zu seeds: fp32 moments %.5f", seeds.size(), end[0]);
  for (int run = 1; run < 4; ++run) {
    std::printf(", %s %.5f (%+.2f%%)", names[run], end[run], 100.0 * (end[run] / end[0] - 1.0));
  }
  std::printf("\n");
  EXPECT_LE(end[1], 1.01 * end[0]);
  EXPECT_GE(end[1], 0.97 * end[0]);
  EXPECT_NEAR(end[2], end[0], 1e-4 * end[0]);
  EXPECT_NEAR(end[3], end[1], 1e-3 * end[1]);
}

// The routed experts' gradient stored in bf16 between the two passes (DROPLESS_BF16_EXPERT_GRAD=1,
// the weight-gradient GEMM rounding its fp32 accumulator once, as torch's autograd does for bf16
// weights) learns as the fp32 gradient does: over eight data seeds, 500 steps end within 1% of
// the fp32 gradient's loss.
TEST_F(PrecisionLossGpu, Bf16ExpertGradientLearnsAsFp32GradientDoes) {
  const char* names[2] = {"fp32 routed-expert gradient", "bf16 routed-expert gradient"};
  double end[2] = {0, 0};
  const std::vector<uint64_t> seeds = {5, 6, 7, 8, 9, 10, 11, 12};
  for (uint64_t seed : seeds) {
    for (int run = 0; run < 2; ++run) {
      EngineConfig config = LearningConfig(Precision::kBf16);
      config.data.seed = seed;
      setenv("DROPLESS_FUSED_EXPERT_ADAMW", "0", 1);
      setenv("DROPLESS_BF16_EXPERT_GRAD", run == 1 ? "1" : "0", 1);
      EXPECT_EQ(cuda_engine::StoresBf16ExpertGradient(config), run == 1);
      const double tail = EndLoss(config, absl::StrCat("seed ", seed, ", ", names[run]));
      unsetenv("DROPLESS_FUSED_EXPERT_ADAMW");
      unsetenv("DROPLESS_BF16_EXPERT_GRAD");
      end[run] += tail / seeds.size();
    }
  }
  std::printf("500 steps over %zu seeds: %s %.5f, %s %.5f (%+.2f%%)\n", seeds.size(), names[0],
              end[0], names[1], end[1], 100.0 * (end[1] / end[0] - 1.0));
  EXPECT_LE(end[1], 1.01 * end[0]);
  EXPECT_GE(end[1], 0.99 * end[0]);
}

}  // namespace
}  // namespace dropless
