// SwiGLU reference against fp64 formulas.
#include "dropless/kernels/swiglu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/unit/kernels/test_data.h"

namespace dropless::kernels {
namespace {

using testing::Bf16UlpDiff;
using testing::RandomBf16;

double Sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

TEST(Swiglu, ForwardAndBackwardMatchFp64) {
  const SwigluShape shape{45, 96};
  const int32_t live = 41;  // rows 41..44 must stay untouched
  const std::vector<Bf16> h = RandomBf16(shape.rows * 2 * shape.ffn, 3.0f);
  const std::vector<Bf16> d_out = RandomBf16(shape.rows * shape.ffn);
  std::vector<Bf16> out(shape.rows * shape.ffn, Bf16{0xFFFF});
  std::vector<Bf16> d_h(h.size(), Bf16{0xFFFF});
  ASSERT_TRUE(cpu::SwigluForward(shape, &live, h.data(), out.data(), nullptr).ok());
  ASSERT_TRUE(cpu::SwigluBackward(shape, &live, h.data(), d_out.data(), d_h.data()).ok());
  double worst = 0;
  for (int64_t r = 0; r < shape.rows; ++r) {
    for (int64_t c = 0; c < shape.ffn; ++c) {
      const int64_t o = r * shape.ffn + c;
      if (r >= live) {
        ASSERT_EQ(out[o].bits, 0xFFFF);
        ASSERT_EQ(d_h[r * 2 * shape.ffn + c].bits, 0xFFFF);
        continue;
      }
      const double g = Bf16ToFloat(h[r * 2 * shape.ffn + c]);
      const double u = Bf16ToFloat(h[r * 2 * shape.ffn + shape.ffn + c]);
      const double dy = Bf16ToFloat(d_out[o]);
      const double s = Sigmoid(g);
      // fp32 math then one bf16 rounding: within 0.5 ulp plus a little fp32 error.
      worst = std::max(worst, Bf16UlpDiff(out[o], g * s * u));
      worst = std::max(worst, Bf16UlpDiff(d_h[r * 2 * shape.ffn + c], dy * u * s * (1 + g * (1 - s))));
      worst = std::max(worst, Bf16UlpDiff(d_h[r * 2 * shape.ffn + shape.ffn + c], dy * g * s));
    }
  }
  EXPECT_LE(worst, 0.51);
}

TEST(Swiglu, Mxfp8OutputQuantizesTheBf16Output) {
  const SwigluShape shape{19, 64};
  const std::vector<Bf16> h = RandomBf16(shape.rows * 2 * shape.ffn, 4.0f);
  std::vector<Bf16> out(shape.rows * shape.ffn);
  std::vector<uint8_t> data(shape.rows * shape.ffn), scales(shape.rows * 2);
  MxRowwise mx{data.data(), scales.data()};
  ASSERT_TRUE(cpu::SwigluForward(shape, nullptr, h.data(), out.data(), &mx).ok());
  std::vector<uint8_t> want_data(data.size()), want_scales(scales.size());
  MxRowwise want{want_data.data(), want_scales.data()};
  ASSERT_TRUE(cpu::QuantizeMxfp8({shape.rows, shape.ffn, 1}, out.data(), nullptr, &want, nullptr).ok());
  EXPECT_EQ(data, want_data);
  EXPECT_EQ(scales, want_scales);
}

TEST(Swiglu, RejectsBadShapes) {
  std::vector<Bf16> h(128), out(64);
  EXPECT_FALSE(cpu::SwigluForward({1, 12}, nullptr, h.data(), out.data(), nullptr).ok());
  EXPECT_FALSE(cpu::SwigluForward({1, 64}, nullptr, h.data(), nullptr, nullptr).ok());
  std::vector<uint8_t> d(64), s(2);
  MxRowwise mx{d.data(), s.data()};
  EXPECT_FALSE(cpu::SwigluForward({1, 48}, nullptr, h.data(), nullptr, &mx).ok());
}

}  // namespace
}  // namespace dropless::kernels
