// Permute / unpermute references against fp64 formulations.
#include "dropless/kernels/permute.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "dropless/kernels/dispatch_plan.h"
#include "tests/unit/kernels/test_data.h"

namespace dropless::kernels {
namespace {

using testing::Bf16UlpDiff;
using testing::RandomBf16;
using testing::RandomFloat;
using testing::Rng;

struct Routed {
  std::vector<int32_t> slot_of;
  std::vector<float> weights;
};

// A random permutation of the T*k slots (what any dispatch plan produces).
Routed RandomRouting(int64_t tokens, int top_k) {
  Routed r;
  r.slot_of.resize(tokens * top_k);
  std::iota(r.slot_of.begin(), r.slot_of.end(), 0);
  std::shuffle(r.slot_of.begin(), r.slot_of.end(), Rng());
  r.weights = RandomFloat(tokens * top_k);
  return r;
}

TEST(Permute, ForwardCopiesAndCombineSums) {
  const PermuteShape shape{67, 40, 3};
  const Routed r = RandomRouting(shape.num_tokens, shape.top_k);
  const std::vector<Bf16> x = RandomBf16(shape.num_tokens * shape.hidden);
  std::vector<Bf16> rows(shape.num_tokens * shape.top_k * shape.hidden, Bf16{0xFFFF});
  ASSERT_TRUE(cpu::Permute(shape, x.data(), r.slot_of.data(), rows.data()).ok());
  for (int64_t t = 0; t < shape.num_tokens; ++t) {
    for (int j = 0; j < shape.top_k; ++j) {
      const int64_t s = r.slot_of[t * shape.top_k + j];
      for (int64_t h = 0; h < shape.hidden; ++h) {
        ASSERT_EQ(rows[s * shape.hidden + h].bits, x[t * shape.hidden + h].bits);
      }
    }
  }
  // Combine of arbitrary expert outputs: one bf16 rounding (half an ulp) of an fp32 sum whose own
  // error is below k * 2^-24 * sum |terms|.
  const std::vector<Bf16> expert_out = RandomBf16(rows.size());
  std::vector<Bf16> y(x.size(), Bf16{0xFFFF}), dx(x.size(), Bf16{0xFFFF});
  ASSERT_TRUE(cpu::UnpermuteCombine(shape, expert_out.data(), r.slot_of.data(), r.weights.data(),
                                    y.data()).ok());
  ASSERT_TRUE(cpu::PermuteBackward(shape, expert_out.data(), r.slot_of.data(), dx.data()).ok());
  auto within = [&](Bf16 got, double want, double magnitude) {
    int e;
    std::frexp(want, &e);
    const double half_ulp = want == 0 ? 0 : std::ldexp(1.0, e - 9);
    return std::fabs(Bf16ToFloat(got) - want) <=
           half_ulp * 1.0001 + shape.top_k * std::ldexp(magnitude, -24) + 1e-30;
  };
  for (int64_t t = 0; t < shape.num_tokens; ++t) {
    for (int64_t h = 0; h < shape.hidden; ++h) {
      double want = 0, want_sum = 0, magnitude = 0, magnitude_sum = 0;
      for (int j = 0; j < shape.top_k; ++j) {
        const double v = Bf16ToFloat(expert_out[r.slot_of[t * shape.top_k + j] * shape.hidden + h]);
        want += r.weights[t * shape.top_k + j] * v;
        magnitude += std::fabs(r.weights[t * shape.top_k + j] * v);
        want_sum += v;
        magnitude_sum += std::fabs(v);
      }
      EXPECT_TRUE(within(y[t * shape.hidden + h], want, magnitude)) << t << " " << h;
      EXPECT_TRUE(within(dx[t * shape.hidden + h], want_sum, magnitude_sum)) << t << " " << h;
    }
  }
}

TEST(Permute, Mxfp8EqualsQuantizedRows) {
  const PermuteShape shape{29, 96, 4};
  const Routed r = RandomRouting(shape.num_tokens, shape.top_k);
  const std::vector<Bf16> x = testing::RandomBf16WideRange(shape.num_tokens * shape.hidden);
  const int64_t rows = shape.num_tokens * shape.top_k;
  std::vector<uint8_t> data(rows * shape.hidden, 0xAA), scales(rows * shape.hidden / 32, 0xAA);
  ASSERT_TRUE(cpu::PermuteMxfp8(shape, x.data(), r.slot_of.data(), {data.data(), scales.data()}).ok());
  std::vector<Bf16> permuted(rows * shape.hidden);
  ASSERT_TRUE(cpu::Permute(shape, x.data(), r.slot_of.data(), permuted.data()).ok());
  std::vector<uint8_t> want_data(data.size()), want_scales(scales.size());
  MxRowwise want{want_data.data(), want_scales.data()};
  ASSERT_TRUE(cpu::QuantizeMxfp8({rows, shape.hidden, 1}, permuted.data(), nullptr, &want, nullptr).ok());
  EXPECT_EQ(data, want_data);
  EXPECT_EQ(scales, want_scales);
}

TEST(Permute, CombineBackwardMatchesFp64) {
  const PermuteShape shape{31, 64, 5};
  Routed r = RandomRouting(shape.num_tokens, shape.top_k);
  r.slot_of[7] = -1;  // a dropped choice: contributes nothing, gets d_weight 0
  const std::vector<Bf16> d_y = RandomBf16(shape.num_tokens * shape.hidden);
  const std::vector<Bf16> rows = RandomBf16(shape.num_tokens * shape.top_k * shape.hidden);
  std::vector<Bf16> d_rows(rows.size(), Bf16{0xFFFF});
  std::vector<float> d_w(r.weights.size(), NAN);
  ASSERT_TRUE(cpu::UnpermuteCombineBackward(shape, d_y.data(), rows.data(), r.slot_of.data(),
                                            r.weights.data(), d_rows.data(), d_w.data()).ok());
  for (int64_t t = 0; t < shape.num_tokens; ++t) {
    for (int j = 0; j < shape.top_k; ++j) {
      const int64_t c = t * shape.top_k + j;
      const int64_t s = r.slot_of[c];
      if (s < 0) {
        EXPECT_EQ(d_w[c], 0.0f);
        continue;
      }
      double dot = 0;
      for (int64_t h = 0; h < shape.hidden; ++h) {
        const double g = Bf16ToFloat(d_y[t * shape.hidden + h]);
        EXPECT_LE(Bf16UlpDiff(d_rows[s * shape.hidden + h], g * r.weights[c]), 0.51);
        dot += g * Bf16ToFloat(rows[s * shape.hidden + h]);
      }
      EXPECT_NEAR(d_w[c], dot, 1e-6 * (1 + std::fabs(dot)));
    }
  }
}

TEST(Permute, RejectsBadShapes) {
  EXPECT_FALSE(ValidatePermuteShape({4, 12, 2}, false).ok());
  EXPECT_FALSE(ValidatePermuteShape({4, 40, 2}, true).ok());
  EXPECT_FALSE(ValidatePermuteShape({4, 64, 17}, false).ok());
  EXPECT_TRUE(ValidatePermuteShape({4, 64, 16}, true).ok());
}

}  // namespace
}  // namespace dropless::kernels
