// GPU tests of the fp8-block grouped GEMM (kernels/include/dropless/kernels/fp8_block_grouped_gemm.h):
// all three products against an fp64 CPU reference of the dequantized operands, on fresh random
// data each run (DROPLESS_TEST_SEED repeats one). The operands are built by hand directly in the
// layouts of fp8_block.h (random E4M3 bytes without the NaN codes, random positive fp32 scales, a
// different scale per 1 x 128 tile or 128 x 128 block), so the test does not depend on the
// quantizer. Outputs are poisoned (NaN) before each call; group sizes include 0, 1 and values that
// are not multiples of 128; buffers hold NaN codes and NaN scales where no product may read (rows
// past offsets[G], padded rows past padded_offsets[G]); scale buffers have no slack rows. Without
// a Hopper GPU the device tests skip; the option checks run everywhere.
//
// Bounds. Per element |out - ref| <= tol_rel * |ref| + tol_abs * sum_k |a_k b_k|: the first term is
// the output rounding (bf16 2^-9, written 1e-2 with margin; fp32 1e-5), the second the fp8 tensor
// cores' accumulation inside a 128-wide K block and the fp32 promotion. The norm-wise relative
// error must also stay below 1e-2 (bf16) / 1e-3 (fp32).
#include "dropless/kernels/fp8_block_grouped_gemm.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dropless/kernels/fp8_block.h"
#include "dropless/kernels/mxfp8.h"  // E4M3ToFloat, kE4M3Nan
#include "tests/gpu/gemm/fp8_block_gemm_reference.h"
#include "tests/gpu/gemm/gemm_test_util.h"

