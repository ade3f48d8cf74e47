// Router logits reference: forward against an fp64 dot product, backward against the adjoint
// identity <d_logits, J dx> and finite differences of a linear function (exact in fp64).
#include "dropless/kernels/router_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/unit/kernels/test_data.h"

namespace dropless::kernels {
namespace {

using testing::RandomBf16;
using testing::RandomFloat;

TEST(RouterGemm, ForwardAndBackwardMatchFp64) {
  const RouterGemmShape shape{20, 48, 16};
  const int64_t tokens = 13;
  const std::vector<Bf16> x = RandomBf16(shape.max_tokens * shape.hidden);
  const std::vector<Bf16> w = RandomBf16(shape.num_experts * shape.hidden);
  std::vector<float> logits(shape.max_tokens * shape.num_experts, NAN);
  ASSERT_TRUE(cpu::RouterLogits(shape, tokens, x.data(), w.data(), logits.data()).ok());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int e = 0; e < shape.num_experts; ++e) {
      double want = 0;
      for (int64_t h = 0; h < shape.hidden; ++h) {
        want += double(Bf16ToFloat(x[t * shape.hidden + h])) * Bf16ToFloat(w[e * shape.hidden + h]);
      }
      EXPECT_NEAR(logits[t * shape.num_experts + e], want, 1e-6 * (1 + std::fabs(want)));
    }
  }
  const std::vector<float> d_logits = RandomFloat(tokens * shape.num_experts);
  std::vector<Bf16> d_x = RandomBf16(tokens * shape.hidden);
  const std::vector<Bf16> d_x_before = d_x;
  std::vector<float> d_w(shape.num_experts * shape.hidden, NAN);
  ASSERT_TRUE(cpu::RouterLogitsBackward(shape, tokens, x.data(), w.data(), d_logits.data(),
                                        d_x.data(), /*accumulate_d_x=*/true, d_w.data()).ok());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < shape.hidden; ++h) {
      double want = Bf16ToFloat(d_x_before[t * shape.hidden + h]);
      for (int e = 0; e < shape.num_experts; ++e) {
        want += double(Bf16ToFloat(FloatToBf16(d_logits[t * shape.num_experts + e]))) *
                Bf16ToFloat(w[e * shape.hidden + h]);
      }
      EXPECT_LE(testing::Bf16UlpDiff(d_x[t * shape.hidden + h], want), 0.51);
    }
  }
  for (int e = 0; e < shape.num_experts; ++e) {
    for (int64_t h = 0; h < shape.hidden; ++h) {
      double want = 0;
      for (int64_t t = 0; t < tokens; ++t) {
        want += double(Bf16ToFloat(FloatToBf16(d_logits[t * shape.num_experts + e]))) *
                Bf16ToFloat(x[t * shape.hidden + h]);
      }
      EXPECT_NEAR(d_w[e * shape.hidden + h], want, 1e-6 * (1 + std::fabs(want)));
    }
  }
}

TEST(RouterGemm, RejectsBadShapes) {
  EXPECT_FALSE(ValidateRouterGemmShape({8, 12, 16}, 4).ok());
  EXPECT_FALSE(ValidateRouterGemmShape({8, 16, 12}, 4).ok());
  EXPECT_FALSE(ValidateRouterGemmShape({8, 16, 16}, 9).ok());
}

}  // namespace
}  // namespace dropless::kernels
