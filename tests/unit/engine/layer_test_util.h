// Helpers shared by the engine unit tests: random layer weights on plain buffers.
#ifndef DROPLESS_TESTS_UNIT_ENGINE_LAYER_TEST_UTIL_H_
#define DROPLESS_TESTS_UNIT_ENGINE_LAYER_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

#include "worker/engine/cpu/moe_layer.h"

namespace dropless::cpu::testing {

// Owns every parameter of one layer with all experts (or a slice of them).
struct LayerParameters {
  std::vector<double> router, expert_w1, expert_w2, shared_w1, shared_w2;

  static LayerParameters Random(const MoeLayerShape& shape, uint32_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    const double h = static_cast<double>(shape.hidden), f = static_cast<double>(shape.ffn);
    auto fill = [&](std::vector<double>* v, int64_t n, double scale) {
      v->resize(n);
      for (double& x : *v) x = scale * normal(rng);
    };
    LayerParameters p;
    fill(&p.router, shape.hidden * shape.experts, 1.5 / std::sqrt(h));
    fill(&p.expert_w1, shape.experts * shape.hidden * 2 * shape.ffn, 1.0 / std::sqrt(h));
    fill(&p.expert_w2, shape.experts * shape.ffn * shape.hidden, 1.0 / std::sqrt(f));
    fill(&p.shared_w1, shape.shared_experts * shape.hidden * 2 * shape.ffn, 1.0 / std::sqrt(h));
    fill(&p.shared_w2, shape.shared_experts * shape.ffn * shape.hidden, 1.0 / std::sqrt(f));
    return p;
  }

  // Same sizes, filled with NaN: gradients must overwrite every value.
  LayerParameters Poisoned() const {
    LayerParameters p = *this;
    for (auto* v : {&p.router, &p.expert_w1, &p.expert_w2, &p.shared_w1, &p.shared_w2}) {
      std::fill(v->begin(), v->end(), std::numeric_limits<double>::quiet_NaN());
    }
    return p;
  }

  MoeLayerWeights<double> Weights() const {
    return MoeLayerWeights<double>{router.data(),    nullptr,          expert_w1.data(),
                                   expert_w2.data(), shared_w1.data(), shared_w2.data()};
  }
  MoeLayerGrads<double> Grads() {
    return MoeLayerGrads<double>{router.data(), expert_w1.data(), expert_w2.data(),
                                 shared_w1.data(), shared_w2.data()};
  }
};

// Test-name suffix for (router kind, renormalize) parameters, e.g. "SoftmaxRenormalized".
inline std::string RouterParamName(
    const ::testing::TestParamInfo<std::tuple<RouterKind, bool>>& info) {
  return std::string(std::get<0>(info.param) == RouterKind::kSoftmax ? "Softmax" : "Sigmoid") +
         (std::get<1>(info.param) ? "Renormalized" : "Raw");
}

inline std::vector<double> RandomVector(int64_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

}  // namespace dropless::cpu::testing

#endif  // DROPLESS_TESTS_UNIT_ENGINE_LAYER_TEST_UTIL_H_
