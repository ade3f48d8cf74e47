// GPU tests of the bf16-core MXFP8 products (MxGroupedGemm's Forward / BackwardData on weight
// images, mx_grouped_gemm.h) and of the weight image itself (MxWeightImage, mxfp8.h): the image
// bit for bit against the CPU's (NaN scales, scales that need the two-multiply path, tiny scales
// with subnormal elements), and both products against fp64 of the dequantized operands on fresh
// random data (bounds in mx_gemm_test_util.h), poisoned outputs, group sizes including 0 and odd
// values, partial N tiles, odd stage counts, long reductions with several tiles per CTA, NaN and
// large scales, and the checks that name the field. Without a Hopper GPU the device tests skip;
// the permutation test runs everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dropless/kernels/mx_grouped_gemm.h"
#include "dropless/kernels/mxfp8.h"
#include "tests/gpu/gemm/gemm_test_util.h"
#include "tests/gpu/gemm/mx_gemm_test_util.h"

namespace dropless::kernels {
namespace {

using gemm_test::DeviceBuffer;
using gemm_test::Ref;
using mx_test::ExpectSameBits;
using mx_test::MakeMGrouped;
using mx_test::MGroupedCase;
using mx_test::MGroupedReference;
using mx_test::RandomWide;
using mx_test::RunMGrouped;
using mx_test::Upload;

constexpr const char* kCore = MxGroupedGemm::kCoreKernelName;
// Both variants of the image products: one CTA per tile, and 2 x 1 clusters sharing the image
// tile (a group with an odd number of M tiles gives one CTA of a pair an empty tile).
const std::vector<std::string> kCoreKernels = {MxGroupedGemm::kCoreKernelName,
                                               MxGroupedGemm::kCoreClusterKernelName};
const std::vector<int> kMixedSizes = {0, 1, 37, 0, 200, 129, 300, 3, 0, 64, 255, 0};

// Every 64 image positions hold each of the 64 physical columns once.
TEST(MxImagePhysicalColumnTest, PermutesEachRunOf64) {
  std::vector<int> seen(64, 0);
  for (int l = 0; l < 64; ++l) {
    const int p = MxImagePhysicalColumn(l);
    ASSERT_GE(p, 0);
    ASSERT_LT(p, 64);
    ++seen[p];
  }
  for (int p = 0; p < 64; ++p) EXPECT_EQ(seen[p], 1) << "physical column " << p;
  // Thread quad q's four fragment columns of k16 step j are its bytes 16 q + 4 j .. + 3.
  for (int j = 0; j < 4; ++j) {
    for (int q = 0; q < 4; ++q) {
      const int cols[4] = {2 * q, 2 * q + 1, 2 * q + 8, 2 * q + 9};
      for (int i = 0; i < 4; ++i) EXPECT_EQ(MxImagePhysicalColumn(16 * j + cols[i]), 16 * q + 4 * j + i);
    }
  }
}

class MxCoreGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gemm_test::HasHopperDevice()) GTEST_SKIP() << "SKIPPED: no CUDA device (Hopper sm_90)";
  }
};

// Sets scale byte `scale` on block `block` of an operand and recomputes its dequantized values.
void SetScale(mx_test::MxHost* h, int64_t block, uint8_t scale) {
  h->scales[block] = scale;
  const int64_t first = block * 32;  // blocks run along rows: element index = block * 32 + i
  for (int i = 0; i < 32; ++i) {
    h->values[first + i] = MxElementValue(h->data[first + i], scale);
  }
}

