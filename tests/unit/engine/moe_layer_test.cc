// The MoE layer's forward pass against a direct per-token fp64 reference, its routing rules, and
// the expert-parallel path: the expert exchange over in-process groups, and a layer split over EP
// ranks (threads) against the same layer on one rank.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/engine/layer_test_util.h"
#include "worker/engine/cpu/expert_exchange.h"
#include "worker/engine/cpu/moe_layer.h"
#include "dropless/kernels/routing.h"
#include "worker/transport/transport_factory.h"

namespace dropless::cpu {
namespace {

using testing::LayerParameters;
using testing::RandomVector;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

MoeLayerShape SmallShape(RouterKind router, bool renormalize) {
  MoeLayerShape shape;
  shape.tokens = 13;
  shape.hidden = 8;
  shape.ffn = 6;
  shape.experts = 6;
  shape.topk = 3;
  shape.shared_experts = 2;
  shape.router = router;
  shape.renormalize = renormalize;
  return shape;
}

// SwiGLU of one token by explicit loops.
std::vector<double> ReferenceSwiGlu(const double* x, const double* w1, const double* w2,
                                    int64_t hidden, int64_t ffn) {
  std::vector<double> a(ffn);
  for (int64_t i = 0; i < ffn; ++i) {
    double gate = 0, up = 0;
    for (int64_t d = 0; d < hidden; ++d) {
      gate += x[d] * w1[d * 2 * ffn + i];
      up += x[d] * w1[d * 2 * ffn + ffn + i];
    }
    a[i] = gate / (1 + std::exp(-gate)) * up;
  }
  std::vector<double> y(hidden, 0.0);
  for (int64_t d = 0; d < hidden; ++d) {
    for (int64_t i = 0; i < ffn; ++i) y[d] += a[i] * w2[i * hidden + d];
  }
  return y;
}

// The layer written token by token, with no permutation: what MoeLayerForward must compute.
std::vector<double> ReferenceLayer(const MoeLayerShape& s, const LayerParameters& p,
                                   const std::vector<double>& bias, const std::vector<double>& x) {
  std::vector<double> out(x);
  for (int64_t t = 0; t < s.tokens; ++t) {
    const double* xt = x.data() + t * s.hidden;
    std::vector<double> probs(s.experts);
    for (int64_t e = 0; e < s.experts; ++e) {
      double z = bias[e];
      for (int64_t d = 0; d < s.hidden; ++d) z += xt[d] * p.router[d * s.experts + e];
      probs[e] = z;
    }
    if (s.router == RouterKind::kSigmoid) {
      for (double& v : probs) v = 1 / (1 + std::exp(-v));
    } else {
      const double m = *std::max_element(probs.begin(), probs.end());
      double sum = 0;
      for (double& v : probs) sum += (v = std::exp(v - m));
      for (double& v : probs) v /= sum;
    }
    std::vector<int> order(s.experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return probs[a] > probs[b]; });
    double chosen = 0;
    for (int64_t j = 0; j < s.topk; ++j) chosen += probs[order[j]];
    for (int64_t j = 0; j < s.topk; ++j) {
      const int e = order[j];
      const double gate = s.renormalize ? probs[e] / chosen : probs[e];
      const auto y = ReferenceSwiGlu(xt, p.expert_w1.data() + e * s.hidden * 2 * s.ffn,
                                     p.expert_w2.data() + e * s.ffn * s.hidden, s.hidden, s.ffn);
      for (int64_t d = 0; d < s.hidden; ++d) out[t * s.hidden + d] += gate * y[d];
    }
    for (int64_t sh = 0; sh < s.shared_experts; ++sh) {
      const auto y = ReferenceSwiGlu(xt, p.shared_w1.data() + sh * s.hidden * 2 * s.ffn,
                                     p.shared_w2.data() + sh * s.ffn * s.hidden, s.hidden, s.ffn);
      for (int64_t d = 0; d < s.hidden; ++d) out[t * s.hidden + d] += y[d];
    }
  }
  return out;
}

class LayerForwardTest : public ::testing::TestWithParam<std::tuple<RouterKind, bool>> {};

TEST_P(LayerForwardTest, MatchesPerTokenReference) {
  const MoeLayerShape shape = SmallShape(std::get<0>(GetParam()), std::get<1>(GetParam()));
  const LayerParameters params = LayerParameters::Random(shape, 101);
  const std::vector<double> x = RandomVector(shape.tokens * shape.hidden, 103);
  const std::vector<double> bias = {0.0, -0.7, -1.1, -1.4, -1.6, -1.8};
  const std::vector<double> expected = ReferenceLayer(shape, params, bias, x);

  MoeLayerWeights<double> weights = params.Weights();
  weights.router_bias = bias.data();
  auto exchange = NewSingleRankExpertExchange();
  MoeLayerCache<double> cache;
  MoeLayerTimes times;
  std::vector<double> out(x.size(), kNaN);
  ASSERT_TRUE(MoeLayerForward<double>(shape, weights, x.data(), true, exchange.get(), &cache,
                                      &times, out.data())
                  .ok());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], expected[i], 1e-12) << i;

  // Dropless: every (token, slot) pair reached an expert.
  EXPECT_EQ(std::accumulate(cache.rows_per_expert.begin(), cache.rows_per_expert.end(), int64_t{0}),
            shape.tokens * shape.topk);

  // The float instantiation computes the same layer within float rounding.
  auto to_float = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  const std::vector<float> router = to_float(params.router), w1 = to_float(params.expert_w1),
                           w2 = to_float(params.expert_w2), s1 = to_float(params.shared_w1),
                           s2 = to_float(params.shared_w2), xf = to_float(x),
                           bias_f = to_float(bias);
  MoeLayerCache<float> cache_f;
  std::vector<float> out_f(x.size(), std::numeric_limits<float>::quiet_NaN());
  ASSERT_TRUE(MoeLayerForward<float>(shape,
                                     MoeLayerWeights<float>{router.data(), bias_f.data(), w1.data(),
                                                            w2.data(), s1.data(), s2.data()},
                                     xf.data(), true, exchange.get(), &cache_f, &times,
                                     out_f.data())
                  .ok());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out_f[i], expected[i], 2e-5) << i;
}

