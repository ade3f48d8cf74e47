// Routing reference against fp64 formulations: sorted top-k, softmax/sigmoid weights, counts, aux
// loss, and the backward pass against central finite differences of the loss.
#include "dropless/kernels/routing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "tests/unit/kernels/test_data.h"

namespace dropless::kernels {
namespace {

using testing::RandomFloat;

struct Case {
  int experts;
  int top_k;
  ScoreFunction score;
  bool renormalize;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (ScoreFunction score : {ScoreFunction::kSoftmax, ScoreFunction::kSigmoid}) {
    for (bool renormalize : {false, true}) {
      cases.push_back({8, 2, score, renormalize});
      cases.push_back({37, 5, score, renormalize});
      cases.push_back({512, 16, score, renormalize});
    }
  }
  return cases;
}

std::vector<double> Fp64Scores(const float* l, int experts, ScoreFunction score) {
  std::vector<double> s(experts);
  if (score == ScoreFunction::kSigmoid) {
    for (int e = 0; e < experts; ++e) s[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(l[e])));
    return s;
  }
  double sum = 0;
  for (int e = 0; e < experts; ++e) sum += std::exp(static_cast<double>(l[e]));
  for (int e = 0; e < experts; ++e) s[e] = std::exp(static_cast<double>(l[e])) / sum;
  return s;
}

std::vector<int> Fp64TopK(const float* l, int experts, int top_k) {
  std::vector<int> ids(experts);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return l[a] > l[b]; });
  ids.resize(top_k);
  return ids;
}

TEST(Routing, ForwardMatchesFp64) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(::testing::Message() << "E=" << c.experts << " k=" << c.top_k << " sigmoid="
                                    << (c.score == ScoreFunction::kSigmoid)
                                    << " renorm=" << c.renormalize);
    const int64_t tokens = 53;
    std::vector<float> logits = RandomFloat(tokens * c.experts, 2.0f);
    // Ties: a few tokens whose logits take only three values.
    for (int64_t t = 0; t < 5; ++t) {
      for (int e = 0; e < c.experts; ++e) logits[t * c.experts + e] = static_cast<float>(e % 3);
    }
    RoutingShape shape{tokens, c.experts, c.top_k, c.score, c.renormalize};
    std::vector<int32_t> ids(tokens * c.top_k, -5), counts(c.experts, -5);
    std::vector<float> weights(tokens * c.top_k, NAN), prob_sums(c.experts, NAN);
    ASSERT_TRUE(cpu::RouteTopK(shape, logits.data(),
                               {ids.data(), weights.data(), counts.data(), prob_sums.data()})
                    .ok());
    std::vector<int> want_counts(c.experts, 0);
    std::vector<double> want_sums(c.experts, 0);
    for (int64_t t = 0; t < tokens; ++t) {
      const float* l = logits.data() + t * c.experts;
      const std::vector<int> want = Fp64TopK(l, c.experts, c.top_k);
      const std::vector<double> s = Fp64Scores(l, c.experts, c.score);
      double chosen = 0;
      for (int e : want) chosen += s[e];
      const double total = std::accumulate(s.begin(), s.end(), 0.0);
      for (int j = 0; j < c.top_k; ++j) {
        ASSERT_EQ(ids[t * c.top_k + j], want[j]) << "token " << t << " choice " << j;
        const double w = c.renormalize ? s[want[j]] / chosen : s[want[j]];
        EXPECT_NEAR(weights[t * c.top_k + j], w, 1e-6 * std::fabs(w) + 1e-12);
        ++want_counts[want[j]];
      }
      for (int e = 0; e < c.experts; ++e) want_sums[e] += s[e] / total;
    }
    for (int e = 0; e < c.experts; ++e) {
      EXPECT_EQ(counts[e], want_counts[e]);
      EXPECT_NEAR(prob_sums[e], want_sums[e], 1e-6 * want_sums[e] + 1e-9);
    }
    float aux = NAN;
    ASSERT_TRUE(cpu::AuxLoss(shape, counts.data(), prob_sums.data(), &aux).ok());
    double want_aux = 0;
    for (int e = 0; e < c.experts; ++e) {
      want_aux += (want_counts[e] / double(tokens * c.top_k)) * (want_sums[e] / tokens);
    }
    want_aux *= c.experts;
    EXPECT_NEAR(aux, want_aux, 1e-6 * want_aux);
  }
}

TEST(Routing, NanAndSignedZeroOrdering) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> logits = {nan, -0.0f, 0.0f, -INFINITY, 1.0f, nan, -1.0f, 0.0f};
  RoutingShape shape{1, 8, 8, ScoreFunction::kSigmoid, false};
  std::vector<int32_t> ids(8), counts(8);
  std::vector<float> weights(8), sums(8);
  ASSERT_TRUE(
      cpu::RouteTopK(shape, logits.data(), {ids.data(), weights.data(), counts.data(), sums.data()})
          .ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{4, 2, 7, 1, 6, 3, 0, 5}));
}

