// Routing, dispatch plan and router GEMM CUDA kernels against the CPU references.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "dropless/kernels/dispatch_plan.h"
#include "dropless/kernels/router_gemm.h"
#include "dropless/kernels/routing.h"
#include "tests/gpu/kernels/gpu_test_util.h"
#include "tests/unit/kernels/test_data.h"

namespace dropless::kernels {
namespace {

using testing::BitEqual;
using testing::DeviceArray;
using testing::Poisoned;
using testing::RandomBf16;
using testing::RandomFloat;
using testing::Rng;

class RoutingGpu : public testing::GpuTest {};

// ||got - want|| / ||want|| and the largest element error relative to the largest |want|.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double tolerance,
                 const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double diff = 0, norm = 0, worst = 0, largest = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << " element " << i << " is NaN (unwritten?)";
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
    worst = std::max(worst, std::fabs(d));
    largest = std::max(largest, std::fabs(static_cast<double>(want[i])));
  }
  EXPECT_LE(std::sqrt(diff / std::max(norm, 1e-300)), tolerance) << what;
  EXPECT_LE(worst, 10 * tolerance * std::max(largest, 1e-30)) << what;
}

struct RoutingCase {
  int64_t tokens;
  int experts, top_k;
};

TEST_F(RoutingGpu, TopKForwardAndBackwardMatchReference) {
  for (const RoutingCase& c : {RoutingCase{1000, 8, 2}, RoutingCase{777, 37, 5},
                               RoutingCase{1531, 128, 8}, RoutingCase{333, 256, 8},
                               RoutingCase{129, 512, 16}, RoutingCase{1, 64, 1}}) {
    for (ScoreFunction score : {ScoreFunction::kSoftmax, ScoreFunction::kSigmoid}) {
      for (bool renormalize : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "T=" << c.tokens << " E=" << c.experts << " k="
                                          << c.top_k << " sigmoid=" << (score == ScoreFunction::kSigmoid)
                                          << " renorm=" << renormalize);
        const RoutingShape shape{c.tokens, c.experts, c.top_k, score, renormalize};
        std::vector<float> logits = RandomFloat(c.tokens * c.experts, 2.0f);
        for (int e = 0; e < c.experts; ++e) logits[e] = static_cast<float>(e % 3);  // ties
        const int64_t tk = c.tokens * c.top_k;
        DeviceArray<float> d_logits(logits), d_weights(tk, 0xFF), d_sums(c.experts, 0xFF);
        DeviceArray<int32_t> d_ids(tk), d_counts(c.experts);
        STATUS_ASSERT(cuda::RouteTopK(shape, d_logits.get(),
                                      {d_ids.get(), d_weights.get(), d_counts.get(), d_sums.get()},
                                      nullptr));
        DeviceArray<float> d_aux(1, 0xFF);
        STATUS_ASSERT(cuda::AuxLoss(shape, d_counts.get(), d_sums.get(), d_aux.get(), nullptr));
        std::vector<int32_t> ids(tk), counts(c.experts);
        std::vector<float> weights(tk), sums(c.experts);
        STATUS_ASSERT(cpu::RouteTopK(shape, logits.data(),
                                     {ids.data(), weights.data(), counts.data(), sums.data()}));
        float aux = 0;
        STATUS_ASSERT(cpu::AuxLoss(shape, counts.data(), sums.data(), &aux));
        ASSERT_TRUE(BitEqual(d_ids.Download(), ids));
        EXPECT_TRUE(BitEqual(d_counts.Download(), counts));
        ExpectClose(d_weights.Download(), weights, 2e-6, "weights");
        ExpectClose(d_sums.Download(), sums, 1e-5, "prob_sums");
        EXPECT_NEAR(d_aux.Download()[0], aux, 1e-5 * aux);

        const std::vector<float> d_w = RandomFloat(tk);
        DeviceArray<float> d_dw(d_w), d_dlogits(c.tokens * c.experts, 0xFF);
        STATUS_ASSERT(cuda::RouteTopKBackward(shape, d_logits.get(), d_ids.get(), d_counts.get(),
                                              d_dw.get(), 0.01f, d_dlogits.get(), nullptr));
        std::vector<float> want(c.tokens * c.experts);
        STATUS_ASSERT(cpu::RouteTopKBackward(shape, logits.data(), ids.data(), counts.data(),
                                             d_w.data(), 0.01f, want.data()));
        ExpectClose(d_dlogits.Download(), want, 1e-5, "d_logits");
      }
    }
  }
}