TEST_F(MxCoreGemmTest, WeightImageMatchesCpuBitForBit) {
  std::random_device rd;
  std::mt19937_64 rng(rd());
  const int64_t rows = 300, cols = 448;
  mx_test::MxHost w = mx_test::QuantizeRows(RandomWide(rows * cols, &rng), rows, cols);
  // Special scales: NaN, the two-multiply range (2^8 and up: 135..254), the smallest ones (their
  // subnormal elements fall under bf16's range and round), and zero.
  const uint8_t special[] = {0xFF, 135, 200, 254, 134, 0, 1, 3, 127};
  for (size_t i = 0; i < sizeof(special); ++i) {
    w.scales[rng() % w.scales.size()] = special[i];
  }
  auto data = Upload(w.data), scales = Upload(w.scales);
  DeviceBuffer image(rows * cols * 2, 2);
  ASSERT_TRUE(cuda::MxWeightImage(rows, cols, reinterpret_cast<const uint8_t*>(data->i32()),
                                  reinterpret_cast<const uint8_t*>(scales->i32()),
                                  reinterpret_cast<Bf16*>(image.bf16()), nullptr)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<Bf16> expected(rows * cols);
  ASSERT_TRUE(
      cpu::MxWeightImage(rows, cols, w.data.data(), w.scales.data(), expected.data()).ok());
  ExpectSameBits(image, expected, "weight image");
  // Errors name the field.
  const absl::Status bad = cuda::MxWeightImage(rows, 96, reinterpret_cast<const uint8_t*>(data->i32()),
                                               reinterpret_cast<const uint8_t*>(scales->i32()),
                                               reinterpret_cast<Bf16*>(image.bf16()), nullptr);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("cols"), std::string::npos) << bad;
}

