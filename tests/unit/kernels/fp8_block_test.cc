// fp8-block reference: hand-computed scales, error bounds of the dequantized values against the
// inputs (fp64), and the row-wise, column-wise and weight layouts element by element.
#include "dropless/kernels/fp8_block.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "dropless/kernels/mxfp8.h"
#include "tests/unit/kernels/test_data.h"

namespace dropless::kernels {
namespace {

using testing::RandomBf16WideRange;
using testing::Rng;

constexpr Fp8ScaleMode kModes[] = {Fp8ScaleMode::kFloat32, Fp8ScaleMode::kPowerOfTwo};

// |element * scale - v| within E4M3's rounding of v * inverse: half a step of 3 mantissa bits for
// normals, half the subnormal quantum 2^-9 below 2^-6 (both scaled back), plus the scale's own fp32
// rounding in kFloat32 mode.
void ExpectClose(uint8_t element, float scale, float v, const char* where) {
  const double got = static_cast<double>(E4M3ToFloat(element)) * scale;
  const double y = std::fabs(static_cast<double>(v)) / scale;  // |v * inverse|, up to ~448
  const double half_step = y >= std::ldexp(1.0, -6) ? y * std::ldexp(1.0, -4) : std::ldexp(1.0, -10);
  const double tolerance = (half_step * (1 + 1e-6) + y * 1e-6) * scale;
  EXPECT_LE(std::fabs(got - v), tolerance) << where << ": element " << int(element) << " scale "
                                           << scale << " input " << v;
}

TEST(Fp8BlockScalar, ScalesForAmaxHandComputed) {
  Fp8BlockScale s = Fp8BlockScaleForAmax(448.0f, Fp8ScaleMode::kFloat32);
  EXPECT_EQ(s.scale, 1.0f);
  EXPECT_EQ(s.inverse, 1.0f);
  s = Fp8BlockScaleForAmax(3.5f, Fp8ScaleMode::kFloat32);
  EXPECT_EQ(s.scale, 3.5f / 448.0f);
  EXPECT_EQ(s.inverse, 128.0f);
  s = Fp8BlockScaleForAmax(0.0f, Fp8ScaleMode::kFloat32);  // an all-zero tile: finite, tiny
  EXPECT_EQ(s.scale, kFp8BlockMinAmax / 448.0f);
  EXPECT_TRUE(std::isfinite(s.inverse));

  s = Fp8BlockScaleForAmax(448.0f, Fp8ScaleMode::kPowerOfTwo);
  EXPECT_EQ(s.scale, 1.0f);
  s = Fp8BlockScaleForAmax(449.0f, Fp8ScaleMode::kPowerOfTwo);
  EXPECT_EQ(s.scale, 2.0f);
  s = Fp8BlockScaleForAmax(1.0f, Fp8ScaleMode::kPowerOfTwo);  // 448 / 2^8 = 1.75 >= 1 > 0.875
  EXPECT_EQ(s.scale, std::ldexp(1.0f, -8));
  EXPECT_EQ(s.inverse, 256.0f);
  s = Fp8BlockScaleForAmax(1.75f, Fp8ScaleMode::kPowerOfTwo);  // exactly 448 * 2^-8
  EXPECT_EQ(s.scale, std::ldexp(1.0f, -8));
  s = Fp8BlockScaleForAmax(std::ldexp(1.0f, -133), Fp8ScaleMode::kPowerOfTwo);  // bf16's least
  EXPECT_EQ(s.scale, std::ldexp(1.0f, -108));  // clamped to 2^-100 = 0.5 * 2^-99: 2^(-99 - 9)
  EXPECT_EQ(s.inverse, std::ldexp(1.0f, 108));
  s = Fp8BlockScaleForAmax(3.0e38f, Fp8ScaleMode::kPowerOfTwo);
  EXPECT_TRUE(std::isfinite(s.inverse) && s.inverse > 0);

  for (Fp8ScaleMode mode : kModes) {
    EXPECT_TRUE(std::isnan(Fp8BlockScaleForAmax(NAN, mode).scale));
    EXPECT_TRUE(std::isnan(Fp8BlockScaleForAmax(INFINITY, mode).scale));
  }
  // Power-of-two scales: the smallest one that fits amax, for amax over the whole bf16 range.
  std::uniform_real_distribution<float> frac(0.5f, 1.0f);
  std::uniform_int_distribution<int> exp(-120, 120);
  for (int i = 0; i < 1000; ++i) {
    const float amax = Bf16ToFloat(FloatToBf16(std::ldexp(frac(Rng()), exp(Rng()))));
    const Fp8BlockScale p = Fp8BlockScaleForAmax(amax, Fp8ScaleMode::kPowerOfTwo);
    const double a = std::max(amax, kFp8BlockMinAmax);
    EXPECT_LE(a, 448.0 * p.scale) << amax;
    EXPECT_GT(a, 224.0 * p.scale) << amax;
    EXPECT_EQ(static_cast<double>(p.scale) * p.inverse, 1.0) << amax;
  }
}

TEST(Fp8BlockQuantize, RowwiseTilesMatchTheFormulaAndTheirInputs) {
  for (Fp8ScaleMode mode : kModes) {
    const int64_t rows = 37, cols = 384;
    std::vector<Bf16> x = RandomBf16WideRange(rows * cols, 30);
    std::vector<uint8_t> data(rows * cols, 0xAB);
    std::vector<float> scales(rows * cols / kFp8Block, -1.0f);
    Fp8BlockRowwise rowwise{data.data(), scales.data()};
    const int32_t offsets[] = {0, 5, 5, 30};  // rows 30.. are past the groups: untouched
    Fp8BlockQuantizeShape shape{rows, cols, 3, mode};
    ASSERT_TRUE(cpu::QuantizeFp8Block(shape, x.data(), offsets, &rowwise, nullptr).ok());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < cols / kFp8Block; ++j) {
        const float scale = scales[r * (cols / kFp8Block) + j];
        if (r >= 30) {
          EXPECT_EQ(scale, -1.0f);
          for (int i = 0; i < kFp8Block; ++i) EXPECT_EQ(data[r * cols + j * kFp8Block + i], 0xAB);
          continue;
        }
        float amax = 0;
        for (int i = 0; i < kFp8Block; ++i) {
          amax = std::max(amax, std::fabs(Bf16ToFloat(x[r * cols + j * kFp8Block + i])));
        }
        const Fp8BlockScale want = Fp8BlockScaleForAmax(amax, mode);
        ASSERT_EQ(scale, want.scale) << r << "," << j;
        int largest = 0;
        for (int i = 0; i < kFp8Block; ++i) {
          const int64_t at = r * cols + j * kFp8Block + i;
          ASSERT_EQ(data[at], FloatToE4M3(Bf16ToFloat(x[at]) * want.inverse)) << at;
          ExpectClose(data[at], scale, Bf16ToFloat(x[at]), "rowwise");
          largest = std::max(largest, data[at] & 0x7F);
        }
        // The tile's largest element lands on the top of the E4M3 range: 448 (fp32 scales) or
        // above 224 (power-of-two scales).
        if (amax >= kFp8BlockMinAmax) {
          EXPECT_GE(E4M3ToFloat(static_cast<uint8_t>(largest)),
                    mode == Fp8ScaleMode::kFloat32 ? 448.0f : 224.0f);
        }
      }
    }
    std::vector<float> back(rows * cols, -7.0f);
    const int32_t live = 30;
    ASSERT_TRUE(cpu::DequantizeFp8BlockRowwise(rows, cols, &live, data.data(), scales.data(),
                                               back.data()).ok());
    EXPECT_EQ(back[29 * cols + 3], E4M3ToFloat(data[29 * cols + 3]) * scales[29 * 3]);
    EXPECT_EQ(back[30 * cols], -7.0f);
  }
}

