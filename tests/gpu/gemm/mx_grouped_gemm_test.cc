// GPU tests of the MXFP8 grouped GEMM (kernels/include/dropless/kernels/mx_grouped_gemm.h): all
// three products against an fp64 CPU reference computed from the dequantized operands (the CPU
// MXFP8 quantizer of kernels/cpu), on fresh random data with a wide exponent range (so scales
// differ from block to block), outputs poisoned, group sizes including 0 and odd values, NaN
// scales, a captured CUDA graph, and the option / pointer checks (bounds: mx_gemm_test_util.h).
// The bf16-core products are in mx_core_gemm_test.cc. Without a Hopper GPU the device tests skip.
#include "dropless/kernels/mx_grouped_gemm.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dropless/kernels/mxfp8.h"
#include "tests/gpu/gemm/gemm_test_util.h"
#include "tests/gpu/gemm/mx_gemm_test_util.h"

namespace dropless::kernels {
namespace {

using gemm_test::DeviceBuffer;
using gemm_test::ExpectClose;
using gemm_test::Offsets;
using gemm_test::Ref;
using mx_test::kBf16Abs;
using mx_test::kBf16Norm;
using mx_test::kBf16Rel;
using mx_test::kF32Abs;
using mx_test::kF32Norm;
using mx_test::kF32Rel;
using mx_test::MakeMGrouped;
using mx_test::MGroupedCase;
using mx_test::MGroupedReference;
using mx_test::MxHost;
using mx_test::QuantizeRows;
using mx_test::RandomWide;
using mx_test::RunMGrouped;
using mx_test::Upload;

// Column-wise: data and scales block-major as the quantizer writes them ([P/32][cols][32] and
// [P/32][cols], mxfp8.h); values [cols][P] dequantized (column c, padded row p at c * P + p);
// padded offsets.
struct MxColHost {
  std::vector<uint8_t> data, scales;
  std::vector<int32_t> padded_offsets;
  std::vector<float> values;
  int64_t padded_rows = 0;
};

MxColHost QuantizeCols(const std::vector<Bf16>& x, int64_t rows, int64_t cols,
                       const std::vector<int32_t>& offsets) {
  const int groups = static_cast<int>(offsets.size()) - 1;
  MxColHost h;
  h.padded_rows = ColwisePaddedRows(rows, groups);
  h.data.assign(cols * h.padded_rows, 0x5A);  // block rows past the last group keep garbage
  h.scales.assign(cols * h.padded_rows / 32, 0x85);
  h.padded_offsets.resize(groups + 1);
  MxColwise out{h.data.data(), h.scales.data(), h.padded_offsets.data(), h.padded_rows};
  MxQuantizeShape shape{rows, cols, groups};
  EXPECT_TRUE(cpu::QuantizeMxfp8(shape, x.data(), offsets.data(), nullptr, &out).ok());
  h.values.resize(cols * h.padded_rows);
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t p = 0; p < h.padded_rows; ++p) {
      const int64_t block = (p / 32) * cols + c;  // block row p / 32, column c
      h.values[c * h.padded_rows + p] =
          MxElementValue(h.data[block * 32 + p % 32], h.scales[block]);
    }
  }
  return h;
}

class MxGroupedGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gemm_test::HasHopperDevice()) GTEST_SKIP() << "SKIPPED: no CUDA device (Hopper sm_90)";
  }
};

// k = 352: eleven K blocks (two full stages and a partial one), scale rows not 4-byte aligned;
// n = 256: K blocks of the data gradient 4-byte aligned, its output (k) ends in a partial tile.
constexpr int kK = 352, kN = 256;
const std::vector<int> kMixedSizes = {0, 1, 37, 0, 200, 129, 300, 3, 0, 64, 255, 0};

MxGroupedGemmOptions Options(int groups, int64_t max_rows) {
  MxGroupedGemmOptions o;
  o.num_groups = groups;
  o.k = kK;
  o.n = kN;
  o.max_rows = max_rows;
  return o;
}