namespace dropless::kernels {
namespace {

using gemm_test::DeviceBuffer;
using fp8_block_gemm_test::ColwiseHost;
using fp8_block_gemm_test::ExpectClose;
using fp8_block_gemm_test::ExpectUntouched;
using fp8_block_gemm_test::kB;
using fp8_block_gemm_test::kBf16Abs;
using fp8_block_gemm_test::kBf16Norm;
using fp8_block_gemm_test::kBf16Rel;
using fp8_block_gemm_test::kF32Abs;
using fp8_block_gemm_test::kF32Norm;
using fp8_block_gemm_test::kF32Rel;
using fp8_block_gemm_test::kNan;
using fp8_block_gemm_test::MakeColwise;
using fp8_block_gemm_test::MakeRowwise;
using fp8_block_gemm_test::MakeWeights;
using fp8_block_gemm_test::MGroupedReference;
using fp8_block_gemm_test::Offsets;
using fp8_block_gemm_test::Ref;
using fp8_block_gemm_test::Rng;
using fp8_block_gemm_test::RowwiseHost;
using fp8_block_gemm_test::WeightGradientReference;
using fp8_block_gemm_test::WeightsHost;

// k = 384: three K blocks; n = 640: five N tiles in the forward and three (k) in the data
// gradient, both odd, so the 1 x 2 clusters compute a padding tile past N.
constexpr int kK = 384, kN = 640;
const std::vector<int> kMixedSizes = {0, 1, 37, 0, 200, 129, 300, 3, 0, 64, 255, 128, 0};

template <class T>
std::unique_ptr<DeviceBuffer> Upload(const std::vector<T>& v) {
  auto b = std::make_unique<DeviceBuffer>(v.size() * sizeof(T), sizeof(T));
  b->Upload(v.data(), v.size() * sizeof(T));
  return b;
}
const uint8_t* U8(const std::unique_ptr<DeviceBuffer>& b) {
  return reinterpret_cast<const uint8_t*>(b->i32());
}

Fp8BlockGroupedGemmOptions Options(int groups, int64_t max_rows, int k = kK, int n = kN) {
  Fp8BlockGroupedGemmOptions o;
  o.num_groups = groups;
  o.k = k;
  o.n = n;
  o.max_rows = max_rows;
  return o;
}

// An m-grouped product: A row-wise [max_rows][kred] (rows past offsets[G] NaN), the weights, and
// B's values as the kernel reads B: [E][nout][kred] (W^T for the forward, W for the data gradient).
struct MGroupedCase {
  std::vector<int32_t> offsets;
  int64_t max_rows = 0;
  int k = 0, n = 0;  // the forward's
  bool dgrad = false;
  int kred = 0, nout = 0;
  RowwiseHost a;
  WeightsHost w;
  std::vector<double> b;
};

MGroupedCase MakeMGrouped(const std::vector<int>& sizes, int k, int n, bool dgrad, uint64_t salt) {
  std::mt19937_64 rng = Rng(salt);
  MGroupedCase c;
  c.offsets = Offsets(sizes);
  c.max_rows = c.offsets.back() + 16;
  c.k = k;
  c.n = n;
  c.dgrad = dgrad;
  c.kred = dgrad ? n : k;
  c.nout = dgrad ? k : n;
  c.a = MakeRowwise(c.max_rows, c.kred, c.offsets.back(), &rng);
  const int experts = static_cast<int>(sizes.size());
  c.w = MakeWeights(experts, k, n, &rng);
  if (dgrad) {
    c.b = c.w.values;
  } else {
    c.b.resize(c.w.values.size());
    for (int64_t e = 0; e < experts; ++e) {
      for (int64_t i = 0; i < k; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          c.b[(e * n + j) * k + i] = c.w.values[(e * k + i) * n + j];
        }
      }
    }
  }
  return c;
}

// Runs the case's product once by every compiled m-grouped kernel, each into a poisoned output,
// and checks every row_stride-th row against the reference, every group row for being written,
// the rows past offsets[G] for the poison. (The reference is computed once.)
void RunMGrouped(const MGroupedCase& c, const char* what, int row_stride = 1) {
  const int groups = static_cast<int>(c.offsets.size()) - 1;
  const Ref ref = MGroupedReference(c.a.values, c.b, c.offsets, c.kred, c.nout, row_stride);
  auto a_data = Upload(c.a.data), a_scales = Upload(c.a.scales);
  auto b_data = Upload(c.dgrad ? c.w.data : c.w.data_t);
  auto b_scales = Upload(c.dgrad ? c.w.scales : c.w.scales_t);
  auto offsets = Upload(c.offsets);
  for (const std::string& kernel : Fp8BlockGroupedGemm::MGroupedKernelNames()) {
    SCOPED_TRACE(kernel);
    Fp8BlockGroupedGemmOptions o = Options(groups, c.max_rows, c.k, c.n);
    o.m_grouped_kernel = kernel;
    auto gemm = Fp8BlockGroupedGemm::Create(o);
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    EXPECT_EQ((*gemm)->KernelName().rfind(kernel, 0), 0u) << (*gemm)->KernelName();
    DeviceBuffer out(static_cast<size_t>(c.max_rows) * c.nout * 2, 2);  // poisoned
    const Fp8BlockOperand a{U8(a_data), a_scales->f32()}, b{U8(b_data), b_scales->f32()};
    Bf16* y = reinterpret_cast<Bf16*>(out.bf16());
    const absl::Status s = c.dgrad ? (*gemm)->BackwardData(a, b, offsets->i32(), y, nullptr)
                                   : (*gemm)->Forward(a, b, offsets->i32(), y, nullptr);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> host = out.ToHostBf16();
    std::vector<float> sampled;
    for (size_t r = 0; r < static_cast<size_t>(c.offsets.back()); r += row_stride) {
      sampled.insert(sampled.end(), host.begin() + r * c.nout, host.begin() + (r + 1) * c.nout);
    }
    ExpectClose(sampled, ref, sampled.size(), kBf16Rel, kBf16Abs, kBf16Norm, what);
    const size_t valid = static_cast<size_t>(c.offsets.back()) * c.nout;
    if (row_stride > 1) {
      size_t unwritten = 0;
      for (size_t i = 0; i < valid; ++i) unwritten += std::isnan(host[i]) ? 1 : 0;
      EXPECT_EQ(unwritten, 0u) << what << ": outputs left NaN (unwritten) in the groups' rows";
    }
    ExpectUntouched(host, valid, what);
  }
}

// Option errors name the field; checked before any device is looked at, so this runs everywhere.
TEST(Fp8BlockGroupedGemmOptionsTest, BadOptionsNameTheField) {
  struct Case {
    Fp8BlockGroupedGemmOptions options;
    const char* field;
  };
  std::vector<Case> cases;
  auto bad = [&](auto edit, const char* field) {
    Fp8BlockGroupedGemmOptions o = Options(4, 1024);
    edit(o);
    cases.push_back({o, field});
  };
  bad([](auto& o) { o.num_groups = 0; }, "num_groups");
  bad([](auto& o) { o.k = 96; }, "k must");
  bad([](auto& o) { o.k = 0; }, "k must");
  bad([](auto& o) { o.n = 200; }, "n must");
  bad([](auto& o) { o.n = -128; }, "n must");
  bad([](auto& o) { o.max_rows = 0; }, "max_rows");
  bad([](auto& o) { o.max_rows = int64_t{1} << 31; }, "max_rows");
  bad([](auto& o) { o.padded_rows = 100; }, "padded_rows");
  bad([](auto& o) { o.padded_rows = -128; }, "padded_rows");
  bad([](auto& o) { o.m_grouped_kernel = "no_such_kernel"; }, "m_grouped_kernel");
  bad([](auto& o) { o.weight_gradient_kernel = "no_such_kernel"; }, "weight_gradient_kernel");
  bad(
      [](auto& o) {  // a kernel that reads X's scales per column, asked for per-block scales
        o.weight_gradient_kernel = Fp8BlockGroupedGemm::WeightGradientKernelNames()[0];
        o.x_scaling = Fp8ColwiseScaling::kPerBlock;
      },
      "weight_gradient_kernel");
  bad([](auto& o) { o.x_scaling = static_cast<Fp8ColwiseScaling>(7); }, "x_scaling");
  bad([](auto& o) { o.expected_rows_per_group = -1; }, "expected_rows_per_group");
  for (const Case& c : cases) {
    auto created = Fp8BlockGroupedGemm::Create(c.options);
    ASSERT_FALSE(created.ok()) << c.field;
    EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument) << created.status();
    EXPECT_NE(created.status().message().find(c.field), std::string::npos) << created.status();
  }
  if (!gemm_test::HasHopperDevice()) {  // good options, no device: a precondition error
    auto created = Fp8BlockGroupedGemm::Create(Options(4, 1024));
    ASSERT_FALSE(created.ok());
    EXPECT_EQ(created.status().code(), absl::StatusCode::kFailedPrecondition) << created.status();
  }
}