TEST(Fp8BlockQuantize, ColumnwiseGroupsArePaddedTransposedAndZeroFilled) {
  const std::vector<int32_t> counts = {0, 1, 127, 128, 129, 300, 0};
  std::vector<int32_t> offsets = {0};
  for (int32_t c : counts) offsets.push_back(offsets.back() + c);
  const int num_groups = static_cast<int>(counts.size());
  const int64_t rows = offsets.back() + 9, cols = 256;  // 9 rows past the groups
  const int64_t p = Fp8ColwisePaddedRows(rows, num_groups);
  for (Fp8ScaleMode mode : kModes) {
    std::vector<Bf16> x = RandomBf16WideRange(rows * cols, 20);
    std::vector<uint8_t> data(cols * p, 0xAB);
    std::vector<float> scales(p / kFp8Block * cols, -1.0f);
    std::vector<int32_t> padded(num_groups + 1, -1);
    Fp8BlockColwise colwise{data.data(), scales.data(), padded.data(), p};
    Fp8BlockQuantizeShape shape{rows, cols, num_groups, mode};
    ASSERT_TRUE(cpu::QuantizeFp8Block(shape, x.data(), offsets.data(), nullptr, &colwise).ok());
    int32_t want_padded = 0;
    for (int g = 0; g < num_groups; ++g) {
      ASSERT_EQ(padded[g], want_padded) << g;
      want_padded += (counts[g] + kFp8Block - 1) / kFp8Block * kFp8Block;
    }
    ASSERT_EQ(padded[num_groups], want_padded);
    for (int g = 0; g < num_groups; ++g) {
      for (int64_t b = 0; b < padded[g + 1] - padded[g]; b += kFp8Block) {
        const int64_t tile_row = (padded[g] + b) / kFp8Block;
        for (int64_t c = 0; c < cols; ++c) {
          float amax = 0;
          for (int64_t i = b; i < std::min<int64_t>(b + kFp8Block, counts[g]); ++i) {
            amax = std::max(amax, std::fabs(Bf16ToFloat(x[(offsets[g] + i) * cols + c])));
          }
          const Fp8BlockScale want = Fp8BlockScaleForAmax(amax, mode);
          ASSERT_EQ(scales[tile_row * cols + c], want.scale) << g << "," << b << "," << c;
          for (int64_t i = b; i < b + kFp8Block; ++i) {
            const uint8_t got = data[c * p + padded[g] + i];
            if (i >= counts[g]) {
              ASSERT_EQ(got, 0x00) << "padding of group " << g;
              continue;
            }
            const float v = Bf16ToFloat(x[(offsets[g] + i) * cols + c]);
            ASSERT_EQ(got, FloatToE4M3(v * want.inverse)) << g << "," << i << "," << c;
            ExpectClose(got, want.scale, v, "colwise");
          }
        }
      }
    }
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t q = padded[num_groups]; q < p; ++q) ASSERT_EQ(data[c * p + q], 0xAB);
    }
    for (int64_t q = padded[num_groups] / kFp8Block * cols; q < p / kFp8Block * cols; ++q) {
      ASSERT_EQ(scales[q], -1.0f);
    }
  }
}

