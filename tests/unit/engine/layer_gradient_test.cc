// fp64 gradient check of the MoE layer: every parameter group's analytic gradient (router, routed
// w1 and w2, shared w1 and w2, and the input) against central finite differences of
//   J = <R, x_next> + aux_scale * aux_loss
// for softmax and sigmoid routers, with and without renormalization.
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/engine/layer_test_util.h"
#include "worker/engine/cpu/expert_exchange.h"
#include "worker/engine/cpu/moe_layer.h"

namespace dropless::cpu {
namespace {

using testing::LayerParameters;
using testing::RandomVector;

constexpr double kAuxScale = 0.7;
constexpr double kStep = 1e-6;
constexpr double kTolerance = 1e-6;

class LayerGradientTest : public ::testing::TestWithParam<std::tuple<RouterKind, bool>> {
 protected:
  void SetUp() override {
    shape_.tokens = 11;
    shape_.hidden = 6;
    shape_.ffn = 5;
    shape_.experts = 6;
    shape_.topk = 2;
    shape_.shared_experts = 1;
    shape_.router = std::get<0>(GetParam());
    shape_.renormalize = std::get<1>(GetParam());
    params_ = LayerParameters::Random(shape_, 17);
    x_ = RandomVector(shape_.tokens * shape_.hidden, 23);
    output_weights_ = RandomVector(shape_.tokens * shape_.hidden, 29);
  }

  // J at the current parameters and input; also returns the routing it used.
  double Objective(std::vector<int32_t>* routing) {
    MoeLayerCache<double> cache;
    MoeLayerTimes times;
    std::vector<double> x_next(x_.size(), std::numeric_limits<double>::quiet_NaN());
    absl::Status status = MoeLayerForward<double>(shape_, params_.Weights(), x_.data(), true,
                                                  exchange_.get(), &cache, &times, x_next.data());
    EXPECT_TRUE(status.ok()) << status;
    double j = kAuxScale * cache.aux_loss;
    for (size_t i = 0; i < x_next.size(); ++i) j += output_weights_[i] * x_next[i];
    *routing = cache.expert_ids;
    return j;
  }

  // Compares analytic[i] with the central difference of J in values[i], for every i.
  void CheckGroup(const std::string& name, std::vector<double>* values,
                  const std::vector<double>& analytic) {
    ASSERT_EQ(values->size(), analytic.size()) << name;
    std::vector<int32_t> base_routing, routing;
    Objective(&base_routing);
    double max_error = 0, max_gradient = 0;
    for (size_t i = 0; i < values->size(); ++i) {
      ASSERT_TRUE(std::isfinite(analytic[i])) << name << "[" << i << "] was not written";
      const double saved = (*values)[i];
      (*values)[i] = saved + kStep;
      const double plus = Objective(&routing);
      ASSERT_EQ(routing, base_routing) << name << "[" << i << "]: the perturbation moved a token";
      (*values)[i] = saved - kStep;
      const double minus = Objective(&routing);
      ASSERT_EQ(routing, base_routing) << name << "[" << i << "]: the perturbation moved a token";
      (*values)[i] = saved;
      const double numeric = (plus - minus) / (2 * kStep);
      max_error = std::max(max_error, std::abs(numeric - analytic[i]));
      max_gradient = std::max(max_gradient, std::abs(numeric));
    }
    EXPECT_GT(max_gradient, 1e-3) << name << ": gradient too small to check";
    EXPECT_LE(max_error / max_gradient, kTolerance)
        << name << ": max error " << max_error << " against max gradient " << max_gradient;
  }

  MoeLayerShape shape_;
  LayerParameters params_;
  std::vector<double> x_, output_weights_;
  std::unique_ptr<ExpertExchange> exchange_ = NewSingleRankExpertExchange();
};

TEST_P(LayerGradientTest, AnalyticGradientsMatchFiniteDifferences) {
  MoeLayerCache<double> cache;
  MoeLayerTimes times;
  std::vector<double> x_next(x_.size(), std::numeric_limits<double>::quiet_NaN());
  ASSERT_TRUE(MoeLayerForward<double>(shape_, params_.Weights(), x_.data(), true, exchange_.get(),
                                      &cache, &times, x_next.data())
                  .ok());
  LayerParameters grads = params_.Poisoned();
  std::vector<double> x_grad(x_.size(), std::numeric_limits<double>::quiet_NaN());
  ASSERT_TRUE(MoeLayerBackward<double>(shape_, params_.Weights(), x_.data(),
                                       output_weights_.data(), kAuxScale, exchange_.get(), &cache,
                                       &times, grads.Grads(), x_grad.data())
                  .ok());

  CheckGroup("router", &params_.router, grads.router);
  CheckGroup("expert_w1", &params_.expert_w1, grads.expert_w1);
  CheckGroup("expert_w2", &params_.expert_w2, grads.expert_w2);
  CheckGroup("shared_w1", &params_.shared_w1, grads.shared_w1);
  CheckGroup("shared_w2", &params_.shared_w2, grads.shared_w2);
  CheckGroup("input", &x_, x_grad);
}

TEST_P(LayerGradientTest, AuxLossGradientAloneMatchesFiniteDifferences) {
  // Output weights of zero leave only the auxiliary loss in J: its router gradient must be right
  // on its own, not hidden under the task gradient.
  std::fill(output_weights_.begin(), output_weights_.end(), 0.0);
  MoeLayerCache<double> cache;
  MoeLayerTimes times;
  std::vector<double> x_next(x_.size());
  ASSERT_TRUE(MoeLayerForward<double>(shape_, params_.Weights(), x_.data(), true, exchange_.get(),
                                      &cache, &times, x_next.data())
                  .ok());
  EXPECT_GT(cache.aux_loss, 0.5);
  LayerParameters grads = params_.Poisoned();
  std::vector<double> x_grad(x_.size());
  ASSERT_TRUE(MoeLayerBackward<double>(shape_, params_.Weights(), x_.data(),
                                       output_weights_.data(), kAuxScale, exchange_.get(), &cache,
                                       &times, grads.Grads(), x_grad.data())
                  .ok());
  CheckGroup("router (aux only)", &params_.router, grads.router);
}

INSTANTIATE_TEST_SUITE_P(
    Routers, LayerGradientTest,
    ::testing::Combine(::testing::Values(RouterKind::kSoftmax, RouterKind::kSigmoid),
                       ::testing::Bool()),
    testing::RouterParamName);

}  // namespace
}  // namespace dropless::cpu
