// overlap: true at EP 2, 4 and 8 on one GPU (every rank in this process, the `local` dispatcher):
// each exchange and the expert GEMMs it feeds run in chunks of the local experts, the exchanges
// on their own stream beside the GEMMs of the chunk before or after. A chunk's GEMMs compute its
// experts' rows with the same kernels, so the steps must be those of the same engine without
// overlap: the losses of 5 steps and the weights after them, in bf16, mxfp8 and fp8-block, and
// at EP 8 with 5 experts per rank (uneven chunks of 2, 1, 1, 1 experts); in bf16 also with the
// routed experts' gradient stored in bf16 between the two passes (DROPLESS_BF16_EXPERT_GRAD).
#include <unistd.h>

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

namespace dropless {
namespace {

using kernels::testing::GpuTest;
using local_ep_testing::Config;
using local_ep_testing::Make;
using local_ep_testing::Params;
using local_ep_testing::ReadGroup;

struct OverlapCase {
  int ep;
  int experts;
  Precision precision;
  // Both engines with the two passes and a bf16 routed-expert gradient (these small shapes would
  // pick the fused update).
  bool bf16_expert_grad = false;
};

class OverlapGpu : public GpuTest, public ::testing::WithParamInterface<OverlapCase> {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("dropless-overlap-", getpid(), "-", GetParam().ep, "-",
                        static_cast<int>(GetParam().precision), "-", GetParam().bf16_expert_grad);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
};

double RelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<double> x(a.begin(), a.end()), y(b.begin(), b.end());
  return local_ep_testing::RelativeError(x, y);
}

TEST_P(OverlapGpu, StepsMatchTheEngineWithoutOverlap) {
  const OverlapCase& p = GetParam();
  EngineConfig c = Config(p.ep);
  c.model.experts = p.experts;
  c.tokens_per_rank = 256;  // tens of rows per expert
  c.precision = p.precision;
  if (IsFp8Block(p.precision)) {
    c.model.hidden = 256;
    c.model.ffn = 128;
  }
  EngineConfig o = c;
  o.overlap = true;
  if (p.bf16_expert_grad) {
    setenv("DROPLESS_FUSED_EXPERT_ADAMW", "0", 1);
    setenv("DROPLESS_BF16_EXPERT_GRAD", "1", 1);
  }
  std::unique_ptr<cuda_engine::CudaEngine> plain = Make(c), overlapped = Make(o);
  if (p.bf16_expert_grad) {
    unsetenv("DROPLESS_FUSED_EXPERT_ADAMW");
    unsetenv("DROPLESS_BF16_EXPERT_GRAD");
  }
  ASSERT_TRUE(plain && overlapped);
  const std::string precision(ToString(p.precision));
  for (int step = 1; step <= 5; ++step) {
    absl::StatusOr<StepStats> a = overlapped->Step();
    absl::StatusOr<StepStats> b = plain->Step();
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    std::printf("ep %d, %d experts, %s, step %d: loss %.9f (no overlap %.9f), aux %.9f (%.9f)\n",
                p.ep, p.experts, precision.c_str(), step, a->loss, b->loss, a->aux_loss,
                b->aux_loss);
    // The same kernels on the same rows; fp64 and fp32 atomics (the squared error, the routing
    // statistics) sum in no fixed order, hence a relative 1e-6.
    EXPECT_NEAR(a->loss, b->loss, 1e-6 * b->loss) << "step " << step;
    EXPECT_NEAR(a->aux_loss, b->aux_loss, 1e-6 * b->aux_loss) << "step " << step;
    EXPECT_EQ(a->tokens, b->tokens);
  }
  ASSERT_TRUE(overlapped->SaveCheckpoint((dir_ / "overlap").string()).ok());
  ASSERT_TRUE(plain->SaveCheckpoint((dir_ / "plain").string()).ok());
  const Params x = ReadGroup(o, (dir_ / "overlap").string());
  const Params y = ReadGroup(c, (dir_ / "plain").string());
  const double experts = RelativeDifference(x.experts, y.experts);
  const double replicated = RelativeDifference(x.replicated, y.replicated);
  std::printf("ep %d, %s: weights after 5 steps, relative difference experts %.2e, "
              "router+shared %.2e\n", p.ep, precision.c_str(), experts, replicated);
  EXPECT_LT(experts, 1e-5);
  EXPECT_LT(replicated, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, OverlapGpu,
    ::testing::Values(OverlapCase{2, 64, Precision::kBf16}, OverlapCase{4, 64, Precision::kBf16},
                      OverlapCase{8, 64, Precision::kBf16}, OverlapCase{8, 40, Precision::kBf16},
                      OverlapCase{4, 64, Precision::kBf16, true},
                      OverlapCase{4, 64, Precision::kMxfp8}, OverlapCase{8, 40, Precision::kMxfp8},
                      OverlapCase{2, 64, Precision::kFp8Block},
                      OverlapCase{8, 40, Precision::kFp8Block},
                      OverlapCase{4, 64, Precision::kFp8BlockWgrad128}),
    [](const ::testing::TestParamInfo<OverlapCase>& info) {
      std::string precision(ToString(info.param.precision));
      for (char& ch : precision) ch = ch == '-' ? '_' : ch;
      return absl::StrCat("ep", info.param.ep, "_experts", info.param.experts, "_", precision,
                          info.param.bf16_expert_grad ? "_bf16_expert_grad" : "");
    });

}  // namespace
}  // namespace dropless