// Fp8ColwiseScaling::kPerBlock: one scale per 128 x 128 block of a padded tile, from the block's
// live rows only, at scales[tile_row * cols / 128 + column block]; a NaN poisons its block only.
TEST(Fp8BlockQuantize, ColumnwisePerBlockScalesEachBlockOfATile) {
  const std::vector<int32_t> counts = {129, 0, 50};
  const std::vector<int32_t> offsets = {0, 129, 129, 179};
  const int num_groups = 3;
  const int64_t rows = 179, cols = 384, blocks = cols / kFp8Block;
  const int64_t p = Fp8ColwisePaddedRows(rows, num_groups);
  for (Fp8ScaleMode mode : kModes) {
    std::vector<Bf16> x = RandomBf16WideRange(rows * cols, 20);
    x[(129 + 7) * cols + 300] = Bf16{0x7FC0};  // NaN in group 2's tile, column block 2
    std::vector<uint8_t> data(cols * p, 0xAB);
    std::vector<float> scales(p / kFp8Block * cols, -1.0f);
    std::vector<int32_t> padded(num_groups + 1, -1);
    Fp8BlockColwise colwise{data.data(), scales.data(), padded.data(), p,
                            Fp8ColwiseScaling::kPerBlock};
    ASSERT_TRUE(cpu::QuantizeFp8Block({rows, cols, num_groups, mode}, x.data(), offsets.data(),
                                      nullptr, &colwise)
                    .ok());
    ASSERT_EQ(padded, (std::vector<int32_t>{0, 256, 256, 384}));
    // (group, first row in the group, padded tile row) of every tile.
    for (auto [g, b, tile_row] : {std::tuple{0, 0, 0}, std::tuple{0, 128, 1}, std::tuple{2, 0, 2}}) {
      const int64_t live = std::min<int64_t>(kFp8Block, counts[g] - b);
      for (int64_t j = 0; j < blocks; ++j) {
        float amax = 0;
        bool nan = false;
        for (int64_t i = 0; i < live; ++i) {
          for (int64_t c = j * kFp8Block; c < (j + 1) * kFp8Block; ++c) {
            const float v = std::fabs(Bf16ToFloat(x[(offsets[g] + b + i) * cols + c]));
            nan = nan || std::isnan(v);
            amax = std::max(amax, v);
          }
        }
        const float got_scale = scales[tile_row * blocks + j];
        ASSERT_EQ(nan, g == 2 && j == 2) << tile_row << "," << j;
        if (nan) {
          ASSERT_TRUE(std::isnan(got_scale));
        } else {
          ASSERT_EQ(got_scale, Fp8BlockScaleForAmax(amax, mode).scale) << tile_row << "," << j;
        }
        const Fp8BlockScale want = Fp8BlockScaleForAmax(nan ? NAN : amax, mode);
        for (int64_t c = j * kFp8Block; c < (j + 1) * kFp8Block; ++c) {
          for (int64_t i = 0; i < kFp8Block; ++i) {
            const uint8_t got = data[c * p + padded[g] + b + i];
            if (nan) {
              ASSERT_EQ(got, kE4M3Nan);
            } else if (i >= live) {
              ASSERT_EQ(got, 0x00) << "padding";
            } else {
              const float v = Bf16ToFloat(x[(offsets[g] + b + i) * cols + c]);
              ASSERT_EQ(got, FloatToE4M3(v * want.inverse)) << tile_row << "," << i << "," << c;
            }
          }
        }
      }
    }
    // Past the tiles' per-block scales, the buffer is untouched.
    for (int64_t q = 3 * blocks; q < p / kFp8Block * cols; ++q) ASSERT_EQ(scales[q], -1.0f);
  }
}