// The default m-grouped kernel by output width and reduction length: the 192-wide N tile where it
// covers the width about as tightly as the 128-wide one (the benchmark layers' widths), in 1 x 2
// clusters for reductions up to 2048 and without beyond; else, where the unclustered 192-wide
// tile covers it, that tile for long reductions and the 256 x 128 wave kernel for reductions up
// to 2048; else 128. Host-only: runs everywhere.
TEST(Fp8BlockGroupedGemmOptionsTest, DefaultMGroupedKernelFollowsTheShape) {
  const std::string clustered = "fp8_block_coop_128x192x128_c1x2";
  const std::string unclustered = "fp8_block_coop_128x192x128_c1x1";
  const std::string wave = "fp8_block_wave_256x128x128_c1x2";
  const std::string narrow = "fp8_block_coop_128x128x128_c1x2";
  // An even count of 192-wide tiles covers these within 3%: 22 x 192 for 4096. Clustered up to a
  // 2048-long reduction, unclustered beyond.
  for (int width : {768, 1536, 4096, 7168, 14336, 28672}) {
    for (int reduction : {768, 2048}) {
      EXPECT_EQ(Fp8BlockGroupedGemm::MGroupedKernelFor(width, reduction), clustered) << width;
    }
    for (int reduction : {2176, 4096, 7168, 28672}) {
      EXPECT_EQ(Fp8BlockGroupedGemm::MGroupedKernelFor(width, reduction), unclustered) << width;
    }
  }
  // 11 x 192 = 2112 for 2048 (12 with the cluster: 89%), where 16 x 128 is exact: the wave
  // kernel up to a 2048-long reduction.
  EXPECT_EQ(Fp8BlockGroupedGemm::MGroupedKernelFor(2048, 7168), unclustered);
  EXPECT_EQ(Fp8BlockGroupedGemm::MGroupedKernelFor(2048, 2176), unclustered);
  EXPECT_EQ(Fp8BlockGroupedGemm::MGroupedKernelFor(2048, 2048), wave);
  EXPECT_EQ(Fp8BlockGroupedGemm::MGroupedKernelFor(2048, 768), wave);
  // 5 x 192 = 960 for 896 (93%), 128-wide tiles in pairs 8 x 128 (88%): the 192 tile, whatever
  // the reduction.
  EXPECT_EQ(Fp8BlockGroupedGemm::MGroupedKernelFor(896, 7168), unclustered);
  EXPECT_EQ(Fp8BlockGroupedGemm::MGroupedKernelFor(896, 768), unclustered);
  // 256 = 2 x 128 exactly; 192 would compute 384 columns (67%).
  EXPECT_EQ(Fp8BlockGroupedGemm::MGroupedKernelFor(256, 768), narrow);
  EXPECT_EQ(Fp8BlockGroupedGemm::MGroupedKernelFor(256, 7168), narrow);
  const std::vector<std::string> names = Fp8BlockGroupedGemm::MGroupedKernelNames();
  for (const std::string& chosen : {clustered, unclustered, wave, narrow}) {
    EXPECT_NE(std::find(names.begin(), names.end(), chosen), names.end()) << chosen;
  }
}

