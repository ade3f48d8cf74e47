// AdamW against values worked out by hand and against a plain fp64 loop of the formula; bf16
// moments (optimizer.moment_dtype) against the fp32 update followed by an independent rounding.
#include "worker/engine/cpu/adamw.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "dropless/kernels/adamw.h"
#include "dropless/kernels/types.h"
#include "gtest/gtest.h"

namespace dropless::cpu {
namespace {

OptimizerSpec HandSpec() {
  OptimizerSpec o;
  o.lr = 0.1;
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  o.eps = 1e-8;
  o.weight_decay = 0.01;
  o.warmup_steps = 0;
  return o;
}

TEST(AdamWTest, MatchesHandComputedSteps) {
  // p0 = 1, gradients 0.5, -0.25, 0.125.
  // t=1: m = 0.1*0.5 = 0.05, v = 0.001*0.25 = 2.5e-4; m^ = 0.5, v^ = 0.25;
  //      p = 1*(1 - 0.1*0.01) - 0.1 * 0.5/(0.5 + 1e-8) = 0.999 - 0.099999998 = 0.899000002.
  // t=2: m = 0.045 - 0.025 = 0.02, v = 0.999*2.5e-4 + 0.001*0.0625 = 3.1225e-4;
  //      m^ = 0.02/0.19, v^ = 3.1225e-4/0.001999; p = 0.899000002*0.999 - 0.1*m^/(sqrt(v^)+eps).
  // t=3: m = 0.018 + 0.0125 = 0.0305, v = 0.999*3.1225e-4 + 0.001*0.015625 = 3.2756275e-4.
  const OptimizerSpec o = HandSpec();
  const double grads[3] = {0.5, -0.25, 0.125};
  const double expected_m[3] = {0.05, 0.02, 0.0305};
  const double expected_v[3] = {2.5e-4, 3.1225e-4, 3.2756275e-4};
  const double expected_p[3] = {0.899000002, 0.8714672987058463, 0.8365529176159483};
  double p = 1, m = 0, v = 0;
  for (int t = 1; t <= 3; ++t) {
    AdamWUpdate<double>(o, t, 1, &grads[t - 1], &p, &m, &v);
    EXPECT_NEAR(m, expected_m[t - 1], 1e-15) << "step " << t;
    EXPECT_NEAR(v, expected_v[t - 1], 1e-17) << "step " << t;
    EXPECT_NEAR(p, expected_p[t - 1], 1e-13) << "step " << t;
  }
}

TEST(AdamWTest, WarmupRampsTheLearningRateLinearly) {
  OptimizerSpec o = HandSpec();
  o.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(AdamWLearningRate(o, 1), 0.025);
  EXPECT_DOUBLE_EQ(AdamWLearningRate(o, 3), 0.075);
  EXPECT_DOUBLE_EQ(AdamWLearningRate(o, 4), 0.1);
  EXPECT_DOUBLE_EQ(AdamWLearningRate(o, 40), 0.1);
  o.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(AdamWLearningRate(o, 1), 0.1);

  // First step with warmup: the update is lr/4 * g/(|g| + eps) plus decay at lr/4.
  o.warmup_steps = 4;
  double p = 2, m = 0, v = 0;
  const double g = -3;
  AdamWUpdate<double>(o, 1, 1, &g, &p, &m, &v);
  EXPECT_NEAR(p, 2 * (1 - 0.025 * 0.01) + 0.025 * 3 / (3 + 1e-8), 1e-14);
}

TEST(AdamWTest, FloatUpdateFollowsFp64Reference) {
  OptimizerSpec o = HandSpec();
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  o.warmup_steps = 3;
  constexpr int kN = 257;
  std::mt19937 rng(5);
  std::normal_distribution<double> normal;
  std::vector<double> p(kN), m(kN, 0), v(kN, 0);
  for (double& x : p) x = normal(rng);
  std::vector<float> pf(p.begin(), p.end()), mf(kN, 0), vf(kN, 0);
  for (int t = 1; t <= 6; ++t) {
    std::vector<double> g(kN);
    for (double& x : g) x = normal(rng) * (t % 2 ? 1.0 : 1e-3);
    const std::vector<float> gf(g.begin(), g.end());
    AdamWUpdate<float>(o, t, kN, gf.data(), pf.data(), mf.data(), vf.data());
    const double lr = o.lr * std::min(1.0, t / 3.0);
    for (int i = 0; i < kN; ++i) {  // the formula, written out
      const double gi = static_cast<double>(gf[i]);
      p[i] -= lr * o.weight_decay * p[i];
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * gi;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * gi * gi;
      p[i] -= lr * (m[i] / (1 - std::pow(o.beta1, t))) /
              (std::sqrt(v[i] / (1 - std::pow(o.beta2, t))) + o.eps);
    }
  }
  for (int i = 0; i < kN; ++i) {
    ASSERT_NEAR(pf[i], p[i], 2e-6 * std::max(1.0, std::abs(p[i]))) << i;
    // m mixes gradients of both signs and scales: float keeps ~1e-7 of the largest term.
    ASSERT_NEAR(mf[i], m[i], 1e-6 * std::max(0.1, std::abs(m[i]))) << i;
  }
}

// x rounded to the nearest bf16 (8 significant bits), ties to even, computed from the value rather
// than the bits (kernels' FloatToBf16 works on the bits): nearbyint in the default rounding mode
// rounds ties to even. Finite x well inside float's range (moments are).
float ReferenceBf16(float x) {
  // |x| in [2^(e-1), 2^e): bf16's spacing there is 2^(e-8), at least 2^-133 (its subnormals).
  int e = 0;
  std::frexp(static_cast<double>(x), &e);
  const double quantum = std::ldexp(1.0, std::max(e - 8, -133));
  return static_cast<float>(std::nearbyint(static_cast<double>(x) / quantum) * quantum);
}

bool IsBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return (bits & 0xffffu) == 0;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

TEST(AdamWTest, ReferenceBf16RoundsToNearestEven) {
  EXPECT_EQ(ReferenceBf16(1.0f + 0x1p-8f), 1.0f);                       // tie: down to even
  EXPECT_EQ(ReferenceBf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);         // tie: up to even
  EXPECT_EQ(ReferenceBf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);  // above the tie
  EXPECT_EQ(ReferenceBf16(-3.0e-5f), -ReferenceBf16(3.0e-5f));
  EXPECT_EQ(ReferenceBf16(0.0f), 0.0f);
}

// x rounded stochastically to bf16, computed from the value: its neighbours toward and away from
// zero on bf16's grid, away when the dropped fraction (in 2^-16 units of the spacing) plus
// random16 reaches 2^16. Finite normal x (moments are).
float ReferenceStochasticBf16(float x, uint32_t random16) {
  int e = 0;
  std::frexp(static_cast<double>(x), &e);
  const double quantum = std::ldexp(1.0, std::max(e - 8, -133));
  const double magnitude = std::fabs(static_cast<double>(x));
  const double down = std::floor(magnitude / quantum) * quantum;
  const double dropped = (magnitude - down) / quantum * 65536.0;  // an integer in [0, 65536)
  const double rounded = dropped + random16 >= 65536.0 ? down + quantum : down;
  return static_cast<float>(x < 0 ? -rounded : rounded);
}

TEST(AdamWTest, ReferenceStochasticBf16RoundsByTheDrawnBits) {
  const float x = 1.0f + 0x1p-7f * 0.25f;  // a quarter of the way from 1 to the next bf16
  EXPECT_EQ(ReferenceStochasticBf16(x, 0), 1.0f);
  EXPECT_EQ(ReferenceStochasticBf16(x, 49151), 1.0f);
  EXPECT_EQ(ReferenceStochasticBf16(x, 49152), 1.0f + 0x1p-7f);
  EXPECT_EQ(ReferenceStochasticBf16(-x, 49152), -1.0f - 0x1p-7f);
  EXPECT_EQ(ReferenceStochasticBf16(1.0f, 65535), 1.0f);  // bf16 values stay
  for (uint32_t r : {0u, 12345u, 65535u}) {
    EXPECT_EQ(kernels::StochasticBf16(x, r), ReferenceStochasticBf16(x, r)) << r;
    EXPECT_EQ(kernels::StochasticBf16(-x, r), ReferenceStochasticBf16(-x, r)) << r;
  }
}

float FromBits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}
uint32_t BitsOf(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

TEST(AdamWTest, StochasticBf16AtTheEdges) {
  for (uint32_t r : {0u, 1u, 32768u, 65535u}) {
    SCOPED_TRACE(testing::Message() << "draw " << r);
    EXPECT_EQ(BitsOf(kernels::StochasticBf16(0.0f, r)), 0u);
    EXPECT_EQ(BitsOf(kernels::StochasticBf16(-0.0f, r)), 0x80000000u);
    EXPECT_EQ(BitsOf(kernels::StochasticBf16(FromBits(0x7f800000u), r)), 0x7f800000u);  // +inf
    EXPECT_EQ(BitsOf(kernels::StochasticBf16(FromBits(0xff800000u), r)), 0xff800000u);  // -inf
    // A NaN whose payload is all in the dropped bits stays a NaN (quiet), not an infinity.
    const float nan = kernels::StochasticBf16(FromBits(0x7f800001u), r);
    EXPECT_TRUE(std::isnan(nan));
    EXPECT_EQ(BitsOf(nan) & 0xffffu, 0u);
    // Finite values never round to infinity: bf16's largest finite value instead.
    EXPECT_EQ(BitsOf(kernels::StochasticBf16(FromBits(0x7f7f0001u), r)), 0x7f7f0000u);
    EXPECT_EQ(BitsOf(kernels::StochasticBf16(FromBits(0xff7fffffu), r)), 0xff7f0000u);
  }
  // Subnormals round to bf16's subnormal grid, up with the dropped fraction's probability: the
  // mean over all 2^16 draws is the value itself.
  for (uint32_t u : {0x00000001u, 0x0000ffffu, 0x007fffffu, 0x80012345u}) {
    double mean = 0;
    for (uint32_t r = 0; r < 65536; ++r) {
      const float y = kernels::StochasticBf16(FromBits(u), r);
      ASSERT_EQ(BitsOf(y) & 0xffffu, 0u);
      mean += static_cast<double>(y) / 65536.0;
    }
    EXPECT_EQ(mean, static_cast<double>(FromBits(u))) << std::hex << u;
  }
}

TEST(AdamWTest, Bf16MomentsAreTheFp32MomentsRoundedStochasticallyAfterEachStep) {
  const uint32_t seed = std::random_device{}();  // fresh data each run
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  OptimizerSpec fp32 = HandSpec();
  fp32.lr = 3e-3;
  fp32.weight_decay = 0.1;
  fp32.warmup_steps = 3;
  OptimizerSpec bf16 = fp32;
  bf16.moment_dtype = MomentDtype::kBf16;
  ASSERT_EQ(OptimizerSpec().moment_dtype, MomentDtype::kFp32);  // the default

  constexpr int kN = 1031;
  constexpr int64_t kFirst = 5'000'000'123;  // past 2^32: the draws use the index's high bits
  std::vector<float> p(kN), m(kN, 0), v(kN, 0);
  for (float& x : p) x = normal(rng);
  // The reference: the fp32 update, then the stored moments rounded by ReferenceStochasticBf16
  // with the element's draws.
  std::vector<float> ref_p = p, ref_m = m, ref_v = v;
  // The same job with fp32 moments, for the parameter path.
  std::vector<float> fp32_p = p, fp32_m = m, fp32_v = v;
  // The same elements updated in two slices (as the CUDA engine splits a flat buffer).
  std::vector<float> split_p = p, split_m = m, split_v = v;
  for (int t = 1; t <= 8; ++t) {
    SCOPED_TRACE(testing::Message() << "step " << t);
    std::vector<float> g(kN);
    for (float& x : g) x = normal(rng) * (t % 2 ? 1.0f : 1e-3f);
    AdamWUpdate<float>(bf16, t, kN, g.data(), p.data(), m.data(), v.data(), kExpertMoments, kFirst);
    constexpr int kSplit = 500;
    AdamWUpdate<float>(bf16, t, kSplit, g.data(), split_p.data(), split_m.data(), split_v.data(),
                       kExpertMoments, kFirst);
    AdamWUpdate<float>(bf16, t, kN - kSplit, g.data() + kSplit, split_p.data() + kSplit,
                       split_m.data() + kSplit, split_v.data() + kSplit, kExpertMoments,
                       kFirst + kSplit);
    AdamWUpdate<float>(fp32, t, kN, g.data(), ref_p.data(), ref_m.data(), ref_v.data());
    for (int i = 0; i < kN; ++i) {
      const uint32_t bits = kernels::BF16MomentBits(kExpertMoments, kFirst + i, t);
      ref_m[i] = ReferenceStochasticBf16(ref_m[i], bits & 0xffffu);
      ref_v[i] = ReferenceStochasticBf16(ref_v[i], bits >> 16);
    }
    AdamWUpdate<float>(fp32, t, kN, g.data(), fp32_p.data(), fp32_m.data(), fp32_v.data());
    int p_differs = 0, m_not_bf16 = 0;
    for (int i = 0; i < kN; ++i) {
      ASSERT_TRUE(IsBf16(m[i]) && IsBf16(v[i])) << i << ": m " << m[i] << " v " << v[i];
      ASSERT_TRUE(SameBits(m[i], ref_m[i])) << i << ": " << m[i] << " != " << ref_m[i];
      ASSERT_TRUE(SameBits(v[i], ref_v[i])) << i << ": " << v[i] << " != " << ref_v[i];
      ASSERT_TRUE(SameBits(p[i], ref_p[i])) << i << ": " << p[i] << " != " << ref_p[i];
      ASSERT_TRUE(SameBits(split_m[i], m[i]) && SameBits(split_v[i], v[i]) &&
                  SameBits(split_p[i], p[i]))
          << i;
      p_differs += !SameBits(p[i], fp32_p[i]);
      m_not_bf16 += !IsBf16(fp32_m[i]);
    }
    if (t == 1) {
      // Both start from zero moments and the update uses the moments before rounding.
      EXPECT_EQ(p_differs, 0);
    } else {
      // From step 2 on, the rounded moments feed the update.
      EXPECT_GT(p_differs, kN / 4);
    }
    EXPECT_GT(m_not_bf16, kN / 2);  // fp32 moments are kept as computed
  }
}

// Why the rounding is stochastic: with beta2 = 0.999 and no gradient, v should decay by 0.1% a
// step, less than half of bf16's spacing, so rounding to nearest would keep it at 1 forever.
// Rounded stochastically it follows 0.999^t on average (one draw per element and step).
TEST(AdamWTest, Bf16SecondMomentsDecayAsFp32OnesDo) {
  OptimizerSpec o = HandSpec();
  o.beta2 = 0.999;
  o.moment_dtype = MomentDtype::kBf16;
  constexpr int kN = 4096, kSteps = 2000;
  std::vector<float> p(kN, 1.0f), m(kN, 0.0f), v(kN, 1.0f), g(kN, 0.0f);
  const int64_t first = std::random_device{}();  // other draws each run
  for (int t = 1; t <= kSteps; ++t) {
    AdamWUpdate<float>(o, t, kN, g.data(), p.data(), m.data(), v.data(), kReplicatedMoments, first);
  }
  double mean = 0;
  for (float x : v) mean += x / kN;
  const double want = std::pow(0.999, kSteps);  // 0.135
  EXPECT_NEAR(mean, want, 0.03 * want) << "first index " << first;
  EXPECT_EQ(kernels::Bf16ToFloat(kernels::FloatToBf16(0.999f)), 1.0f);  // nearest would stall
}

// Moments restored from a checkpoint (fp32 in the file) into a job with bf16 moments.
TEST(AdamWTest, RoundMomentsToStoresWhatTheDtypeHolds) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<float> fp32(257);
  for (float& x : fp32) x = normal(rng);
  std::vector<float> kept = fp32, rounded = fp32;
  RoundMomentsTo(MomentDtype::kFp32, static_cast<int64_t>(kept.size()), kept.data());
  RoundMomentsTo(MomentDtype::kBf16, static_cast<int64_t>(rounded.size()), rounded.data());
  for (size_t i = 0; i < fp32.size(); ++i) {
    ASSERT_TRUE(SameBits(kept[i], fp32[i])) << i;
    ASSERT_TRUE(SameBits(rounded[i], ReferenceBf16(fp32[i]))) << i << ": " << fp32[i];
    ASSERT_TRUE(IsBf16(rounded[i])) << i;
  }
  // A finite moment past bf16's largest finite value (0x7f7f0000) stays finite; infinities stay.
  const float max_bf16 = std::ldexp(255.0f / 128.0f, 127);
  std::vector<float> edges = {3.4e38f, -3.4e38f, max_bf16, std::numeric_limits<float>::infinity()};
  RoundMomentsTo(MomentDtype::kBf16, static_cast<int64_t>(edges.size()), edges.data());
  EXPECT_TRUE(SameBits(edges[0], max_bf16));
  EXPECT_TRUE(SameBits(edges[1], -max_bf16));
  EXPECT_TRUE(SameBits(edges[2], max_bf16));
  EXPECT_TRUE(std::isinf(edges[3]));
}

TEST(AdamWTest, DoubleReferenceKeepsItsMomentsInDouble) {
  OptimizerSpec bf16 = HandSpec();
  bf16.moment_dtype = MomentDtype::kBf16;
  const OptimizerSpec fp32 = HandSpec();
  const double grads[3] = {0.5, -0.25, 0.125};
  double p1 = 1, m1 = 0, v1 = 0, p2 = 1, m2 = 0, v2 = 0;
  for (int t = 1; t <= 3; ++t) {
    AdamWUpdate<double>(bf16, t, 1, &grads[t - 1], &p1, &m1, &v1);
    AdamWUpdate<double>(fp32, t, 1, &grads[t - 1], &p2, &m2, &v2);
    EXPECT_EQ(p1, p2);
    EXPECT_EQ(m1, m2);
    EXPECT_EQ(v1, v2);
  }
  EXPECT_NEAR(m1, 0.0305, 1e-15);  // MatchesHandComputedSteps' step 3, not a bf16 value
}

}  // namespace
}  // namespace dropless::cpu