TEST(Fp8BlockQuantize, NonFiniteInputsPoisonOnlyTheirTile) {
  const int64_t rows = 130, cols = 256;
  std::vector<Bf16> x = RandomBf16WideRange(rows * cols, 4);
  x[3 * cols + 200] = FloatToBf16(NAN);       // row 3, second row tile; column 200's first tile
  x[129 * cols + 5] = FloatToBf16(INFINITY);  // row 129; column 5's second tile (group 1)
  std::vector<uint8_t> rdata(rows * cols), cdata(cols * 384, 0xAB);
  std::vector<float> rscales(rows * 2), cscales(3 * cols);
  std::vector<int32_t> padded(3);
  Fp8BlockRowwise rowwise{rdata.data(), rscales.data()};
  Fp8BlockColwise colwise{cdata.data(), cscales.data(), padded.data(), 384};
  const int32_t offsets[] = {0, 128, 130};
  Fp8BlockQuantizeShape shape{rows, cols, 2, Fp8ScaleMode::kFloat32};
  ASSERT_TRUE(cpu::QuantizeFp8Block(shape, x.data(), offsets, &rowwise, &colwise).ok());
  EXPECT_TRUE(std::isnan(rscales[3 * 2 + 1]));
  EXPECT_FALSE(std::isnan(rscales[3 * 2 + 0]));
  for (int i = 128; i < 256; ++i) EXPECT_EQ(rdata[3 * cols + i], kE4M3Nan);
  EXPECT_TRUE(std::isnan(rscales[129 * 2 + 0]));
  EXPECT_TRUE(std::isnan(cscales[0 * cols + 200]));
  EXPECT_FALSE(std::isnan(cscales[0 * cols + 201]));
  EXPECT_TRUE(std::isnan(cscales[1 * cols + 5]));  // group 1's only tile row
  for (int i = 0; i < 128; ++i) EXPECT_EQ(cdata[5 * 384 + 128 + i], kE4M3Nan);  // padding too
}

