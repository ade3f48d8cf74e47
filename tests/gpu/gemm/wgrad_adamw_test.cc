// GPU tests of the weight gradient fused with AdamW (dropless/kernels/grouped_wgrad_adamw.h):
// the kernel's gradient against fp64 on fresh random data (empty groups, group sizes and k, n that
// are not tile multiples, NaN rows past the groups, many tiles per CTA), and its fused update
// bit for bit against that gradient followed by AdamW's fp32 formula on the CPU, with fp32 moments
// and with bf16 ones (adamw.h's stochastic rounding, keyed by index). Without a Hopper GPU the
// device tests skip and say so.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "dropless/kernels/grouped_wgrad_adamw.h"
#include "tests/gpu/gemm/gemm_test_util.h"

namespace dropless::kernels {
namespace {

using gemm_test::Problem;

constexpr double kTolerance = 1e-2;

class WgradAdamWTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gemm_test::HasHopperDevice()) GTEST_SKIP() << "SKIPPED: no CUDA device (Hopper sm_90)";
  }
};

// The padding rows past offsets[E] hold NaN in X and dY: a kernel that let them into a group's
// sum would fail every comparison.
Problem WithNanPadding(Problem p) {
  constexpr uint16_t kNaN = 0x7fc0;
  for (int64_t r = p.offsets.back(); r < p.max_rows; ++r) {
    std::fill(p.x.begin() + r * p.k, p.x.begin() + (r + 1) * p.k, kNaN);
    std::fill(p.dy.begin() + r * p.n, p.dy.begin() + (r + 1) * p.n, kNaN);
  }
  return p;
}

std::vector<Problem> Problems() {
  std::mt19937_64 rng(gemm_test::RunSeed() ^ 0x5eed);
  std::vector<int> many(64);
  for (int& s : many) s = (rng() % 5 == 0) ? 0 : static_cast<int>(rng() % 300);
  return {
      WithNanPadding(gemm_test::MakeProblem({0, 1, 37, 0, 200, 129, 513, 3, 0, 64, 255, 0}, 264,
                                            392, 101)),
      // Many tiles per CTA (64 groups x 4 x 3 tiles): the stage and piece rings wrap many times.
      WithNanPadding(gemm_test::MakeProblem(many, 512, 384, 102)),
      gemm_test::MakeProblem({0, 0, 0}, 128, 128, 103),
  };
}

WgradAdamWShape ShapeOf(const Problem& p) {
  return WgradAdamWShape{static_cast<int>(p.sizes.size()), p.k, p.n, p.max_rows};
}