TEST_F(MxGroupedGemmTest, ForwardMatchesFp64OfDequantized) {
  std::random_device rd;
  for (const std::string& kernel : MxGroupedGemm::KernelNames()) {
    RunMGrouped(MakeMGrouped(kMixedSizes, kK, kN, rd()), false, "forward mixed", kernel);
    std::mt19937_64 rng(rd());
    std::vector<int> sizes(20);
    for (int& s : sizes) s = rng() % 4 == 0 ? 0 : static_cast<int>(rng() % 400);
    RunMGrouped(MakeMGrouped(sizes, kK, kN, rd()), false, "forward random", kernel);
  }
}

TEST_F(MxGroupedGemmTest, BackwardDataMatchesFp64OfDequantized) {
  std::random_device rd;
  for (const std::string& kernel : MxGroupedGemm::KernelNames()) {
    RunMGrouped(MakeMGrouped(kMixedSizes, kN, kK, rd()), true, "dgrad mixed", kernel);
  }
}

// Long reductions (many stages, the stage ring wraps many times) and several tiles per CTA (the
// 8 N tiles of ~50 M tiles exceed the SM count), so every role's walk crosses tile and group
// boundaries; k = 1056 ends in one odd K block. Every 5th row is checked against the reference.
TEST_F(MxGroupedGemmTest, LongReductionsAndManyTilesPerCta) {
  std::random_device rd;
  const std::vector<int> sizes = {700, 0, 1300, 513, 2048, 300, 1, 1100};
  const MGroupedCase fwd = MakeMGrouped(sizes, 1056, 1024, rd());
  const MGroupedCase bwd = MakeMGrouped(sizes, 1024, 1056, rd());
  const Ref fwd_ref = MGroupedReference(fwd.a.values, fwd.b.values, fwd.offsets, 1056, 1024, 5);
  const Ref bwd_ref = MGroupedReference(bwd.a.values, bwd.b.values, bwd.offsets, 1024, 1056, 5);
  for (const std::string& kernel : MxGroupedGemm::KernelNames()) {
    RunMGrouped(fwd, false, "forward long", kernel, 5, &fwd_ref);
    RunMGrouped(bwd, true, "dgrad long", kernel, 5, &bwd_ref);
  }
}

// NaN scales: one A scale (a token row's block) and one B scale (an expert's output column's
// block) set to 0xFF; that row and that column of the expert's rows are NaN, the rest exact.
TEST_F(MxGroupedGemmTest, NanScalesPropagateToTheirRowAndColumn) {
  std::random_device rd;
  MGroupedCase c = MakeMGrouped(kMixedSizes, kK, kN, rd());
  const int nan_row = c.offsets[4] + 17;   // group 4 (200 rows)
  const int nan_group = 6, nan_col = 131;  // group 6 (300 rows), second N tile
  c.a.scales[static_cast<size_t>(nan_row) * (kK / 32) + 5] = kE8M0Nan;
  c.b.scales[(static_cast<size_t>(nan_group) * kN + nan_col) * (kK / 32) + 9] = kE8M0Nan;
  for (int k = 0; k < 32; ++k) {
    c.a.values[static_cast<size_t>(nan_row) * kK + 5 * 32 + k] =
        std::numeric_limits<float>::quiet_NaN();
    c.b.values[(static_cast<size_t>(nan_group) * kN + nan_col) * kK + 9 * 32 + k] =
        std::numeric_limits<float>::quiet_NaN();
  }
  for (const std::string& kernel : MxGroupedGemm::KernelNames()) {
    RunMGrouped(c, false, "forward NaN scales",
                kernel);  // NaN positions must match the reference's
  }
}

// Weight gradient from the column-wise (token-contiguous) operands, fp32 and bf16 outputs; empty
// groups give exact zeros.
// dW[e] = X_e^T . dY_e in fp64 over each group's padded rows of the dequantized column-wise
// operands ([kK][P] and [kN][P] values), with the magnitude sums of the error bound.
Ref WeightGradientReference(const MxColHost& x, const MxColHost& dy, int groups) {
  const int64_t p = x.padded_rows;
  Ref ref;
  ref.value.assign(static_cast<size_t>(groups) * kK * kN, 0.0);
  ref.magnitude.assign(ref.value.size(), 0.0);
  for (int e = 0; e < groups; ++e) {
    for (int i = 0; i < kK; ++i) {
      for (int j = 0; j < kN; ++j) {
        double sum = 0, mag = 0;
        for (int t = x.padded_offsets[e]; t < x.padded_offsets[e + 1]; ++t) {
          const double prod = static_cast<double>(x.values[i * p + t]) * dy.values[j * p + t];
          sum += prod;
          mag += std::fabs(prod);
        }
        ref.value[(static_cast<size_t>(e) * kK + i) * kN + j] = sum;
        ref.magnitude[(static_cast<size_t>(e) * kK + i) * kN + j] = mag;
      }
    }
  }
  return ref;
}