INSTANTIATE_TEST_SUITE_P(Routers, LayerForwardTest,
                         ::testing::Combine(::testing::Values(RouterKind::kSoftmax,
                                                              RouterKind::kSigmoid),
                                            ::testing::Bool()),
                         testing::RouterParamName);

// The expert GEMM time is split by phase: the forward pass adds only to forward, the backward
// pass only to dgrad and wgrad; dispatch and combine are not GEMM time.
TEST(LayerTimesTest, ExpertGemmPhasesAreTimedApart) {
  const MoeLayerShape shape = SmallShape(RouterKind::kSoftmax, true);
  const LayerParameters params = LayerParameters::Random(shape, 31);
  const std::vector<double> x = RandomVector(shape.tokens * shape.hidden, 32);
  const std::vector<double> out_grad = RandomVector(shape.tokens * shape.hidden, 33);
  auto exchange = NewSingleRankExpertExchange();
  MoeLayerCache<double> cache;
  MoeLayerTimes times;
  std::vector<double> y(x.size(), kNaN), x_grad(x.size(), kNaN);
  ASSERT_TRUE(MoeLayerForward<double>(shape, params.Weights(), x.data(), true, exchange.get(),
                                      &cache, &times, y.data()).ok());
  EXPECT_GT(times.gemm_forward_seconds, 0);
  EXPECT_EQ(times.gemm_dgrad_seconds, 0);
  EXPECT_EQ(times.gemm_wgrad_seconds, 0);
  const double forward = times.gemm_forward_seconds;

  LayerParameters grads = params.Poisoned();
  ASSERT_TRUE(MoeLayerBackward<double>(shape, params.Weights(), x.data(), out_grad.data(), 0.1,
                                       exchange.get(), &cache, &times, grads.Grads(),
                                       x_grad.data()).ok());
  EXPECT_EQ(times.gemm_forward_seconds, forward);
  EXPECT_GT(times.gemm_dgrad_seconds, 0);
  EXPECT_GT(times.gemm_wgrad_seconds, 0);
  EXPECT_EQ(times.gemm_seconds(),
            times.gemm_forward_seconds + times.gemm_dgrad_seconds + times.gemm_wgrad_seconds);
}

// The layer routes with the kernels' CPU reference over double (dropless/kernels/routing.h).
TEST(RouterTest, EqualLogitsGoToTheLowerExpertId) {
  kernels::RoutingShape shape;
  shape.num_tokens = 2;
  shape.num_experts = 5;
  shape.top_k = 3;
  const std::vector<double> logits = {0.1, 0.3, 0.1, 0.3, 0.2,    // ties at 0.3 and 0.1
                                      0.2, 0.2, 0.2, 0.2, 0.2};   // all equal
  std::vector<int32_t> ids(6, -1), counts(5, -1);
  std::vector<double> gates(6, kNaN), prob_sums(5, kNaN);
  ASSERT_TRUE(kernels::cpu::RouteTopK<double>(shape, logits.data(),
                                              {ids.data(), gates.data(), counts.data(),
                                               prob_sums.data()})
                  .ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 4, 0, 1, 2}));
  EXPECT_EQ(gates[0], gates[1]);
  EXPECT_NEAR(gates[3], 0.2, 1e-15);

  shape.renormalize = true;
  ASSERT_TRUE(kernels::cpu::RouteTopK<double>(shape, logits.data(),
                                              {ids.data(), gates.data(), counts.data(),
                                               prob_sums.data()})
                  .ok());
  EXPECT_NEAR(gates[3] + gates[4] + gates[5], 1.0, 1e-15);
}