// Both weight images straight from a bf16 weight (one read) equal the quantize-then-image path's,
// bit for bit: random wide values with a NaN, an Inf, blocks of 2^20 (two multiplies) and of 2^-130.
TEST_F(MxCoreGemmTest, WeightImagesFromBf16MatchTheCpuBitForBit) {
  std::random_device rd;
  std::mt19937_64 rng(rd());
  const MxWeightImagesShape shape{3, 128, 192};
  const size_t count = shape.experts * shape.k * shape.n;
  std::vector<Bf16> w = RandomWide(count, &rng);
  w[rng() % count] = Bf16{0x7FC0};  // NaN
  w[rng() % count] = Bf16{0x7F80};  // Inf
  for (int i = 0; i < 40; ++i) w[rng() % count] = FloatToBf16(std::ldexp(1.5f, 20));
  for (int i = 0; i < 40; ++i) w[rng() % count] = FloatToBf16(std::ldexp(1.25f, -130));
  std::vector<Bf16> want_n(count), want_k(count);
  ASSERT_TRUE(cpu::MxWeightImages(shape, w.data(), want_n.data(), want_k.data()).ok());
  auto d_w = Upload(w);
  DeviceBuffer img_n(count * 2, 2), img_k(count * 2, 2);
  ASSERT_TRUE(cuda::MxWeightImages(shape, reinterpret_cast<const Bf16*>(d_w->bf16()),
                                   reinterpret_cast<Bf16*>(img_n.bf16()),
                                   reinterpret_cast<Bf16*>(img_k.bf16()), nullptr)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectSameBits(img_n, want_n, "image along n");
  ExpectSameBits(img_k, want_k, "image along k");
  const absl::Status bad = cuda::MxWeightImages({3, 96, 192}, reinterpret_cast<const Bf16*>(d_w->bf16()),
                                                reinterpret_cast<Bf16*>(img_n.bf16()),
                                                reinterpret_cast<Bf16*>(img_k.bf16()), nullptr);
  EXPECT_NE(bad.message().find("k"), std::string::npos) << bad;
}

// The weight gradient's operands as exact bf16 rows: bit for bit against the CPU, over groups
// with padding, a NaN scale and scales that need two multiplies; rows past the last group's
// padded end untouched.
TEST_F(MxCoreGemmTest, ColwiseImageMatchesCpuBitForBit) {
  std::random_device rd;
  std::mt19937_64 rng(rd());
  const std::vector<int32_t> offsets = gemm_test::Offsets({0, 1, 37, 200, 0, 129, 64, 33});
  const int groups = static_cast<int>(offsets.size()) - 1;
  const int64_t rows = offsets.back() + 5, cols = 160;
  const std::vector<Bf16> x = RandomWide(rows * cols, &rng);
  MxColwise host;
  host.padded_rows = ColwisePaddedRows(rows, groups);
  std::vector<uint8_t> data(host.padded_rows * cols), scales(host.padded_rows / 32 * cols);
  std::vector<int32_t> padded(groups + 1);
  host.data = data.data();
  host.scales = scales.data();
  host.group_offsets = padded.data();
  ASSERT_TRUE(cpu::QuantizeMxfp8({rows, cols, groups}, x.data(), offsets.data(), nullptr, &host).ok());
  const uint8_t special[] = {0xFF, 140, 250, 2};
  for (uint8_t sc : special) scales[rng() % (padded.back() / 32 * cols)] = sc;
  std::vector<Bf16> expected(host.padded_rows * cols, Bf16{0x7FC0});
  ASSERT_TRUE(cpu::MxColwiseImage(cols, groups, host, expected.data()).ok());

  auto d_data = Upload(data), d_scales = Upload(scales), d_padded = Upload(padded);
  MxColwise dev = host;
  dev.data = reinterpret_cast<uint8_t*>(d_data->i32());
  dev.scales = reinterpret_cast<uint8_t*>(d_scales->i32());
  dev.group_offsets = d_padded->i32();
  DeviceBuffer image(host.padded_rows * cols * 2, 2);  // poisoned: NaN past the padded end
  ASSERT_TRUE(cuda::MxColwiseImage(cols, groups, dev, reinterpret_cast<Bf16*>(image.bf16()), nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectSameBits(image, expected, "column-wise image");
}

// k = 384: six stages; n = 352: the second N tile is partial. 20 random groups with k = 448: seven
// stages (an odd count ends on the even fragment buffer).
TEST_F(MxCoreGemmTest, ForwardMatchesFp64OfDequantized) {
  std::random_device rd;
  for (const std::string& kernel : kCoreKernels) {
    RunMGrouped(MakeMGrouped(kMixedSizes, 384, 352, rd()), false, "core forward mixed", kernel);
    std::mt19937_64 rng(rd());
    std::vector<int> sizes(20);
    for (int& s : sizes) s = rng() % 4 == 0 ? 0 : static_cast<int>(rng() % 400);
    RunMGrouped(MakeMGrouped(sizes, 448, 256, rd()), false, "core forward random", kernel);
  }
}

TEST_F(MxCoreGemmTest, BackwardDataMatchesFp64OfDequantized) {
  std::random_device rd;
  for (const std::string& kernel : kCoreKernels) {
    RunMGrouped(MakeMGrouped(kMixedSizes, 256, 352, rd()), true, "core dgrad mixed", kernel);
  }
}

// Many stages and several tiles per CTA (every role's walk crosses tiles and groups, the ring
// wraps); every 5th row against the reference.
TEST_F(MxCoreGemmTest, LongReductionsAndManyTilesPerCta) {
  std::random_device rd;
  const std::vector<int> sizes = {700, 0, 1300, 513, 2048, 300, 1, 1100};
  const MGroupedCase fwd = MakeMGrouped(sizes, 1088, 1024, rd());
  const MGroupedCase bwd = MakeMGrouped(sizes, 1024, 1088, rd());
  const Ref fwd_ref = MGroupedReference(fwd.a.values, fwd.b.values, fwd.offsets, 1088, 1024, 5);
  const Ref bwd_ref = MGroupedReference(bwd.a.values, bwd.b.values, bwd.offsets, 1024, 1088, 5);
  for (const std::string& kernel : kCoreKernels) {
    RunMGrouped(fwd, false, "core forward long", kernel, 5, &fwd_ref);
    RunMGrouped(bwd, true, "core dgrad long", kernel, 5, &bwd_ref);
  }
}

// A NaN scale on one token row's block and one weight column's block (NaN exactly in that row and
// in that column of the expert's rows); large scales (2^8 .. 2^40: the two-multiply path) on other
// rows' blocks and tiny ones (2^-120) on others, all exact against the reference.
TEST_F(MxCoreGemmTest, NanLargeAndTinyScales) {
  std::random_device rd;
  const int k = 384, n = 256;
  MGroupedCase c = MakeMGrouped(kMixedSizes, k, n, rd());
  const int blocks = k / 32;
  const int nan_row = c.offsets[4] + 17;
  SetScale(&c.a, static_cast<int64_t>(nan_row) * blocks + 5, kE8M0Nan);
  for (int kb = 0; kb < blocks; kb += 3) {
    SetScale(&c.a, static_cast<int64_t>(c.offsets[6] + 3) * blocks + kb, 135 + 3 * kb);
    SetScale(&c.a, static_cast<int64_t>(c.offsets[6] + 90) * blocks + kb, 7);
  }
  const int nan_group = 6, nan_col = 131;
  SetScale(&c.b, (static_cast<int64_t>(nan_group) * n + nan_col) * blocks + 9, kE8M0Nan);
  RunMGrouped(c, false, "core forward NaN / large / tiny scales", kCore);
}

// The image products run one CTA per tile whatever the group size; options.kernel forces either.
TEST_F(MxCoreGemmTest, CoreVariantIsOneCtaPerTileUnlessForced) {
  MxGroupedGemmOptions o;
  o.num_groups = 8;
  o.k = 256;
  o.n = 256;
  o.max_rows = 4096;
  const struct {
    int64_t expected;
    const char* kernel;
    const char* want;
  } cases[] = {{1024, "", MxGroupedGemm::kCoreKernelName},
               {2048, "", MxGroupedGemm::kCoreKernelName},
               {0, "", MxGroupedGemm::kCoreKernelName},
               {4096, MxGroupedGemm::kCoreKernelName, MxGroupedGemm::kCoreKernelName},
               {128, MxGroupedGemm::kCoreClusterKernelName, MxGroupedGemm::kCoreClusterKernelName}};
  for (const auto& c : cases) {
    o.expected_rows_per_group = c.expected;
    o.kernel = c.kernel;
    auto gemm = MxGroupedGemm::Create(o);
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    EXPECT_EQ((*gemm)->CoreKernelName(), c.want) << c.expected << " '" << c.kernel << "'";
  }
}

TEST_F(MxCoreGemmTest, BadShapesAndPointersNameTheField) {
  MxGroupedGemmOptions o;
  o.num_groups = 4;
  o.k = 96;  // not a multiple of 64: the core forward refuses, naming x
  o.n = 128;
  o.max_rows = 256;
  auto gemm = MxGroupedGemm::Create(o);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  DeviceBuffer a(256 * 128, 4), scales(256 * 4, 4), image(4 * 128 * 128 * 2, 2), y(256 * 128 * 2, 2),
      offsets(5 * 4, 4);
  const MxOperand x{reinterpret_cast<const uint8_t*>(a.i32()),
                    reinterpret_cast<const uint8_t*>(scales.i32())};
  const Bf16* img = reinterpret_cast<const Bf16*>(image.bf16());
  Bf16* out = reinterpret_cast<Bf16*>(y.bf16());
  absl::Status s = (*gemm)->Forward(x, img, offsets.i32(), out, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("x"), std::string::npos) << s;
  // BackwardData reduces over n = 128: runs; a null image is refused.
  s = (*gemm)->BackwardData(x, nullptr, offsets.i32(), out, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("image"), std::string::npos) << s;
  s = (*gemm)->BackwardData(x, img, nullptr, out, nullptr);
  EXPECT_NE(s.message().find("offsets"), std::string::npos) << s;
}

}  // namespace
}  // namespace dropless::kernels