// Loss as a function of the logits with the choice and the counts held fixed, in double.
double Fp64Loss(const std::vector<double>& logits, const RoutingShape& shape,
                const std::vector<int32_t>& ids, const std::vector<int32_t>& counts,
                const std::vector<float>& d_weights, double coef) {
  const int experts = shape.num_experts;
  const int k = shape.top_k;
  const double tokens = static_cast<double>(shape.num_tokens);
  double loss = 0, aux = 0;
  for (int64_t t = 0; t < shape.num_tokens; ++t) {
    std::vector<double> s(experts);
    double total = 0;
    for (int e = 0; e < experts; ++e) {
      const double l = logits[t * experts + e];
      s[e] = shape.score == ScoreFunction::kSigmoid ? 1.0 / (1.0 + std::exp(-l)) : std::exp(l);
      total += s[e];
    }
    if (shape.score == ScoreFunction::kSoftmax) {
      for (double& v : s) v /= total;
      total = 1.0;
    }
    double chosen = 0;
    for (int j = 0; j < k; ++j) chosen += s[ids[t * k + j]];
    for (int j = 0; j < k; ++j) {
      const double w = shape.renormalize ? s[ids[t * k + j]] / chosen : s[ids[t * k + j]];
      loss += d_weights[t * k + j] * w;
    }
    for (int e = 0; e < experts; ++e) aux += (counts[e] / (tokens * k)) * (s[e] / total) / tokens;
  }
  return loss + coef * experts * aux;
}

TEST(Routing, BackwardMatchesFiniteDifferences) {
  for (const Case& c : Cases()) {
    if (c.experts > 64) continue;  // finite differences are O(T * E^2)
    SCOPED_TRACE(::testing::Message() << "E=" << c.experts << " k=" << c.top_k << " sigmoid="
                                    << (c.score == ScoreFunction::kSigmoid)
                                    << " renorm=" << c.renormalize);
    const int64_t tokens = 7;
    const float coef = 0.37f;
    const std::vector<float> logits = RandomFloat(tokens * c.experts, 1.5f);
    const std::vector<float> d_weights = RandomFloat(tokens * c.top_k);
    RoutingShape shape{tokens, c.experts, c.top_k, c.score, c.renormalize};
    std::vector<int32_t> ids(tokens * c.top_k), counts(c.experts);
    std::vector<float> weights(tokens * c.top_k), sums(c.experts);
    ASSERT_TRUE(cpu::RouteTopK(shape, logits.data(),
                               {ids.data(), weights.data(), counts.data(), sums.data()})
                    .ok());
    std::vector<float> d_logits(tokens * c.experts, NAN);
    ASSERT_TRUE(cpu::RouteTopKBackward(shape, logits.data(), ids.data(), counts.data(),
                                       d_weights.data(), coef, d_logits.data())
                    .ok());
    std::vector<double> l(logits.begin(), logits.end());
    const double h = 1e-4;
    for (size_t i = 0; i < l.size(); ++i) {
      const double saved = l[i];
      l[i] = saved + h;
      const double up = Fp64Loss(l, shape, ids, counts, d_weights, coef);
      l[i] = saved - h;
      const double down = Fp64Loss(l, shape, ids, counts, d_weights, coef);
      l[i] = saved;
      const double want = (up - down) / (2 * h);
      ASSERT_NEAR(d_logits[i], want, 1e-6 + 1e-5 * std::fabs(want)) << "logit " << i;
    }
  }
}

TEST(Routing, RejectsBadShapes) {
  std::vector<float> logits(8);
  std::vector<int32_t> ids(8), counts(8);
  std::vector<float> weights(8), sums(8);
  RoutingOutputs out{ids.data(), weights.data(), counts.data(), sums.data()};
  // More than 512 experts is a CUDA kernel limit: the CUDA launchers refuse it (their shape
  // check), the CPU reference (which the CPU engine routes with) does not.
  EXPECT_FALSE(ValidateRoutingShape({1, 513, 2}).ok());
  EXPECT_TRUE(ValidateRoutingShape({1, 513, 2}, /*cuda_limits=*/false).ok());
  EXPECT_FALSE(cpu::RouteTopK({1, 8, 9}, logits.data(), out).ok());
  EXPECT_FALSE(cpu::RouteTopK({1, 64, 17}, logits.data(), out).ok());
  EXPECT_FALSE(cpu::RouteTopK({-1, 8, 2}, logits.data(), out).ok());
  EXPECT_TRUE(cpu::RouteTopK({0, 8, 2}, static_cast<const float*>(nullptr), out).ok());
}

}  // namespace
}  // namespace dropless::kernels