TEST(RouterTest, LoadBalancingLossIsOneWhenBalancedAndGrowsWithSkewOverTheJob) {
  // 4 experts, k = 1, 8 tokens of the job (aux_tokens; this rank's 2): two tokens and a quarter
  // of the probability each.
  kernels::RoutingShape shape;
  shape.num_tokens = 2;
  shape.num_experts = 4;
  shape.top_k = 1;
  shape.aux_tokens = 8;
  const std::vector<int32_t> counts = {2, 2, 2, 2};
  const std::vector<double> prob_sums = {2, 2, 2, 2};
  double aux = kNaN;
  ASSERT_TRUE(kernels::cpu::AuxLoss<double>(shape, counts.data(), prob_sums.data(), &aux).ok());
  EXPECT_DOUBLE_EQ(aux, 1.0);
  // Everything on expert 0 with probability 1: E * 1 * 1 = 4.
  const std::vector<int32_t> skew_counts = {8, 0, 0, 0};
  const std::vector<double> skew_probs = {8, 0, 0, 0};
  ASSERT_TRUE(
      kernels::cpu::AuxLoss<double>(shape, skew_counts.data(), skew_probs.data(), &aux).ok());
  EXPECT_DOUBLE_EQ(aux, 4.0);
}

// Runs fn(rank, groups) on one thread per rank of CreateLocalGroups(ep, dp).
template <typename Fn>
void RunRanks(int ep, int dp, Fn fn) {
  std::vector<RankGroups> groups = CreateLocalGroups(ep, dp);
  std::vector<std::thread> threads;
  for (int r = 0; r < ep * dp; ++r) threads.emplace_back([&, r] { fn(r, &groups[r]); });
  for (auto& t : threads) t.join();
}

TEST(ExpertExchangeTest, RowsReachTheirExpertGroupedBySourceAndComeBack) {
  constexpr int kRanks = 3;
  constexpr int64_t kExperts = 6;  // two per rank
  RunRanks(kRanks, 1, [&](int rank, RankGroups* groups) {
    auto exchange = NewCommunicatorExpertExchange(groups->ep.get(), groups->world.get());
    // Rank r sends (r + e) % 4 rows to expert e; row value = 1000 * r + 10 * e + i.
    std::vector<int64_t> rows_per_expert(kExperts);
    std::vector<double> send;
    for (int64_t e = 0; e < kExperts; ++e) {
      rows_per_expert[e] = (rank + e) % 4;
      for (int64_t i = 0; i < rows_per_expert[e]; ++i) send.push_back(1000.0 * rank + 10 * e + i);
    }
    absl::StatusOr<ExchangePlan> plan = exchange->Plan(rows_per_expert);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<double> at_experts(plan->total_recv_rows, kNaN);
    ASSERT_TRUE(exchange->Dispatch(*plan, send.data(), sizeof(double), at_experts.data()).ok());
    std::vector<double> expected;
    for (int64_t local = 0; local < 2; ++local) {
      const int64_t e = 2 * rank + local;
      int64_t total = 0;
      for (int source = 0; source < kRanks; ++source) {
        for (int64_t i = 0; i < (source + e) % 4; ++i) expected.push_back(1000.0 * source + 10 * e + i);
        total += (source + e) % 4;
      }
      EXPECT_EQ(plan->rows_per_local_expert[local], total);
    }
    EXPECT_EQ(at_experts, expected);
    std::vector<double> back(send.size(), kNaN);
    ASSERT_TRUE(exchange->Combine(*plan, at_experts.data(), sizeof(double), back.data()).ok());
    EXPECT_EQ(back, send);
    std::vector<double> sum = {1.0 + rank};
    ASSERT_TRUE(exchange->SumOverJob(absl::MakeSpan(sum)).ok());
    EXPECT_EQ(sum[0], 6.0);
  });
}