TEST(Fp8BlockQuantize, WeightBlocksInBothOrientations) {
  for (Fp8ScaleMode mode : kModes) {
    const int experts = 3;
    const int64_t k = 256, n = 384;
    std::vector<Bf16> w = RandomBf16WideRange(experts * k * n, 12);
    std::vector<uint8_t> data(experts * k * n), data_t(experts * k * n);
    std::vector<float> scales(experts * 2 * 3), scales_t(experts * 3 * 2);
    Fp8BlockWeights out{data.data(), scales.data(), data_t.data(), scales_t.data()};
    ASSERT_TRUE(cpu::QuantizeFp8BlockWeights({experts, k, n, mode}, w.data(), out).ok());
    for (int e = 0; e < experts; ++e) {
      for (int64_t i = 0; i < 2; ++i) {
        for (int64_t j = 0; j < 3; ++j) {
          float amax = 0;
          for (int64_t r = 0; r < 128; ++r) {
            for (int64_t c = 0; c < 128; ++c) {
              amax = std::max(amax,
                              std::fabs(Bf16ToFloat(w[(e * k + i * 128 + r) * n + j * 128 + c])));
            }
          }
          const Fp8BlockScale want = Fp8BlockScaleForAmax(amax, mode);
          ASSERT_EQ(scales[(e * 2 + i) * 3 + j], want.scale);
          ASSERT_EQ(scales_t[(e * 3 + j) * 2 + i], want.scale);
        }
      }
      for (int64_t r = 0; r < k; ++r) {
        for (int64_t c = 0; c < n; ++c) {
          const int64_t at = (e * k + r) * n + c;
          const float scale = scales[(e * 2 + r / 128) * 3 + c / 128];
          ASSERT_EQ(data[at], data_t[(e * n + c) * k + r]);
          ExpectClose(data[at], scale, Bf16ToFloat(w[at]), "weights");
        }
      }
    }
    // One orientation alone.
    std::vector<uint8_t> only_t(experts * k * n);
    std::vector<float> only_scales_t(experts * 6);
    Fp8BlockWeights half{nullptr, nullptr, only_t.data(), only_scales_t.data()};
    ASSERT_TRUE(cpu::QuantizeFp8BlockWeights({experts, k, n, mode}, w.data(), half).ok());
    EXPECT_EQ(only_t, data_t);
    EXPECT_EQ(only_scales_t, scales_t);
  }
}

