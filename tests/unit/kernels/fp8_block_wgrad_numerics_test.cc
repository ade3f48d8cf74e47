// What the weight gradient's activation scaling (fp8_block.h's Fp8ColwiseScaling: per column of a
// 128-token tile, the fp8-block recipe, or per 128 x 128 block, precision fp8-block-wgrad128)
// costs when a few channels of the activations are much larger than the rest, the "massive
// activations" of trained transformers that the synthetic training task does not have.
//
// dW = X^T dY over one expert's tokens, in fp64, from the operands as their column-wise fp8-block
// forms stand for them (the CPU reference's bits, which the CUDA quantizers match exactly), against
// the same product of the bf16 inputs: the recipe's own error, without the GEMM's fp32 sums. The
// error is measured on the rows of dW that belong to the ordinary channels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "absl/status/status.h"
#include "dropless/kernels/fp8_block.h"
#include "dropless/kernels/mxfp8.h"
#include "tests/unit/kernels/test_data.h"

namespace dropless::kernels {
namespace {

using testing::RandomBf16;

constexpr int64_t kRows = 1024, kK = 256, kN = 128;  // tokens, X's channels, dY's columns
constexpr int64_t kOutliers[] = {3, 200};            // one channel in each 128-channel block

// The column-wise form of x [kRows][cols] (one group of kRows tokens), dequantized to
// [kRows][cols].
std::vector<double> ColwiseDequantized(const std::vector<Bf16>& x, int64_t cols,
                                       Fp8ColwiseScaling scaling) {
  const int64_t padded_rows = Fp8ColwisePaddedRows(kRows, 1);
  std::vector<uint8_t> data(cols * padded_rows);
  std::vector<float> scales(padded_rows / kFp8Block * Fp8ColwiseScalesPerTile(cols, scaling));
  std::vector<int32_t> padded(2);
  const int32_t offsets[] = {0, static_cast<int32_t>(kRows)};
  Fp8BlockColwise colwise{data.data(), scales.data(), padded.data(), padded_rows, scaling};
  const absl::Status s = cpu::QuantizeFp8Block({kRows, cols, 1, Fp8ScaleMode::kFloat32}, x.data(),
                                               offsets, nullptr, &colwise);
  EXPECT_TRUE(s.ok()) << s;
  std::vector<double> out(kRows * cols);
  for (int64_t p = 0; p < kRows; ++p) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t tile = p / kFp8Block;
      const float scale = scaling == Fp8ColwiseScaling::kPerBlock
                              ? scales[tile * (cols / kFp8Block) + c / kFp8Block]
                              : scales[tile * cols + c];
      out[p * cols + c] = static_cast<double>(E4M3ToFloat(data[c * padded_rows + p])) * scale;
    }
  }
  return out;
}

std::vector<double> Exact(const std::vector<Bf16>& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = Bf16ToFloat(x[i]);
  return out;
}

// dW [kK][kN] = X^T dY in fp64.
std::vector<double> WeightGradient(const std::vector<double>& x, const std::vector<double>& dy) {
  std::vector<double> dw(kK * kN, 0.0);
  for (int64_t p = 0; p < kRows; ++p) {
    for (int64_t c = 0; c < kK; ++c) {
      const double xv = x[p * kK + c];
      for (int64_t j = 0; j < kN; ++j) dw[c * kN + j] += xv * dy[p * kN + j];
    }
  }
  return dw;
}

bool IsOutlier(int64_t c) { return c == kOutliers[0] || c == kOutliers[1]; }

// ||got - want|| / ||want|| over the ordinary channels' rows of dW.
double OrdinaryRowsError(const std::vector<double>& got, const std::vector<double>& want) {
  double err = 0, norm = 0;
  for (int64_t c = 0; c < kK; ++c) {
    if (IsOutlier(c)) continue;
    for (int64_t j = 0; j < kN; ++j) {
      const double d = got[c * kN + j] - want[c * kN + j];
      err += d * d;
      norm += want[c * kN + j] * want[c * kN + j];
    }
  }
  return std::sqrt(err / norm);
}

TEST(Fp8BlockWeightGradientNumerics, OutlierChannelsAndTheActivationScaling) {
  const std::vector<Bf16> x0 = RandomBf16(kRows * kK), dy = RandomBf16(kRows * kN);
  const std::vector<double> dy_q = ColwiseDequantized(dy, kN, Fp8ColwiseScaling::kPerColumn);
  const double factors[] = {1, 10, 100, 1000, 1e4, 1e5};
  constexpr int kFactors = 6;
  double per_column_error[kFactors], per_block_error[kFactors];
  for (int f = 0; f < kFactors; ++f) {
    std::vector<Bf16> x = x0;
    for (int64_t p = 0; p < kRows; ++p) {
      for (int64_t c : kOutliers) {
        x[p * kK + c] = FloatToBf16(Bf16ToFloat(x[p * kK + c]) * static_cast<float>(factors[f]));
      }
    }
    const std::vector<double> want = WeightGradient(Exact(x), Exact(dy));
    per_column_error[f] = OrdinaryRowsError(
        WeightGradient(ColwiseDequantized(x, kK, Fp8ColwiseScaling::kPerColumn), dy_q), want);
    per_block_error[f] = OrdinaryRowsError(
        WeightGradient(ColwiseDequantized(x, kK, Fp8ColwiseScaling::kPerBlock), dy_q), want);
    std::printf("outlier channels x%-5g  ordinary rows of dW: per column %.3e, per 128x128 block "
                "%.3e (%.2fx)\n",
                factors[f], per_column_error[f], per_block_error[f],
                per_block_error[f] / per_column_error[f]);
  }
  for (int f = 1; f < kFactors; ++f) {
    // Per column, the ordinary channels are quantized as if the outliers were not there.
    EXPECT_EQ(per_column_error[f], per_column_error[0]) << factors[f];
  }
  // Per block, one scale covers the outliers and 127 ordinary channels of a tile. E4M3's exponent
  // range (2^-9 .. 448) absorbs that up to about 1000x: the ordinary channels' values, scaled by
  // the outliers' amax, stay mostly normal (measured: 1.01-1.03x the per-column error); at
  // 10^4x a good part of them fall into E4M3's subnormals (1.27x measured), at 10^5x most of them
  // round to zero (about 10x).
  for (int f = 0; f < 4; ++f) {
    EXPECT_LT(per_block_error[f], 1.1 * per_column_error[f]) << factors[f];
  }
  EXPECT_GT(per_block_error[4], 1.1 * per_column_error[4]);
  EXPECT_LT(per_block_error[4], 1.6 * per_column_error[4]);
  EXPECT_GT(per_block_error[5], 5.0 * per_column_error[5]);
}

}  // namespace
}  // namespace dropless::kernels