// One layer over EP ranks (threads, each with its own tokens and experts) against the same layer
// on one rank holding every token and expert: outputs, input gradients and each expert's
// gradients agree to fp64 rounding; router and shared gradients summed over the ranks agree.
TEST(ExpertParallelLayerTest, MatchesOneRankLayer) {
  for (int ep : {2, 3}) {
    MoeLayerShape full = SmallShape(RouterKind::kSoftmax, true);
    full.tokens = 12 * ep;
    const LayerParameters params = LayerParameters::Random(full, 7);
    const std::vector<double> x = RandomVector(full.tokens * full.hidden, 8);
    const std::vector<double> out_grad = RandomVector(full.tokens * full.hidden, 9);
    constexpr double kAuxScale = 0.3;

    auto single = NewSingleRankExpertExchange();
    MoeLayerCache<double> cache;
    MoeLayerTimes times;
    std::vector<double> y(x.size()), x_grad(x.size());
    LayerParameters grads = params.Poisoned();
    ASSERT_TRUE(MoeLayerForward<double>(full, params.Weights(), x.data(), true, single.get(),
                                        &cache, &times, y.data()).ok());
    ASSERT_TRUE(MoeLayerBackward<double>(full, params.Weights(), x.data(), out_grad.data(),
                                         kAuxScale, single.get(), &cache, &times, grads.Grads(),
                                         x_grad.data()).ok());

    const int64_t per_rank = full.tokens / ep, values = per_rank * full.hidden;
    const int64_t local = full.experts / ep;
    const int64_t w1 = full.hidden * 2 * full.ffn, w2 = full.ffn * full.hidden;
    std::vector<std::vector<double>> router_grads(ep), shared_grads(ep);
    RunRanks(ep, 1, [&](int rank, RankGroups* groups) {
      MoeLayerShape shape = full;
      shape.tokens = per_rank;
      LayerParameters mine = params;  // this rank's experts only
      mine.expert_w1.assign(params.expert_w1.begin() + rank * local * w1,
                            params.expert_w1.begin() + (rank + 1) * local * w1);
      mine.expert_w2.assign(params.expert_w2.begin() + rank * local * w2,
                            params.expert_w2.begin() + (rank + 1) * local * w2);
      auto exchange = NewCommunicatorExpertExchange(groups->ep.get(), groups->world.get());
      MoeLayerCache<double> rank_cache;
      MoeLayerTimes rank_times;
      std::vector<double> rank_y(values, kNaN), rank_x_grad(values, kNaN);
      LayerParameters rank_grads = mine.Poisoned();
      ASSERT_TRUE(MoeLayerForward<double>(shape, mine.Weights(), x.data() + rank * values, true,
                                          exchange.get(), &rank_cache, &rank_times,
                                          rank_y.data()).ok());
      ASSERT_TRUE(MoeLayerBackward<double>(shape, mine.Weights(), x.data() + rank * values,
                                           out_grad.data() + rank * values, kAuxScale,
                                           exchange.get(), &rank_cache, &rank_times,
                                           rank_grads.Grads(), rank_x_grad.data()).ok());
      EXPECT_NEAR(rank_cache.aux_loss, cache.aux_loss, 1e-13);
      for (int64_t i = 0; i < values; ++i) {
        ASSERT_NEAR(rank_y[i], y[rank * values + i], 1e-12) << "ep " << ep << " rank " << rank;
        ASSERT_NEAR(rank_x_grad[i], x_grad[rank * values + i], 1e-12) << "ep " << ep;
      }
      for (int64_t i = 0; i < local * w1; ++i) {
        ASSERT_NEAR(rank_grads.expert_w1[i], grads.expert_w1[rank * local * w1 + i], 1e-12);
      }
      for (int64_t i = 0; i < local * w2; ++i) {
        ASSERT_NEAR(rank_grads.expert_w2[i], grads.expert_w2[rank * local * w2 + i], 1e-12);
      }
      router_grads[rank] = rank_grads.router;
      shared_grads[rank] = rank_grads.shared_w1;
    });
    for (size_t i = 0; i < grads.router.size(); ++i) {
      double sum = 0;
      for (int r = 0; r < ep; ++r) sum += router_grads[r][i];
      ASSERT_NEAR(sum, grads.router[i], 1e-12) << "router " << i;
    }
    for (size_t i = 0; i < grads.shared_w1.size(); ++i) {
      double sum = 0;
      for (int r = 0; r < ep; ++r) sum += shared_grads[r][i];
      ASSERT_NEAR(sum, grads.shared_w1[i], 1e-12) << "shared_w1 " << i;
    }
  }
}

}  // namespace
}  // namespace dropless::cpu