TEST(Fp8BlockQuantize, PermuteQuantizesEachTokenOnceIntoItsSlots) {
  const PermuteShape shape{6, 256, 2};
  std::vector<Bf16> x = RandomBf16WideRange(shape.num_tokens * shape.hidden, 10);
  // Token t's choices go to slots 2t and 2t+1, except token 4's second choice (dropped: -1).
  std::vector<int32_t> slots = {0, 1, 2, 3, 4, 5, 6, 7, 8, -1, 10, 11};
  const int64_t rows = 12;
  std::vector<uint8_t> data(rows * shape.hidden, 0xAB);
  std::vector<float> scales(rows * 2, -1.0f);
  ASSERT_TRUE(cpu::PermuteFp8Block(shape, x.data(), slots.data(), {data.data(), scales.data()},
                                   Fp8ScaleMode::kPowerOfTwo).ok());
  std::vector<uint8_t> want(shape.num_tokens * shape.hidden);
  std::vector<float> want_scales(shape.num_tokens * 2);
  Fp8BlockRowwise rowwise{want.data(), want_scales.data()};
  ASSERT_TRUE(cpu::QuantizeFp8Block({shape.num_tokens, shape.hidden, 1, Fp8ScaleMode::kPowerOfTwo},
                                    x.data(), nullptr, &rowwise, nullptr).ok());
  for (int64_t slot = 0; slot < rows; ++slot) {
    const int64_t t = slot / 2;
    for (int64_t c = 0; c < shape.hidden; ++c) {
      if (slot == 9) {
        ASSERT_EQ(data[slot * shape.hidden + c], 0xAB) << "a dropped slot stays untouched";
      } else {
        ASSERT_EQ(data[slot * shape.hidden + c], want[t * shape.hidden + c]) << slot << "," << c;
      }
    }
    EXPECT_EQ(scales[slot * 2], slot == 9 ? -1.0f : want_scales[t * 2]);
  }
  // Dequantized to bf16: the float product rounded once.
  std::vector<Bf16> back(rows * shape.hidden);
  ASSERT_TRUE(cpu::DequantizeFp8BlockRowwise(rows, shape.hidden, nullptr, data.data(),
                                             scales.data(), back.data()).ok());
  EXPECT_EQ(back[3 * shape.hidden + 130].bits,
            FloatToBf16(E4M3ToFloat(data[3 * shape.hidden + 130]) * scales[3 * 2 + 1]).bits);
  EXPECT_FALSE(cpu::PermuteFp8Block({6, 192, 2}, x.data(), slots.data(),
                                    {data.data(), scales.data()}, Fp8ScaleMode::kFloat32).ok());
}

TEST(Fp8BlockQuantize, BadArgumentsNameTheField) {
  std::vector<Bf16> x(256 * 4);
  std::vector<uint8_t> data(256 * 4);
  std::vector<float> scales(16);
  Fp8BlockRowwise rowwise{data.data(), scales.data()};
  absl::Status s = cpu::QuantizeFp8Block({4, 100, 1}, x.data(), nullptr, &rowwise, nullptr);
  EXPECT_NE(s.message().find("cols"), std::string::npos) << s;
  s = cpu::QuantizeFp8Block({4, 256, 1}, x.data(), nullptr, nullptr, nullptr);
  EXPECT_NE(s.message().find("rowwise"), std::string::npos) << s;
  std::vector<int32_t> padded(2);
  Fp8BlockColwise colwise{data.data(), scales.data(), padded.data(), 64};
  s = cpu::QuantizeFp8Block({4, 256, 1}, x.data(), nullptr, nullptr, &colwise);
  EXPECT_NE(s.message().find("colwise.padded_rows"), std::string::npos) << s;
  const int32_t offsets[] = {0, 5};
  s = cpu::QuantizeFp8Block({4, 256, 1}, x.data(), offsets, &rowwise, nullptr);
  EXPECT_NE(s.message().find("group_offsets"), std::string::npos) << s;
  Fp8BlockWeights out{data.data(), scales.data(), nullptr, nullptr};
  s = cpu::QuantizeFp8BlockWeights({1, 100, 128}, x.data(), out);
  EXPECT_NE(s.message().find("k:"), std::string::npos) << s;
  Fp8BlockWeights partial{data.data(), nullptr, nullptr, nullptr};
  s = cpu::QuantizeFp8BlockWeights({1, 128, 128}, x.data(), partial);
  EXPECT_NE(s.message().find("out.data"), std::string::npos) << s;
}

}  // namespace
}  // namespace dropless::kernels
