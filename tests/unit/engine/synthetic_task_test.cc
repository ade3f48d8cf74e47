// The synthetic task and initialization are pure functions of (seed, what, where): the global batch
// and an expert's weights do not depend on how the job is split over ranks.
#include "worker/engine/cpu/synthetic_task.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "worker/engine/cpu/moe_model.h"

namespace dropless::cpu {
namespace {

TEST(SyntheticTaskTest, TokensDependOnlyOnSeedStepAndGlobalIndex) {
  constexpr int64_t kHidden = 24, kTokens = 10;
  const TokenGenerator generator(DeriveTaskSeeds(7).tokens, kHidden);
  std::vector<double> whole(2 * kTokens * kHidden), halves(2 * kTokens * kHidden);
  generator.Generate<double>(3, 0, 2 * kTokens, whole.data());
  generator.Generate<double>(3, 0, kTokens, halves.data());
  generator.Generate<double>(3, kTokens, kTokens, halves.data() + kTokens * kHidden);
  EXPECT_EQ(whole, halves);

  std::vector<double> next_step(kTokens * kHidden);
  generator.Generate<double>(4, 0, kTokens, next_step.data());
  EXPECT_NE(std::vector<double>(whole.begin(), whole.begin() + kTokens * kHidden), next_step);

  // Tokens span kTokenLatentRank dimensions with roughly unit variance per hidden value.
  std::vector<double> many(4000 * kHidden);
  generator.Generate<double>(1, 0, 4000, many.data());
  double sum_squares = 0;
  for (double v : many) sum_squares += v * v;
  EXPECT_NEAR(sum_squares / many.size(), 1.0, 0.35);
}

TEST(SyntheticTaskTest, ZipfBiasIsTheLogOfNormalizedPowerLaw) {
  DataSpec data;
  data.distribution = RoutingDistribution::kZipf;
  data.zipf_exponent = 1.2;
  const std::vector<double> bias = TeacherRouterBias(data, 5);
  double total = 0;
  for (double b : bias) total += std::exp(b);
  EXPECT_NEAR(total, 1.0, 1e-12);
  for (int e = 1; e < 5; ++e) {
    EXPECT_NEAR(bias[e] - bias[0], -1.2 * std::log(e + 1.0), 1e-12);
  }
  data.distribution = RoutingDistribution::kUniform;
  EXPECT_EQ(TeacherRouterBias(data, 5), std::vector<double>(5, 0.0));
}

TEST(MoeParameterLayoutTest, ExpertWeightsDependOnlyOnSeedLayerAndExpert) {
  ModelSpec model;
  model.hidden = 8;
  model.ffn = 6;
  model.experts = 4;
  model.topk = 2;
  model.shared_experts = 1;
  model.layers = 2;
  const MoeParameterLayout whole(model, 1, 0, 16);
  std::vector<float> replicated(whole.replicated_size()), experts(whole.experts_size());
  whole.Initialize<float>(42, replicated.data(), experts.data());
  const int64_t w1 = model.hidden * 2 * model.ffn, w2 = model.ffn * model.hidden;
  for (int ep_rank = 0; ep_rank < 2; ++ep_rank) {
    const MoeParameterLayout half(model, 2, ep_rank, 16);
    ASSERT_EQ(half.local_experts(), 2);
    std::vector<float> rep(half.replicated_size()), exp(half.experts_size());
    half.Initialize<float>(42, rep.data(), exp.data());
    EXPECT_EQ(rep, replicated);  // router and shared experts: identical on every rank
    for (int64_t layer = 0; layer < model.layers; ++layer) {
      const auto mine = half.Weights<float>(rep.data(), exp.data(), layer, nullptr);
      const auto all = whole.Weights<float>(replicated.data(), experts.data(), layer, nullptr);
      for (int64_t i = 0; i < 2 * w1; ++i) {
        ASSERT_EQ(mine.expert_w1[i], all.expert_w1[ep_rank * 2 * w1 + i]) << layer << " " << i;
      }
      for (int64_t i = 0; i < 2 * w2; ++i) {
        ASSERT_EQ(mine.expert_w2[i], all.expert_w2[ep_rank * 2 * w2 + i]) << layer << " " << i;
      }
    }
  }
  // Another seed, other weights; layers differ from each other.
  std::vector<float> other_rep(whole.replicated_size()), other_exp(whole.experts_size());
  whole.Initialize<float>(43, other_rep.data(), other_exp.data());
  EXPECT_NE(other_exp, experts);
  const auto layer0 = whole.Weights<float>(replicated.data(), experts.data(), 0, nullptr);
  const auto layer1 = whole.Weights<float>(replicated.data(), experts.data(), 1, nullptr);
  EXPECT_NE(layer0.expert_w1[0], layer1.expert_w1[0]);
}

}  // namespace
}  // namespace dropless::cpu