TEST_F(RoutingGpu, DispatchPlanMatchesReference) {
  for (int64_t tokens : {1, 333, 4099, 8192}) {
    for (int experts : {8, 128, 512}) {
      for (int top_k : {1, 8, 16}) {
        if (top_k > experts) continue;
        SCOPED_TRACE(::testing::Message() << "T=" << tokens << " E=" << experts << " k=" << top_k);
        const DispatchPlanShape shape{tokens, experts, top_k};
        const int64_t n = tokens * top_k;
        // Skewed routing (many empty experts) plus a few out-of-range ids.
        std::vector<int32_t> ids(n);
        std::geometric_distribution<int> skew(8.0 / experts);
        for (auto& e : ids) e = skew(Rng()) % experts;
        std::uniform_int_distribution<int64_t> pick(0, n - 1);
        for (int i = 0; i < 3 && n > 10; ++i) ids[pick(Rng())] = i == 0 ? -1 : experts + i;
        DeviceArray<int32_t> d_ids(ids), d_offsets(experts + 1), d_slot(n), d_choice(n);
        DeviceArray<char> d_workspace(DispatchPlanWorkspaceBytes(shape));
        STATUS_ASSERT(cuda::BuildDispatchPlan(shape, d_ids.get(),
                                              {d_offsets.get(), d_slot.get(), d_choice.get()},
                                              d_workspace.get(), nullptr));
        auto offsets = Poisoned<int32_t>(experts + 1), slot = Poisoned<int32_t>(n),
             choice = Poisoned<int32_t>(n);
        STATUS_ASSERT(cpu::BuildDispatchPlan(shape, ids.data(),
                                             {offsets.data(), slot.data(), choice.data()}, nullptr));
        EXPECT_TRUE(BitEqual(d_offsets.Download(), offsets));
        EXPECT_TRUE(BitEqual(d_slot.Download(), slot));
        EXPECT_TRUE(BitEqual(d_choice.Download(), choice));
      }
    }
  }
}

TEST_F(RoutingGpu, RouterGemmMatchesReference) {
  const RouterGemmShape shape{520, 256, 64};
  for (int64_t tokens : {int64_t{517}, int64_t{8}}) {
    SCOPED_TRACE(::testing::Message() << "tokens " << tokens);
    absl::StatusOr<std::unique_ptr<cuda::RouterGemm>> gemm = cuda::RouterGemm::Create(shape);
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    const std::vector<Bf16> x = RandomBf16(shape.max_tokens * shape.hidden);
    const std::vector<Bf16> w = RandomBf16(shape.num_experts * shape.hidden, 0.05f);
    DeviceArray<Bf16> d_x(x), d_w(w);
    DeviceArray<float> d_logits(shape.max_tokens * shape.num_experts, 0xFF);
    STATUS_ASSERT((*gemm)->Logits(tokens, d_x.get(), d_w.get(), d_logits.get(), nullptr));
    std::vector<float> logits(tokens * shape.num_experts);
    STATUS_ASSERT(cpu::RouterLogits(shape, tokens, x.data(), w.data(), logits.data()));
    std::vector<float> got = d_logits.Download();
    got.resize(logits.size());
    ExpectClose(got, logits, 1e-5, "logits");

    const std::vector<float> g = RandomFloat(tokens * shape.num_experts);
    const std::vector<Bf16> dx_before = RandomBf16(tokens * shape.hidden);
    DeviceArray<float> d_g(g), d_dw(shape.num_experts * shape.hidden, 0xFF);
    DeviceArray<Bf16> d_dx(dx_before);
    STATUS_ASSERT((*gemm)->LogitsBackward(tokens, d_x.get(), d_w.get(), d_g.get(), d_dx.get(),
                                          /*accumulate_d_x=*/true, d_dw.get(), nullptr));
    std::vector<Bf16> dx = dx_before;
    std::vector<float> dw(shape.num_experts * shape.hidden);
    STATUS_ASSERT(cpu::RouterLogitsBackward(shape, tokens, x.data(), w.data(), g.data(), dx.data(),
                                            true, dw.data()));
    ExpectClose(d_dw.Download(), dw, 1e-5, "d_w");
    std::vector<float> got_dx, want_dx;
    for (Bf16 v : d_dx.Download()) got_dx.push_back(Bf16ToFloat(v));
    for (Bf16 v : dx) want_dx.push_back(Bf16ToFloat(v));
    ExpectClose(got_dx, want_dx, 4e-3, "d_x (bf16)");
  }
}

}  // namespace
}  // namespace dropless::kernels
