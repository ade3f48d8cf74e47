// The fused update's AdamW state order (dropless/kernels/fused_state_order.h): a bijection that
// keeps each expert's elements in the expert's own index range, and the place of every element in
// the piece of the consumer thread that holds it (the kernel's layout, wgrad_adamw_kernel.cuh).
#include "dropless/kernels/fused_state_order.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace dropless::kernels {
namespace {

TEST(FusedStateOrder, IsABijectionWithinEachExpert) {
  const int64_t experts = 3, k = 256, n = 384;
  std::vector<int> seen(experts * k * n, 0);
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t r = 0; r < k; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        const int64_t i = FusedStateIndex(e, r, c, k, n);
        ASSERT_GE(i, e * k * n);
        ASSERT_LT(i, (e + 1) * k * n);
        ++seen[i];
      }
    }
  }
  for (int s : seen) ASSERT_EQ(s, 1);
}

// Thread j = 32 w + lane of the epilogue's warpgroup holds, in piece q of a tile, rows
// 64 (q / 4) + 16 w + lane / 4 + 8 ((q / 2) % 2) and columns 64 (q % 2) + 8 ii + 2 (lane % 4)
// + {0, 1}; the fused order puts that pair at 2 (128 ii + j) of the piece.
TEST(FusedStateOrder, PutsEachThreadsColumnPairsTogether) {
  const int64_t k = 128, n = 256;
  for (int tile_col = 0; tile_col < 2; ++tile_col) {
    for (int q = 0; q < 8; ++q) {
      for (int j = 0; j < 128; ++j) {
        const int w = j / 32, lane = j % 32;
        for (int ii = 0; ii < 8; ++ii) {
          for (int b = 0; b < 2; ++b) {
            const int64_t r = 64 * (q / 4) + 16 * w + lane / 4 + 8 * ((q / 2) % 2);
            const int64_t c = 128 * tile_col + 64 * (q % 2) + 8 * ii + 2 * (lane % 4) + b;
            const int64_t want = (tile_col * 8 + q) * kFusedStatePiece + 2 * (128 * ii + j) + b;
            ASSERT_EQ(FusedStateIndex(0, r, c, k, n), want) << "q " << q << " j " << j;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace dropless::kernels
