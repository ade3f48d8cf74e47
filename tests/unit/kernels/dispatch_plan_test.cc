// Dispatch plan reference against a stable sort of the choices by expert.
#include "dropless/kernels/dispatch_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "tests/unit/kernels/test_data.h"

namespace dropless::kernels {
namespace {

using testing::Rng;

TEST(DispatchPlan, MatchesStableSortWithEmptyAndSkewedExperts) {
  for (int experts : {1, 7, 64, 512}) {
    for (int top_k : {1, 3, 8}) {
      if (top_k > experts) continue;
      const int64_t tokens = 301;
      // Skewed: most choices go to a handful of experts, many experts get none.
      std::vector<int32_t> ids(tokens * top_k);
      std::geometric_distribution<int> skew(0.3);
      for (auto& e : ids) e = std::min(skew(Rng()), experts - 1);
      DispatchPlanShape shape{tokens, experts, top_k};
      std::vector<int32_t> offsets(experts + 1, -9), slot_of(ids.size(), -9), choice_of(ids.size(), -9);
      ASSERT_TRUE(cpu::BuildDispatchPlan(shape, ids.data(),
                                         {offsets.data(), slot_of.data(), choice_of.data()}, nullptr)
                      .ok());
      std::vector<int32_t> order(ids.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return ids[a] < ids[b]; });
      EXPECT_EQ(choice_of, order);
      for (size_t s = 0; s < order.size(); ++s) EXPECT_EQ(slot_of[order[s]], static_cast<int>(s));
      EXPECT_EQ(offsets[0], 0);
      for (int e = 0; e < experts; ++e) {
        EXPECT_EQ(offsets[e + 1] - offsets[e], std::count(ids.begin(), ids.end(), e));
      }
    }
  }
}

TEST(DispatchPlan, OutOfRangeExpertsGetNoSlot) {
  const std::vector<int32_t> ids = {2, -1, 0, 5, 2, 0};
  std::vector<int32_t> offsets(4), slot_of(6), choice_of(6, -9);
  ASSERT_TRUE(cpu::BuildDispatchPlan({3, 3, 2}, ids.data(),
                                     {offsets.data(), slot_of.data(), choice_of.data()}, nullptr)
                  .ok());
  EXPECT_EQ(offsets, (std::vector<int32_t>{0, 2, 2, 4}));
  EXPECT_EQ(slot_of, (std::vector<int32_t>{2, -1, 0, -1, 3, 1}));
  EXPECT_EQ(choice_of, (std::vector<int32_t>{2, 5, 0, 4, -9, -9}));
}

TEST(DispatchPlan, WorkspaceCoversChunks) {
  EXPECT_EQ(DispatchPlanWorkspaceBytes({8192, 256, 8}), 64u * 256 * 4);
  EXPECT_EQ(DispatchPlanWorkspaceBytes({0, 4, 1}), 4u * 4);
  EXPECT_FALSE(ValidateDispatchPlanShape({10, 0, 1}).ok());
}

}  // namespace
}  // namespace dropless::kernels