// The default weight-gradient kernel by the rows a group is expected to get: pingpong up to
// 1024 (qwen3: 8 K blocks a tile), cooperative beyond (dsv3 at EP 8, mixtral: 2048; with X per
// block the overlapped-promotion cooperative kernel), each for X's scale layout; unknown (0) is
// cooperative. Host-only: runs everywhere.
TEST(Fp8BlockGroupedGemmOptionsTest, DefaultWeightGradientKernelFollowsTheGroupSize) {
  for (Fp8ColwiseScaling scaling : {Fp8ColwiseScaling::kPerColumn, Fp8ColwiseScaling::kPerBlock}) {
    const std::string blocks = scaling == Fp8ColwiseScaling::kPerBlock ? "x_blocks_" : "";
    const std::string pingpong = "fp8_block_wgrad_" + blocks + "pingpong_64x128x128_c1x2";
    const std::string coop = "fp8_block_wgrad_" + blocks +
                             (scaling == Fp8ColwiseScaling::kPerBlock ? "coop_overlap_" : "coop_") +
                             "128x128x128_c1x2_d4";
    for (int64_t rows : {1, 256, 1000, 1024}) {
      EXPECT_EQ(Fp8BlockGroupedGemm::WeightGradientKernelFor(scaling, rows), pingpong) << rows;
    }
    for (int64_t rows : {0, 1025, 2048, 65536}) {
      EXPECT_EQ(Fp8BlockGroupedGemm::WeightGradientKernelFor(scaling, rows), coop) << rows;
    }
    const std::vector<std::string> names = Fp8BlockGroupedGemm::WeightGradientKernelNames(scaling);
    for (const std::string& chosen : {pingpong, coop}) {
      EXPECT_NE(std::find(names.begin(), names.end(), chosen), names.end()) << chosen;
    }
  }
}

class Fp8BlockGroupedGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gemm_test::HasHopperDevice()) GTEST_SKIP() << "SKIPPED: no CUDA device (Hopper sm_90)";
  }
};

TEST_F(Fp8BlockGroupedGemmTest, ForwardMatchesFp64OfDequantized) {
  RunMGrouped(MakeMGrouped(kMixedSizes, kK, kN, false, 1), "forward mixed");
  std::mt19937_64 rng = Rng(2);
  std::vector<int> sizes(20);
  for (int& s : sizes) s = rng() % 4 == 0 ? 0 : static_cast<int>(rng() % 400);
  RunMGrouped(MakeMGrouped(sizes, kK, kN, false, 3), "forward random");
}

TEST_F(Fp8BlockGroupedGemmTest, BackwardDataMatchesFp64OfDequantized) {
  RunMGrouped(MakeMGrouped(kMixedSizes, kK, kN, true, 4), "dgrad mixed");
}

