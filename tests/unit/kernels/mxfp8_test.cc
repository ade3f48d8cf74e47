// MXFP8 reference: hand-computed cases (the OCP MX v1.0 format with mxfp8.h's scale rule), an
// independent fp64 formulation (nearest E4M3 value by enumeration), and the row-/column-wise
// layouts.
#include "dropless/kernels/mxfp8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tests/unit/kernels/test_data.h"

namespace dropless::kernels {
namespace {

using testing::RandomBf16WideRange;
using testing::Rng;

Bf16 B(float v) { return FloatToBf16(v); }

TEST(Mxfp8Scalar, E4M3HandComputed) {
  EXPECT_EQ(FloatToE4M3(1.0f), 0x38);          // exponent 7 (bias 7), mantissa 0
  EXPECT_EQ(FloatToE4M3(448.0f), 0x7E);        // largest finite: 1.75 * 2^8
  EXPECT_EQ(FloatToE4M3(-448.0f), 0xFE);
  EXPECT_EQ(FloatToE4M3(0.015625f), 0x08);     // 2^-6, smallest normal
  EXPECT_EQ(FloatToE4M3(std::ldexp(1.0f, -9)), 0x01);  // smallest subnormal
  EXPECT_EQ(FloatToE4M3(std::ldexp(7.0f, -9)), 0x07);  // largest subnormal
  EXPECT_EQ(FloatToE4M3(0.0f), 0x00);
  EXPECT_EQ(FloatToE4M3(-0.0f), 0x80);
  // Round to nearest, ties to even.
  EXPECT_EQ(FloatToE4M3(1.0625f), 0x38);       // halfway 1 .. 1.125 -> 1 (even)
  EXPECT_EQ(FloatToE4M3(1.1875f), 0x3A);       // halfway 1.125 .. 1.25 -> 1.25 (even)
  EXPECT_EQ(FloatToE4M3(1.06f), 0x38);         // just below halfway
  EXPECT_EQ(FloatToE4M3(1.07f), 0x39);         // just above halfway
  EXPECT_EQ(FloatToE4M3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal -> 0 (even)
  EXPECT_EQ(FloatToE4M3(std::ldexp(1.5f, -9)), 0x02);   // 1.5 quanta -> 2
  EXPECT_EQ(FloatToE4M3(std::ldexp(2.5f, -9)), 0x02);   // 2.5 quanta -> 2
  EXPECT_EQ(FloatToE4M3(-std::ldexp(1.0f, -11)), 0x80); // underflow keeps the sign
  EXPECT_EQ(FloatToE4M3(15.0f), 0x57);         // 1.875 * 2^3
  EXPECT_EQ(FloatToE4M3(15.5f), 0x58);         // halfway 15 (odd) .. 16 (even) -> 16
  // Saturation: everything past 448 clamps (no NaN for finite inputs), Inf too.
  EXPECT_EQ(FloatToE4M3(464.0f), 0x7E);
  EXPECT_EQ(FloatToE4M3(1e30f), 0x7E);
  EXPECT_EQ(FloatToE4M3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(FloatToE4M3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(FloatToE4M3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
}

TEST(Mxfp8Scalar, E4M3DecodeRoundTripsEveryCode) {
  for (int code = 0; code < 256; ++code) {
    const float v = E4M3ToFloat(static_cast<uint8_t>(code));
    if ((code & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << code;
      continue;
    }
    EXPECT_EQ(FloatToE4M3(v), code) << "code " << code << " value " << v;
  }
  EXPECT_EQ(E4M3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(E4M3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(E4M3ToFloat(0xB8), -1.0f);
}

TEST(Mxfp8Scalar, E8M0ScaleHandComputed) {
  EXPECT_EQ(E8M0ScaleForAmax(B(448.0f)), 127);   // ceil(log2(448 / 448)) = 0 -> X = 2^0
  EXPECT_EQ(E8M0ScaleForAmax(B(1.0f)), 119);     // ceil(log2(1 / 448)) = -8 -> X = 2^-8
  EXPECT_EQ(E8M0ScaleForAmax(B(1.75f)), 119);    // 1.75 / 2^-8 = 448 fits: the spec's scale
  EXPECT_EQ(E8M0ScaleForAmax(B(1.7578125f)), 120);  // fraction 97 / 128: 450 / 2^-8 would saturate
  EXPECT_EQ(E8M0ScaleForAmax(B(1.99f)), 120);    // rounds up where the spec's floor gives 119
  EXPECT_EQ(E8M0ScaleForAmax(B(-2.0f)), 120);    // sign ignored
  EXPECT_EQ(E8M0ScaleForAmax(B(0.0f)), 0);       // zero block: X = 2^-127
  EXPECT_EQ(E8M0ScaleForAmax(B(std::ldexp(1.0f, -119))), 0);  // ceil(-127.8) = -127: no clamp
  EXPECT_EQ(E8M0ScaleForAmax(B(std::ldexp(1.0f, -120))), 0);  // ceil(-128.8) = -128 -> clamp
  EXPECT_EQ(E8M0ScaleForAmax(B(std::ldexp(1.0f, -118))), 1);
  EXPECT_EQ(E8M0ScaleForAmax(B(std::ldexp(1.75f, 127))), 246);  // 448 * 2^119: the top scale
  EXPECT_EQ(E8M0ScaleForAmax(Bf16{0x7F7F}), 246);  // bf16 max: 127 - 7 + 127 = 247, capped
  EXPECT_EQ(E8M0ScaleForAmax(Bf16{0x7F80}), kE8M0Nan);  // Inf
  EXPECT_EQ(E8M0ScaleForAmax(Bf16{0xFFC0}), kE8M0Nan);  // NaN
  EXPECT_EQ(E8M0ToFloat(127), 1.0f);
  EXPECT_EQ(E8M0ToFloat(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(E8M0ToFloat(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(E8M0ToFloat(kE8M0Nan)));
}

struct Block {
  std::vector<Bf16> v = std::vector<Bf16>(kMxBlock, Bf16{0});
  uint8_t scale = 0xAA;
  std::vector<uint8_t> p = std::vector<uint8_t>(kMxBlock, 0xAA);
  void Quantize() { QuantizeMxBlock(v.data(), 1, p.data(), 1, &scale); }
};

TEST(Mxfp8Block, HandComputedCases) {
  Block b;
  b.v[0] = B(1.0f);
  b.v[1] = B(0.5f);
  b.v[2] = B(-0.25f);
  b.v[3] = B(1.0f / 1024);  // 2^-10 / 2^-8 = 2^-2 -> exponent 5: 0x28
  b.Quantize();
  EXPECT_EQ(b.scale, 119);  // X = 2^-8
  EXPECT_EQ(b.p[0], 0x78);  // 256 = 2^8 -> exponent 15, mantissa 0
  EXPECT_EQ(b.p[1], 0x70);  // 128
  EXPECT_EQ(b.p[2], 0xE8);  // -64
  EXPECT_EQ(b.p[3], 0x28);  // 0.25
  EXPECT_EQ(b.p[4], 0x00);

  Block top;  // amax 1.9375: X = 2^-7 (the spec's floor, 2^-8, would saturate 496 to 448)
  top.v[0] = B(1.9375f);
  top.v[1] = B(-1.9375f);
  top.v[2] = B(1.75f);
  top.Quantize();
  EXPECT_EQ(top.scale, 120);
  EXPECT_EQ(top.p[0], 0x78);  // 248: halfway 240 .. 256 -> 256 (even)
  EXPECT_EQ(top.p[1], 0xF8);
  EXPECT_EQ(top.p[2], 0x76);  // 224 = 1.75 * 2^7
  EXPECT_EQ(MxElementValue(top.p[0], top.scale), 2.0f);
  EXPECT_EQ(MxElementValue(top.p[2], top.scale), 1.75f);

  Block zero;  // all zeros (with signs): scale 2^-127, elements keep their sign
  for (int i = 0; i < kMxBlock; i += 2) zero.v[i] = B(-0.0f);
  zero.Quantize();
  EXPECT_EQ(zero.scale, 0);
  for (int i = 0; i < kMxBlock; ++i) EXPECT_EQ(zero.p[i], i % 2 == 0 ? 0x80 : 0x00) << i;

  Block tiny;  // bf16 subnormal 2^-130: scale clamps at 2^-127, element 2^-3
  for (auto& x : tiny.v) x = Bf16{0x0008};
  tiny.Quantize();
  EXPECT_EQ(tiny.scale, 0);
  for (uint8_t p : tiny.p) EXPECT_EQ(p, 0x20);

  // bf16 max: the scale is capped at X = 2^119 (2^120 would round 255 up to 256 * 2^120 = 2^128,
  // past fp32), so 0x7F7F / 2^119 = 1.9921875 * 2^8 saturates to 448: the one case that does.
  Block huge;
  huge.v[5] = Bf16{0x7F7F};
  huge.v[6] = B(std::ldexp(1.0f, 119));
  huge.Quantize();
  EXPECT_EQ(huge.scale, 246);
  EXPECT_EQ(huge.p[5], 0x7E);
  EXPECT_EQ(huge.p[6], 0x38);
  EXPECT_TRUE(std::isfinite(MxElementValue(huge.p[5], huge.scale)));

  for (uint16_t special : {uint16_t{0x7FC0}, uint16_t{0x7F80}, uint16_t{0xFF80}}) {
    Block nan_block;  // NaN or +-Inf anywhere: NaN scale, every element NaN
    nan_block.v[0] = B(3.0f);
    nan_block.v[17] = Bf16{special};
    nan_block.Quantize();
    EXPECT_EQ(nan_block.scale, kE8M0Nan);
    for (uint8_t p : nan_block.p) EXPECT_EQ(p, kE4M3Nan);
    EXPECT_TRUE(std::isnan(MxElementValue(nan_block.p[0], nan_block.scale)));
  }
}

// Independent formulation: shared exponent ceil(log2(amax / 448)) in double (within [-127, 119]),
// element = the E4M3 value nearest to V / X found by enumerating every finite code (ties to the
// even code), clamped to 448.
uint8_t NearestE4M3ByEnumeration(double x) {
  if (std::fabs(x) >= 448.0) return x < 0 ? 0xFE : 0x7E;
  int best = -1;
  double best_err = INFINITY;
  for (int code = 0; code <= 0x7E; ++code) {
    const double err = std::fabs(std::fabs(x) - E4M3ToFloat(static_cast<uint8_t>(code)));
    if (err < best_err || (err == best_err && code % 2 == 0)) {
      best = code;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

TEST(Mxfp8Block, MatchesFp64FormulationOnRandomBlocks) {
  const int blocks = 4000;
  const std::vector<Bf16> x = RandomBf16WideRange(blocks * kMxBlock, 60);
  for (int b = 0; b < blocks; ++b) {
    Block q;
    q.v.assign(x.begin() + b * kMxBlock, x.begin() + (b + 1) * kMxBlock);
    q.Quantize();
    double amax = 0;
    for (Bf16 v : q.v) amax = std::fmax(amax, std::fabs(Bf16ToFloat(v)));
    const int shared =
        amax == 0 ? -127
                  : std::clamp(static_cast<int>(std::ceil(std::log2(amax / 448.0))), -127, 119);
    ASSERT_EQ(q.scale, shared + 127) << "block " << b << " amax " << amax;
    for (int i = 0; i < kMxBlock; ++i) {
      const double scaled = Bf16ToFloat(q.v[i]) / std::ldexp(1.0, shared);
      if (shared < 119) ASSERT_LE(std::fabs(scaled), 448.0) << "block " << b << " element " << i;
      ASSERT_EQ(q.p[i], NearestE4M3ByEnumeration(scaled))
          << "block " << b << " element " << i << " value " << Bf16ToFloat(q.v[i]);
    }
  }
}

TEST(Mxfp8Layout, RowwiseAndColwiseWithGroups) {
  const int64_t rows = 200, cols = 64;
  // Group sizes with zeros and odd values; rows past offsets[G] (= 134) stay untouched.
  const std::vector<int32_t> offsets = {0, 0, 5, 38, 38, 102, 134};
  const int groups = static_cast<int>(offsets.size()) - 1;
  const std::vector<Bf16> x = RandomBf16WideRange(rows * cols);
  MxQuantizeShape shape{rows, cols, groups};
  std::vector<uint8_t> row_data(rows * cols, 0xAA), row_scales(rows * cols / 32, 0xAA);
  const int64_t padded = ColwisePaddedRows(rows, groups);
  EXPECT_EQ(padded, 416);  // 200 + 31 * 6 = 386, rounded up to 32
  std::vector<uint8_t> col_data(cols * padded, 0xAA), col_scales(cols * padded / 32, 0xAA);
  std::vector<int32_t> padded_offsets(groups + 1, -7);
  MxRowwise rowwise{row_data.data(), row_scales.data()};
  MxColwise colwise{col_data.data(), col_scales.data(), padded_offsets.data(), padded};
  ASSERT_TRUE(cpu::QuantizeMxfp8(shape, x.data(), offsets.data(), &rowwise, &colwise).ok());

  EXPECT_EQ(padded_offsets, (std::vector<int32_t>{0, 0, 32, 96, 96, 160, 192}));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols / 32; ++j) {
      Block want;
      want.v.assign(x.begin() + r * cols + 32 * j, x.begin() + r * cols + 32 * j + 32);
      want.Quantize();
      for (int i = 0; i < 32; ++i) {
        ASSERT_EQ(row_data[r * cols + 32 * j + i], r < 134 ? want.p[i] : 0xAA) << r;
      }
      ASSERT_EQ(row_scales[r * cols / 32 + j], r < 134 ? want.scale : 0xAA) << r;
    }
  }
  for (int g = 0; g < groups; ++g) {
    const int count = offsets[g + 1] - offsets[g];
    for (int64_t c = 0; c < cols; ++c) {
      for (int b = 0; b * 32 < count; ++b) {
        Block want;
        for (int i = 0; i < 32; ++i) {
          const int local = 32 * b + i;
          want.v[i] = local < count ? x[(offsets[g] + local) * cols + c] : Bf16{0};
        }
        want.Quantize();
        // Block-major: block row (padded_offsets[g] / 32 + b), column c, 32 bytes.
        const int64_t at = (padded_offsets[g] / 32 + b) * cols + c;
        for (int i = 0; i < 32; ++i) ASSERT_EQ(col_data[at * 32 + i], want.p[i]) << g << " " << c;
        ASSERT_EQ(col_scales[at], want.scale);
      }
      for (int64_t pr = 192; pr < padded; ++pr) {  // block rows past the last group: untouched
        ASSERT_EQ(col_data[(pr / 32) * cols * 32 + c * 32 + pr % 32], 0xAA);
        ASSERT_EQ(col_scales[(pr / 32) * cols + c], 0xAA);
      }
    }
  }
}

TEST(Mxfp8Layout, PaddedRowsBound) {
  EXPECT_EQ(ColwisePaddedRows(0, 1), 32);
  EXPECT_EQ(ColwisePaddedRows(1, 1), 32);
  EXPECT_EQ(ColwisePaddedRows(33, 1), 64);
  EXPECT_EQ(ColwisePaddedRows(65536, 256), 65536 + 31 * 256 + 0);
}

TEST(Mxfp8Layout, RejectsBadArguments) {
  std::vector<Bf16> x(64);
  std::vector<uint8_t> d(64), s(2);
  MxRowwise rowwise{d.data(), s.data()};
  EXPECT_FALSE(cpu::QuantizeMxfp8({1, 48, 1}, x.data(), nullptr, &rowwise, nullptr).ok());
  EXPECT_FALSE(cpu::QuantizeMxfp8({1, 64, 1}, x.data(), nullptr, nullptr, nullptr).ok());
  const std::vector<int32_t> bad = {0, 3, 2};
  EXPECT_FALSE(cpu::QuantizeMxfp8({4, 32, 2}, x.data(), bad.data(), &rowwise, nullptr).ok());
  std::vector<int32_t> po(2);
  MxColwise small{d.data(), s.data(), po.data(), 0};
  EXPECT_FALSE(cpu::QuantizeMxfp8({1, 64, 1}, x.data(), nullptr, nullptr, &small).ok());
}

TEST(Mxfp8Dequantize, IsExactAndHonoursNumRows) {
  const int64_t rows = 9, cols = 96;
  const std::vector<Bf16> x = RandomBf16WideRange(rows * cols);
  std::vector<uint8_t> data(rows * cols), scales(rows * cols / 32);
  MxRowwise rowwise{data.data(), scales.data()};
  ASSERT_TRUE(cpu::QuantizeMxfp8({rows, cols, 1}, x.data(), nullptr, &rowwise, nullptr).ok());
  std::vector<float> out(rows * cols, -123.0f);
  const int32_t live = 7;
  ASSERT_TRUE(cpu::DequantizeMxfp8Rowwise(rows, cols, &live, data.data(), scales.data(),
                                          out.data()).ok());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double want = r < live ? static_cast<double>(E4M3ToFloat(data[r * cols + c])) *
                                         std::ldexp(1.0, scales[r * 3 + c / 32] - 127)
                                   : -123.0;
      ASSERT_EQ(out[r * cols + c], want);
    }
  }
  // Quantization error: at most half an E4M3 step (16 X in the top binade, [256, 448] X; nothing
  // saturates), below 64 X.
  for (int64_t i = 0; i < live * cols; ++i) {
    const double v = Bf16ToFloat(x[i]);
    const double step = std::ldexp(1.0, scales[i / 32] - 127 + 6);
    EXPECT_LE(std::fabs(v - out[i]), step) << i;
  }
}

// The bf16-core GEMM's weight image: image column 64 b + l holds the exact value of physical column
// 64 b + MxImagePhysicalColumn(l) (exact: the bf16 of an E4M3 times a power of two); cols must be
// a multiple of 64.
TEST(Mxfp8WeightImage, HoldsExactValuesInTheFragmentOrder) {
  const int64_t rows = 5, cols = 192;
  const std::vector<Bf16> x = RandomBf16WideRange(rows * cols);
  std::vector<uint8_t> data(rows * cols), scales(rows * cols / 32);
  MxRowwise rowwise{data.data(), scales.data()};
  ASSERT_TRUE(cpu::QuantizeMxfp8({rows, cols, 1}, x.data(), nullptr, &rowwise, nullptr).ok());
  scales[4] = kE8M0Nan;  // row 0, columns 128..159
  std::vector<Bf16> image(rows * cols);
  ASSERT_TRUE(cpu::MxWeightImage(rows, cols, data.data(), scales.data(), image.data()).ok());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t p = c / 64 * 64 + MxImagePhysicalColumn(static_cast<int>(c % 64));
      const double want = static_cast<double>(E4M3ToFloat(data[r * cols + p])) *
                          std::ldexp(1.0, scales[r * (cols / 32) + p / 32] - 127);
      const double got = Bf16ToFloat(image[r * cols + c]);
      if (r == 0 && p / 32 == 4) {
        EXPECT_TRUE(std::isnan(got)) << c;
      } else {
        ASSERT_EQ(got, want) << "row " << r << " column " << c;
      }
    }
  }
  EXPECT_FALSE(cpu::MxWeightImage(rows, 96, data.data(), scales.data(), image.data()).ok());
}

}  // namespace
}  // namespace dropless::kernels