// AdamW's element update in fp32, one IEEE operation at a time in adamw_update.h's order (the host
// compiler contracts nothing here: no FMA in the x86-64 baseline).
float AdamWReference(const AdamWStep& s, float g, float& m, float& v, float p) {
  const float m1 = s.beta1 * m;
  const float m2 = (1.0f - s.beta1) * g;
  m = m1 + m2;
  const float v1 = s.beta2 * v;
  const float v2 = ((1.0f - s.beta2) * g) * g;
  v = v1 + v2;
  const float num = m * s.m_correction;
  const float den = std::sqrt(v * s.v_correction) + s.eps;
  const float update = num / den;
  return p * s.decay - s.step_size * update;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

TEST(WgradAdamWShapeTest, RejectsShapesItCannotRun) {
  for (const WgradAdamWShape& s : {WgradAdamWShape{4, 100, 64, 10}, WgradAdamWShape{4, 64, 0, 10},
                                   WgradAdamWShape{-1, 64, 64, 10}}) {
    auto r = GroupedWgradAdamW::Create(s);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  }
}

TEST_F(WgradAdamWTest, GradientMatchesFp64) {
  for (const Problem& p : Problems()) {
    SCOPED_TRACE(::testing::Message() << p.sizes.size() << " groups, " << p.k << " x " << p.n);
    auto op = GroupedWgradAdamW::Create(ShapeOf(p));
    ASSERT_TRUE(op.ok()) << op.status();
    gemm_test::Operands d(p);
    ASSERT_TRUE((*op)->Gradient(d.x.bf16(), d.dy.bf16(), d.offsets.i32(), d.dw32.f32(), nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    gemm_test::ExpectWeightsMatch(d.dw32.ToHostF32(), gemm_test::ReferenceBackwardWeight(p), p,
                                  kTolerance);
  }
}

class WgradAdamWMomentsTest : public WgradAdamWTest, public ::testing::WithParamInterface<bool> {};

// Update == Gradient, then AdamW on the CPU, bit for bit, for every element (empty groups take
// their step with a zero gradient); the bf16 copy is the new master rounded to nearest even. bf16
// moments (the parameter) are stored as adamw.h's StochasticBf16 of the fp32 moment with the draws
// of BF16MomentBits(stream, first + index, step); `first` puts a multiple of 2^32 inside the
// tensor, where a thread's elements stop sharing one key.
TEST_P(WgradAdamWMomentsTest, UpdateIsGradientThenAdamWBitForBit) {
  const bool bf16 = GetParam();
  int trial = 0;
  for (const Problem& p : Problems()) {
    SCOPED_TRACE(::testing::Message() << p.sizes.size() << " groups, " << p.k << " x " << p.n);
    auto op = GroupedWgradAdamW::Create(ShapeOf(p));
    ASSERT_TRUE(op.ok()) << op.status();
    gemm_test::Operands d(p);
    ASSERT_TRUE((*op)->Gradient(d.x.bf16(), d.dy.bf16(), d.offsets.i32(), d.dw32.f32(), nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> grad = d.dw32.ToHostF32();

    const size_t count = p.w.size();
    std::mt19937_64 rng(gemm_test::RunSeed() + 7 * ++trial);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> param(count), m(count), v(count);
    std::vector<uint16_t> m16(count), v16(count);
    for (size_t i = 0; i < count; ++i) {
      param[i] = normal(rng) * 0.05f;
      m[i] = normal(rng) * 0.01f;
      v[i] = std::fabs(normal(rng)) * 1e-4f;
      if (bf16) {  // the moments a bf16 job holds
        m16[i] = gemm_test::FloatToBf16(m[i]);
        v16[i] = gemm_test::FloatToBf16(v[i]);
        m[i] = gemm_test::Bf16ToFloat(m16[i]);
        v[i] = gemm_test::Bf16ToFloat(v16[i]);
      }
    }
    const uint32_t stream = 1;
    const int64_t first_index = (int64_t{3} << 32) - static_cast<int64_t>(count / 2) - 3;
    // Step 3 of lr 1e-3, weight decay 0.1.
    AdamWStep step{0.9f,
                   0.999f,
                   1e-8f,
                   1.0f - 1e-3f * 0.1f,
                   1e-3f,
                   static_cast<float>(1.0 / (1.0 - std::pow(0.9, 3))),
                   static_cast<float>(1.0 / (1.0 - std::pow(0.999, 3))),
                   3};
    const size_t moment_bytes = bf16 ? 2 : 4;
    gemm_test::DeviceBuffer d_param(count * 4, 4), d_m(count * moment_bytes, moment_bytes),
        d_v(count * moment_bytes, moment_bytes), d_copy(count * 2, 2), d_step(sizeof(AdamWStep), 4);
    d_param.Upload(param.data(), count * 4);
    d_m.Upload(bf16 ? static_cast<const void*>(m16.data()) : m.data(), count * moment_bytes);
    d_v.Upload(bf16 ? static_cast<const void*>(v16.data()) : v.data(), count * moment_bytes);
    d_step.Upload(&step, sizeof(step));
    AdamWTensors state{d_param.f32(), AdamWMoments{d_m.f32(), d_v.f32(), bf16, stream, first_index},
                       d_copy.bf16()};
    ASSERT_TRUE((*op)->Update(d.x.bf16(), d.dy.bf16(), d.offsets.i32(),
                              reinterpret_cast<const AdamWStep*>(d_step.f32()), state, nullptr)
                    .ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> new_param = d_param.ToHostF32();
    std::vector<float> new_m(count), new_v(count);
    if (bf16) {
      std::vector<uint16_t> raw_m(count), raw_v(count);
      ASSERT_EQ(cudaMemcpy(raw_m.data(), d_m.f32(), count * 2, cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(raw_v.data(), d_v.f32(), count * 2, cudaMemcpyDeviceToHost),
                cudaSuccess);
      for (size_t i = 0; i < count; ++i) {
        new_m[i] = gemm_test::Bf16ToFloat(raw_m[i]);
        new_v[i] = gemm_test::Bf16ToFloat(raw_v[i]);
      }
    } else {
      new_m = d_m.ToHostF32();
      new_v = d_v.ToHostF32();
    }
    std::vector<uint16_t> copy(count);
    ASSERT_EQ(cudaMemcpy(copy.data(), d_copy.bf16(), count * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t mismatched = 0, first = count;
    for (size_t i = 0; i < count; ++i) {
      float rm = m[i], rv = v[i];
      const float rp = AdamWReference(step, grad[i], rm, rv, param[i]);
      if (bf16) {
        const uint32_t bits =
            BF16MomentBits(stream, first_index + static_cast<int64_t>(i), step.step);
        rm = StochasticBf16(rm, bits & 0xffffu);
        rv = StochasticBf16(rv, bits >> 16);
      }
      const bool ok = Bits(rp) == Bits(new_param[i]) && Bits(rm) == Bits(new_m[i]) &&
                      Bits(rv) == Bits(new_v[i]) && copy[i] == gemm_test::FloatToBf16(rp);
      if (!ok && first == count) first = i;
      mismatched += ok ? 0 : 1;
    }
    EXPECT_EQ(mismatched, 0u) << "first at " << first << " of " << count << ": param "
                              << (first < count ? new_param[first] : 0.0f) << " grad "
                              << (first < count ? grad[first] : 0.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Moments, WgradAdamWMomentsTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "bf16_moments" : "fp32_moments";
                         });

}  // namespace
}  // namespace dropless::kernels