// Long reductions (16 K blocks: the stage ring wraps) and several tiles per CTA (8 N tiles of ~50
// M tiles exceed the SM count), so the persistent walk crosses tile and group boundaries. Every 5th
// row is checked against the reference, every row for being written.
TEST_F(Fp8BlockGroupedGemmTest, LongReductionsAndManyTilesPerCta) {
  const std::vector<int> sizes = {700, 0, 1300, 513, 2048, 300, 1, 1100};
  RunMGrouped(MakeMGrouped(sizes, 2048, 1024, false, 5), "forward long", 5);
  RunMGrouped(MakeMGrouped(sizes, 1024, 2048, true, 6), "dgrad long", 5);
}

// Weights narrower than a 192-wide tile (128 and 256 columns: one partial N tile, whose scale
// loads run past the last expert's scales; the runner's slack keeps them inside its buffer, which
// compute-sanitizer checks), forward and data gradient by every kernel.
TEST_F(Fp8BlockGroupedGemmTest, WeightsNarrowerThanATile) {
  RunMGrouped(MakeMGrouped(kMixedSizes, 128, 128, false, 8), "forward 128 x 128");
  RunMGrouped(MakeMGrouped(kMixedSizes, 256, 128, true, 9), "dgrad 256 -> 128");
  RunMGrouped(MakeMGrouped(kMixedSizes, 128, 256, false, 10), "forward 128 -> 256");
}

// One NaN activation scale (a token's K block) and one NaN weight block scale: that token's row and
// that block's columns of the expert's rows are NaN, everything else finite and exact.
TEST_F(Fp8BlockGroupedGemmTest, NanScalesPropagateToTheirRowAndColumns) {
  MGroupedCase c = MakeMGrouped(kMixedSizes, kK, kN, false, 7);
  const int row = c.offsets[4] + 17, kblock = 2;  // group 4 (200 rows)
  c.a.scales[static_cast<size_t>(row) * (kK / kB) + kblock] = kNan;
  for (int i = 0; i < kB; ++i) c.a.values[static_cast<size_t>(row) * kK + kblock * kB + i] = kNan;
  const int expert = 6, iblock = 1, jblock = 3;  // group 6 (300 rows); W rows 128.., cols 384..
  c.w.scales_t[(static_cast<size_t>(expert) * (kN / kB) + jblock) * (kK / kB) + iblock] = kNan;
  for (int j = jblock * kB; j < (jblock + 1) * kB; ++j) {
    for (int i = iblock * kB; i < (iblock + 1) * kB; ++i) {
      c.b[(static_cast<size_t>(expert) * kN + j) * kK + i] = kNan;
    }
  }
  RunMGrouped(c, "forward NaN scales");
}

// Weight gradient from the column-wise operands, by every compiled weight-gradient kernel: padded
// groups (zero padding), empty groups exact zeros, padded rows past padded_offsets[G] NaN (never
// read); two group layouts. The per-block kernels get X scaled per 128 x 128 block.
struct WeightGradientKernel {
  std::string name;
  Fp8ColwiseScaling x_scaling;
};

std::vector<WeightGradientKernel> EveryWeightGradientKernel() {
  std::vector<WeightGradientKernel> kernels;
  for (Fp8ColwiseScaling scaling : {Fp8ColwiseScaling::kPerColumn, Fp8ColwiseScaling::kPerBlock}) {
    for (const std::string& name : Fp8BlockGroupedGemm::WeightGradientKernelNames(scaling)) {
      kernels.push_back({name, scaling});
    }
  }
  return kernels;
}

class Fp8BlockWeightGradientTest : public ::testing::TestWithParam<WeightGradientKernel> {
 protected:
  void SetUp() override {
    if (!gemm_test::HasHopperDevice()) GTEST_SKIP() << "SKIPPED: no CUDA device (Hopper sm_90)";
  }
};

