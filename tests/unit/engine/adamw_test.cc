// AdamW against values worked out by hand and against a plain fp64 loop of the formula.
#include "worker/engine/cpu/adamw.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

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

}  // namespace
}  // namespace dropless::cpu