TEST_F(MxGroupedGemmTest, BackwardWeightMatchesFp64OfDequantized) {
  std::random_device rd;
  std::mt19937_64 rng(rd());
  const std::vector<int> sizes = {0, 1, 37, 0, 200, 129, 600, 3, 0, 64, 255, 33};
  const std::vector<int32_t> offsets = Offsets(sizes);
  const int64_t rows = offsets.back() + 16;
  const int groups = static_cast<int>(sizes.size());
  const MxColHost x = QuantizeCols(RandomWide(rows * kK, &rng), rows, kK, offsets);
  const MxColHost dy = QuantizeCols(RandomWide(rows * kN, &rng), rows, kN, offsets);
  const int64_t p = x.padded_rows;

  const Ref ref = WeightGradientReference(x, dy, groups);

  auto xd = Upload(x.data), xs = Upload(x.scales), dyd = Upload(dy.data), dys = Upload(dy.scales);
  auto poffsets = Upload(x.padded_offsets);
  auto as_u8 = [](DeviceBuffer* b) {
    return static_cast<const uint8_t*>(static_cast<void*>(b->i32()));
  };
  const MxOperand xa{as_u8(xd.get()), as_u8(xs.get())}, dya{as_u8(dyd.get()), as_u8(dys.get())};
  const size_t count = ref.value.size();
  for (const std::string& kernel : MxGroupedGemm::KernelNames()) {
    SCOPED_TRACE(kernel);
    MxGroupedGemmOptions o = Options(groups, rows);
    o.padded_rows = p;
    o.kernel = kernel;
    auto gemm = MxGroupedGemm::Create(o);
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    DeviceBuffer dw32(count * 4, 4), dw16(count * 2, 2);
    ASSERT_TRUE((*gemm)->BackwardWeight(xa, dya, poffsets->i32(), dw32.f32(), nullptr).ok());
    ASSERT_TRUE((*gemm)
                    ->BackwardWeight(xa, dya, poffsets->i32(), reinterpret_cast<Bf16*>(dw16.bf16()),
                                     nullptr)
                    .ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> out32 = dw32.ToHostF32(), out16 = dw16.ToHostBf16();
    ExpectClose(out32, ref, count, kF32Rel, kF32Abs, kF32Norm, "wgrad fp32");
    ExpectClose(out16, ref, count, kBf16Rel, kBf16Abs, kBf16Norm, "wgrad bf16");
    for (int e = 0; e < groups; ++e) {
      if (sizes[e] != 0) continue;
      size_t nonzero = 0;
      for (size_t i = 0; i < static_cast<size_t>(kK) * kN; ++i) {
        nonzero += out32[e * static_cast<size_t>(kK) * kN + i] != 0.0f;
        nonzero += out16[e * static_cast<size_t>(kK) * kN + i] != 0.0f;
      }
      EXPECT_EQ(nonzero, 0u) << "empty group " << e << " gradient not zero";
    }
  }
}

// One forward and one data-gradient launch captured in a graph; replays follow new device offsets.
TEST_F(MxGroupedGemmTest, CapturedGraphFollowsDeviceOffsets) {
  std::random_device rd;
  const std::vector<std::vector<int>> plans = {{5, 0, 140, 33, 0, 300, 1, 90},
                                               {0, 260, 7, 0, 129, 64, 100, 9}};
  const int64_t max_rows = 600;
  MGroupedCase fwd = MakeMGrouped(std::vector<int>(8, 0), kK, kN, rd());
  MGroupedCase bwd = MakeMGrouped(std::vector<int>(8, 0), kN, kK, rd());
  std::mt19937_64 rng(rd());
  fwd.a = QuantizeRows(RandomWide(max_rows * kK, &rng), max_rows, kK);
  bwd.a = QuantizeRows(RandomWide(max_rows * kN, &rng), max_rows, kN);
  auto gemm = MxGroupedGemm::Create(Options(8, max_rows));
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  auto op = [&](const MxHost& h) {
    keep.push_back(Upload(h.data));
    keep.push_back(Upload(h.scales));
    return MxOperand{static_cast<const uint8_t*>(static_cast<void*>(keep[keep.size() - 2]->i32())),
                     static_cast<const uint8_t*>(static_cast<void*>(keep.back()->i32()))};
  };
  const MxOperand fa = op(fwd.a), fb = op(fwd.b), ba = op(bwd.a), bb = op(bwd.b);
  DeviceBuffer offsets(9 * 4, 4), y(max_rows * kN * 2, 2), dx(max_rows * kK * 2, 2);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_TRUE(
      (*gemm)->Forward(fa, fb, offsets.i32(), reinterpret_cast<Bf16*>(y.bf16()), stream).ok());
  ASSERT_TRUE((*gemm)
                  ->BackwardData(ba, bb, offsets.i32(), reinterpret_cast<Bf16*>(dx.bf16()), stream)
                  .ok());
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (const std::vector<int>& sizes : plans) {
    const std::vector<int32_t> o = Offsets(sizes);
    offsets.Upload(o.data(), o.size() * 4);
    y.Poison();
    dx.Poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const size_t fv = static_cast<size_t>(o.back()) * kN, bv = static_cast<size_t>(o.back()) * kK;
    const std::vector<float> yh = y.ToHostBf16(), dxh = dx.ToHostBf16();
    ExpectClose(yh, MGroupedReference(fwd.a.values, fwd.b.values, o, kK, kN), fv, kBf16Rel,
                kBf16Abs, kBf16Norm, "graph forward");
    ExpectClose(dxh, MGroupedReference(bwd.a.values, bwd.b.values, o, kN, kK), bv, kBf16Rel,
                kBf16Abs, kBf16Norm, "graph dgrad");
    size_t touched = 0;
    for (size_t i = fv; i < yh.size(); ++i) touched += std::isnan(yh[i]) ? 0 : 1;
    for (size_t i = bv; i < dxh.size(); ++i) touched += std::isnan(dxh[i]) ? 0 : 1;
    EXPECT_EQ(touched, 0u) << "rows past offsets[E] were written";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The default weight gradient picks its tile shape on the device from each call's padded group
// sizes (kernel_choice.h): long groups take the 256 x 128 kernel, short ones the 128 x 128 kernel.
// One captured graph replays both choices against fp64; the gradient is poisoned before each run.
TEST_F(MxGroupedGemmTest, DefaultWeightGradientFollowsEachCallsGroups) {
  std::random_device rd;
  const uint64_t seed = rd();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const std::vector<std::vector<int>> plans = {
      {600, 520, 0, 700, 512, 60},   // 97% of the padded rows in groups of >= 512: wide
      {40, 300, 0, 7, 600, 129}};    // 51%: 128 x 128
  const int groups = 6;
  const int64_t rows = 2400;
  const std::vector<Bf16> xv = RandomWide(rows * kK, &rng), dyv = RandomWide(rows * kN, &rng);
  MxGroupedGemmOptions o = Options(groups, rows);
  o.padded_rows = ColwisePaddedRows(rows, groups);
  auto gemm = MxGroupedGemm::Create(o);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const std::vector<std::string> names = MxGroupedGemm::KernelNames();
  ASSERT_NE((*gemm)->KernelName().find(names[0] + "|" + names[2]), std::string::npos);

  const size_t count = static_cast<size_t>(groups) * kK * kN;
  const size_t data_bytes = static_cast<size_t>(kK) * o.padded_rows;
  DeviceBuffer xd(data_bytes, 4), xs(data_bytes / 32, 4), dyd(data_bytes / kK * kN, 4),
      dys(data_bytes / kK * kN / 32, 4), poffsets((groups + 1) * 4, 4), dw(count * 4, 4);
  auto u8 = [](DeviceBuffer& b) { return static_cast<const uint8_t*>(static_cast<void*>(b.i32())); };
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_TRUE((*gemm)
                  ->BackwardWeight({u8(xd), u8(xs)}, {u8(dyd), u8(dys)}, poffsets.i32(), dw.f32(),
                                   stream)
                  .ok());
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int round = 0; round < 3; ++round) {
    const std::vector<int>& sizes = plans[round % 2];
    SCOPED_TRACE(round);
    const std::vector<int32_t> offsets = Offsets(sizes);
    const MxColHost x = QuantizeCols(xv, rows, kK, offsets);
    const MxColHost dy = QuantizeCols(dyv, rows, kN, offsets);
    ASSERT_EQ(x.padded_rows, o.padded_rows);
    xd.Upload(x.data.data(), x.data.size());
    xs.Upload(x.scales.data(), x.scales.size());
    dyd.Upload(dy.data.data(), dy.data.size());
    dys.Upload(dy.scales.data(), dy.scales.size());
    poffsets.Upload(x.padded_offsets.data(), x.padded_offsets.size() * 4);
    dw.Poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ExpectClose(dw.ToHostF32(), WeightGradientReference(x, dy, groups), count, kF32Rel, kF32Abs, kF32Norm, "paired wgrad fp32");
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The default choice: 256 x 128 tiles (KernelNames()[0]) for the m-grouped products once the
// token buffers hold 256 rows; the weight gradient chooses between 256 x 128 and 128 x 128 tiles
// (KernelNames()[2]) per call on the device when k >= 256, else runs 128 x 128; forcing a kernel by
// name applies it to every product.
TEST_F(MxGroupedGemmTest, DefaultKernelFollowsShapes) {
  const std::vector<std::string> names = MxGroupedGemm::KernelNames();
  ASSERT_GE(names.size(), 3u);
  auto name = [](int64_t max_rows, int k, int64_t expected, const std::string& kernel) {
    MxGroupedGemmOptions o = Options(8, max_rows);
    o.k = k;
    o.expected_rows_per_group = expected;
    o.kernel = kernel;
    auto gemm = MxGroupedGemm::Create(o);
    EXPECT_TRUE(gemm.ok()) << gemm.status();
    return gemm.ok() ? (*gemm)->KernelName() : std::string();
  };
  const std::string paired = names[0] + "|" + names[2];
  EXPECT_EQ(name(4096, 1024, 0, ""), names[0] + "+" + paired);
  EXPECT_EQ(name(4096, 1024, 2048, ""), names[0] + "+" + paired);
  EXPECT_EQ(name(4096, 1024, 256, ""), names[0] + "+" + paired);
  EXPECT_EQ(name(100, 1024, 0, ""), names[2] + "+" + paired);
  EXPECT_EQ(name(100, 128, 0, ""), names[2]);
  EXPECT_EQ(name(4096, 1024, 256, names[1]), names[1]);
}

TEST_F(MxGroupedGemmTest, BadOptionsAndPointersNameTheField) {
  MxGroupedGemmOptions o = Options(4, 128);
  o.k = 48;
  auto bad = MxGroupedGemm::Create(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("k must"), std::string::npos) << bad.status();
  o = Options(0, 128);
  EXPECT_NE(MxGroupedGemm::Create(o).status().message().find("num_groups"), std::string::npos);
  o = Options(4, 128);
  o.kernel = "no_such_kernel";
  EXPECT_NE(MxGroupedGemm::Create(o).status().message().find("kernel"), std::string::npos);
  auto gemm = MxGroupedGemm::Create(Options(4, 128));
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  DeviceBuffer buf(1 << 20, 1);
  const uint8_t* base = static_cast<const uint8_t*>(static_cast<void*>(buf.i32()));
  Bf16* y = reinterpret_cast<Bf16*>(buf.bf16());
  const absl::Status null_x =
      (*gemm)->Forward(MxOperand{nullptr, base}, MxOperand{base, base}, buf.i32(), y, nullptr);
  EXPECT_NE(null_x.message().find("x.data"), std::string::npos) << null_x;
  const absl::Status misaligned =
      (*gemm)->Forward(MxOperand{base, base}, MxOperand{base + 8, base}, buf.i32(), y, nullptr);
  EXPECT_NE(misaligned.message().find("w_t.data"), std::string::npos) << misaligned;
  const absl::Status no_offsets = (*gemm)->BackwardWeight(
      MxOperand{base, base}, MxOperand{base, base}, nullptr, buf.f32(), nullptr);
  EXPECT_NE(no_offsets.message().find("padded_offsets"), std::string::npos) << no_offsets;
}

}  // namespace
}  // namespace dropless::kernels