TEST_P(Fp8BlockWeightGradientTest, MatchesFp64OfDequantized) {
  std::mt19937_64 rng = Rng(8);
  for (const std::vector<int>& sizes :
       {std::vector<int>{0, 1, 37, 0, 200, 129, 600, 3, 0, 64, 255, 33, 128},
        std::vector<int>{300, 0, 0, 1000, 5, 128, 0, 77, 256, 1, 0, 400, 2}}) {
    SCOPED_TRACE(sizes[0]);
    const int groups = static_cast<int>(sizes.size());
    const int64_t rows = Offsets(sizes).back() + 16;
    const ColwiseHost x = MakeColwise(sizes, rows, kK, &rng, GetParam().x_scaling);
    const ColwiseHost dy = MakeColwise(sizes, rows, kN, &rng);
    const Ref ref = WeightGradientReference(x, dy, kK, kN);

    Fp8BlockGroupedGemmOptions o = Options(groups, rows);
    o.padded_rows = x.padded_rows;
    o.weight_gradient_kernel = GetParam().name;
    o.x_scaling = GetParam().x_scaling;
    auto gemm = Fp8BlockGroupedGemm::Create(o);
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    EXPECT_NE((*gemm)->KernelName().find(GetParam().name), std::string::npos)
        << (*gemm)->KernelName();
    auto xd = Upload(x.data), xs = Upload(x.scales), dyd = Upload(dy.data), dys = Upload(dy.scales);
    auto poffsets = Upload(x.padded_offsets);
    const size_t count = ref.value.size();
    DeviceBuffer dw(count * 4, 4);  // poisoned
    ASSERT_TRUE((*gemm)
                    ->BackwardWeight({U8(xd), xs->f32()}, {U8(dyd), dys->f32()}, poffsets->i32(),
                                     dw.f32(), nullptr)
                    .ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> out = dw.ToHostF32();
    ExpectClose(out, ref, count, kF32Rel, kF32Abs, kF32Norm, "wgrad fp32");
    for (int e = 0; e < groups; ++e) {
      if (sizes[e] != 0) continue;
      size_t nonzero = 0;
      for (size_t i = 0; i < static_cast<size_t>(kK) * kN; ++i) {
        nonzero += out[e * static_cast<size_t>(kK) * kN + i] != 0.0f;
      }
      EXPECT_EQ(nonzero, 0u) << "empty group " << e << " gradient not exactly zero";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryKernel, Fp8BlockWeightGradientTest,
                         ::testing::ValuesIn(EveryWeightGradientKernel()),
                         [](const ::testing::TestParamInfo<WeightGradientKernel>& info) {
                           return info.param.name;
                         });

// Every group empty: Y and dX keep their poison everywhere, dW is all zeros.
TEST_F(Fp8BlockGroupedGemmTest, AllGroupsEmpty) {
  const int groups = 4;
  const int64_t rows = 64;
  auto gemm = Fp8BlockGroupedGemm::Create(Options(groups, rows));
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  std::mt19937_64 rng = Rng(9);
  const RowwiseHost x = MakeRowwise(rows, kK, rows, &rng), dy = MakeRowwise(rows, kN, rows, &rng);
  const WeightsHost w = MakeWeights(groups, kK, kN, &rng);
  const std::vector<int> sizes(groups, 0);
  const ColwiseHost xc = MakeColwise(sizes, rows, kK, &rng),
                    dyc = MakeColwise(sizes, rows, kN, &rng);
  auto xd = Upload(x.data), xs = Upload(x.scales), dyd = Upload(dy.data), dys = Upload(dy.scales);
  auto wd = Upload(w.data), ws = Upload(w.scales), wtd = Upload(w.data_t), wts = Upload(w.scales_t);
  auto xcd = Upload(xc.data), xcs = Upload(xc.scales), dycd = Upload(dyc.data),
       dycs = Upload(dyc.scales);
  auto offsets = Upload(Offsets(sizes)), poffsets = Upload(xc.padded_offsets);
  DeviceBuffer y(rows * kN * 2, 2), dx(rows * kK * 2, 2), dw(size_t{groups} * kK * kN * 4, 4);
  ASSERT_TRUE((*gemm)
                  ->Forward({U8(xd), xs->f32()}, {U8(wtd), wts->f32()}, offsets->i32(),
                            reinterpret_cast<Bf16*>(y.bf16()), nullptr)
                  .ok());
  ASSERT_TRUE((*gemm)
                  ->BackwardData({U8(dyd), dys->f32()}, {U8(wd), ws->f32()}, offsets->i32(),
                                 reinterpret_cast<Bf16*>(dx.bf16()), nullptr)
                  .ok());
  ASSERT_TRUE((*gemm)
                  ->BackwardWeight({U8(xcd), xcs->f32()}, {U8(dycd), dycs->f32()}, poffsets->i32(),
                                   dw.f32(), nullptr)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectUntouched(y.ToHostBf16(), 0, "forward");
  ExpectUntouched(dx.ToHostBf16(), 0, "dgrad");
  const std::vector<float> dwh = dw.ToHostF32();
  EXPECT_EQ(std::count(dwh.begin(), dwh.end(), 0.0f), static_cast<long>(dwh.size()))
      << "dW of empty groups must be exactly zero";
}

// The three products captured in one graph; each replay follows new device offsets (and new
// column-wise operands in the same buffers, as the quantizer would rewrite them).
TEST_F(Fp8BlockGroupedGemmTest, CapturedGraphFollowsDeviceOffsets) {
  const std::vector<std::vector<int>> plans = {{5, 0, 140, 33, 0, 300, 1, 90},
                                               {0, 260, 7, 0, 129, 64, 100, 9}};
  const int groups = 8;
  const int64_t max_rows = 600;
  std::mt19937_64 rng = Rng(10);
  const RowwiseHost x = MakeRowwise(max_rows, kK, max_rows, &rng);
  const RowwiseHost dy = MakeRowwise(max_rows, kN, max_rows, &rng);
  const WeightsHost w = MakeWeights(groups, kK, kN, &rng);
  std::vector<double> w_t(w.values.size());
  for (int64_t e = 0; e < groups; ++e) {
    for (int64_t i = 0; i < kK; ++i) {
      for (int64_t j = 0; j < kN; ++j) w_t[(e * kN + j) * kK + i] = w.values[(e * kK + i) * kN + j];
    }
  }
  Fp8BlockGroupedGemmOptions o = Options(groups, max_rows);
  auto gemm = Fp8BlockGroupedGemm::Create(o);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const int64_t p = Fp8ColwisePaddedRows(max_rows, groups);
  auto xd = Upload(x.data), xs = Upload(x.scales), dyd = Upload(dy.data), dys = Upload(dy.scales);
  auto wd = Upload(w.data), ws = Upload(w.scales), wtd = Upload(w.data_t), wts = Upload(w.scales_t);
  DeviceBuffer xcd(kK * p, 1), xcs(p / kB * kK * 4, 4), dycd(kN * p, 1), dycs(p / kB * kN * 4, 4);
  DeviceBuffer offsets((groups + 1) * 4, 4), poffsets((groups + 1) * 4, 4);
  DeviceBuffer y(max_rows * kN * 2, 2), dx(max_rows * kK * 2, 2), dw(size_t{groups} * kK * kN * 4, 4);
  const uint8_t* xcd8 = reinterpret_cast<const uint8_t*>(xcd.i32());
  const uint8_t* dycd8 = reinterpret_cast<const uint8_t*>(dycd.i32());

  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_TRUE((*gemm)
                  ->Forward({U8(xd), xs->f32()}, {U8(wtd), wts->f32()}, offsets.i32(),
                            reinterpret_cast<Bf16*>(y.bf16()), stream)
                  .ok());
  ASSERT_TRUE((*gemm)
                  ->BackwardData({U8(dyd), dys->f32()}, {U8(wd), ws->f32()}, offsets.i32(),
                                 reinterpret_cast<Bf16*>(dx.bf16()), stream)
                  .ok());
  ASSERT_TRUE((*gemm)
                  ->BackwardWeight({xcd8, xcs.f32()}, {dycd8, dycs.f32()}, poffsets.i32(),
                                   dw.f32(), stream)
                  .ok());
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    const std::vector<int>& sizes = plans[round % 2];
    const std::vector<int32_t> o = Offsets(sizes);
    const ColwiseHost xc = MakeColwise(sizes, max_rows, kK, &rng);
    const ColwiseHost dyc = MakeColwise(sizes, max_rows, kN, &rng);
    ASSERT_EQ(xc.padded_rows, p);
    offsets.Upload(o.data(), o.size() * 4);
    poffsets.Upload(xc.padded_offsets.data(), xc.padded_offsets.size() * 4);
    xcd.Upload(xc.data.data(), xc.data.size());
    xcs.Upload(xc.scales.data(), xc.scales.size() * 4);
    dycd.Upload(dyc.data.data(), dyc.data.size());
    dycs.Upload(dyc.scales.data(), dyc.scales.size() * 4);
    y.Poison();
    dx.Poison();
    dw.Poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const size_t fv = static_cast<size_t>(o.back()) * kN, bv = static_cast<size_t>(o.back()) * kK;
    const std::vector<float> yh = y.ToHostBf16(), dxh = dx.ToHostBf16(), dwh = dw.ToHostF32();
    ExpectClose(yh, MGroupedReference(x.values, w_t, o, kK, kN), fv, kBf16Rel, kBf16Abs,
                kBf16Norm, "graph forward");
    ExpectClose(dxh, MGroupedReference(dy.values, w.values, o, kN, kK), bv, kBf16Rel, kBf16Abs,
                kBf16Norm, "graph dgrad");
    ExpectClose(dwh, WeightGradientReference(xc, dyc, kK, kN), dwh.size(), kF32Rel, kF32Abs,
                kF32Norm, "graph wgrad");
    ExpectUntouched(yh, fv, "graph forward");
    ExpectUntouched(dxh, bv, "graph dgrad");
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_F(Fp8BlockGroupedGemmTest, BadPointersNameTheArgument) {
  auto gemm = Fp8BlockGroupedGemm::Create(Options(4, 128));
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  // "<forward>+<data gradient>+<weight gradient>", each product's default (the weight gradient's
  // for 128 / 4 rows a group).
  EXPECT_EQ((*gemm)->KernelName(), absl::StrCat(Fp8BlockGroupedGemm::MGroupedKernelFor(kN, kK), "+",
                                                Fp8BlockGroupedGemm::MGroupedKernelFor(kK, kN), "+",
                                                Fp8BlockGroupedGemm::WeightGradientKernelFor(
                                                    Options(4, 128).x_scaling, 128 / 4)));
  DeviceBuffer buf(1 << 20, 1);
  const uint8_t* u8 = reinterpret_cast<const uint8_t*>(buf.i32());
  const float* f = buf.f32();
  int32_t* offsets = buf.i32();
  Bf16* y = reinterpret_cast<Bf16*>(buf.bf16());
  const Fp8BlockOperand good{u8, f};
  auto message = [](const absl::Status& s) { return std::string(s.message()); };
  EXPECT_NE(message((*gemm)->Forward({nullptr, f}, good, offsets, y, nullptr)).find("x.data"),
            std::string::npos);
  EXPECT_NE(message((*gemm)->Forward(good, {u8 + 8, f}, offsets, y, nullptr)).find("w_t.data"),
            std::string::npos);
  EXPECT_NE(message((*gemm)->Forward({u8, f + 0}, {u8, reinterpret_cast<const float*>(u8 + 2)},
                                     offsets, y, nullptr))
                .find("w_t.scales"),
            std::string::npos);
  EXPECT_NE(message((*gemm)->Forward(good, good, nullptr, y, nullptr)).find("offsets"),
            std::string::npos);
  EXPECT_NE(message((*gemm)->BackwardData(good, good, offsets, y + 4, nullptr)).find("dx"),
            std::string::npos);
  EXPECT_NE(message((*gemm)->BackwardData(good, {u8, nullptr}, offsets, y, nullptr)).find("w.scales"),
            std::string::npos);
  EXPECT_NE(message((*gemm)->BackwardWeight(good, good, nullptr, buf.f32(), nullptr))
                .find("padded_offsets"),
            std::string::npos);
  EXPECT_NE(message((*gemm)->BackwardWeight(good, {nullptr, f}, offsets, buf.f32(), nullptr))
                .find("dy_colwise.data"),
            std::string::npos);
  EXPECT_NE(message((*gemm)->BackwardWeight(good, good, offsets, nullptr, nullptr)).find("dw"),
            std::string::npos);
}

}  // namespace
}  // namespace dropless::kernels
