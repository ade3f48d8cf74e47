// The device-side kernel choices of the grouped GEMMs (kernel_choice.h): the bf16 cluster pair and
// the MXFP8 weight gradient's tile shape, on the benchmark's group-size distributions and on edge
// cases.
#include "kernels/cuda/grouped_gemm/kernel_choice.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace dropless::kernels::grouped_gemm_internal {
namespace {

// The rule as paired_runner.cu's kernel applies it: tiles and padding summed over the groups.
bool Choose(const std::vector<int64_t>& sizes) {
  int64_t tiles = 0, padding = 0;
  for (int64_t s : sizes) {
    tiles += GroupTilesM(s);
    padding += ClusterPaddingTiles(s);
  }
  return PreferClusterAlongM(tiles, padding);
}

// As GroupSizes in bench/gemm_bench_common.h.
std::vector<int64_t> Sizes(int64_t rows, int experts, bool zipf) {
  std::vector<int64_t> sizes(experts, zipf ? 0 : rows / experts);
  if (zipf) {
    double harmonic = 0;
    for (int e = 0; e < experts; ++e) harmonic += 1.0 / (e + 1);
    for (int e = 0; e < experts; ++e) {
      sizes[e] = static_cast<int64_t>(static_cast<double>(rows) / (e + 1) / harmonic);
    }
  }
  int64_t assigned = 0;
  for (int64_t s : sizes) assigned += s;
  for (int e = 0; assigned < rows; e = (e + 1) % experts, ++assigned) ++sizes[e];
  return sizes;
}

TEST(ClusterChoice, TilesAndPaddingPerGroup) {
  EXPECT_EQ(GroupTilesM(0), 0);
  EXPECT_EQ(GroupTilesM(1), 1);
  EXPECT_EQ(GroupTilesM(128), 1);
  EXPECT_EQ(GroupTilesM(129), 2);
  EXPECT_EQ(ClusterPaddingTiles(0), 0);
  EXPECT_EQ(ClusterPaddingTiles(100), 1);
  EXPECT_EQ(ClusterPaddingTiles(256), 0);
  EXPECT_EQ(ClusterPaddingTiles(257), 1);
}

TEST(ClusterChoice, BenchmarkShapesTakeTheMeasuredFasterCluster) {
  // Uniform groups of even tile counts: no padding, the 2x1 cluster.
  EXPECT_TRUE(Choose(Sizes(8192 * 8, 256, false)));   // dsv3: 256 rows, 2 tiles each
  EXPECT_TRUE(Choose(Sizes(16384 * 8, 128, false)));  // qwen3: 1024 rows
  EXPECT_TRUE(Choose(Sizes(8192 * 2, 8, false)));     // mixtral: 2048 rows
  // zipf: dsv3 31% and qwen3 5.4% padding tiles take the 1x2 cluster; mixtral's 0.8% the 2x1.
  EXPECT_FALSE(Choose(Sizes(8192 * 8, 256, true)));
  EXPECT_FALSE(Choose(Sizes(16384 * 8, 128, true)));
  EXPECT_TRUE(Choose(Sizes(8192 * 2, 8, true)));
}

TEST(ClusterChoice, ThresholdAndEmptyCalls) {
  EXPECT_FALSE(Choose({}));
  EXPECT_FALSE(Choose({0, 0, 0}));    // no tiles: either kernel does nothing; the 1x2 one runs
  EXPECT_FALSE(Choose({1}));          // 1 tile, 1 padding
  // 51 tiles with one padding tile (under 2%) take the 2x1 cluster; 49 (over 2%) do not.
  std::vector<int64_t> fifty(24, 256);
  fifty.push_back(128 * 2);
  fifty.push_back(128);  // 24 * 2 + 2 + 1 = 51 tiles, 1 padding
  EXPECT_TRUE(Choose(fifty));
  std::vector<int64_t> fortynine(24, 256);
  fortynine.push_back(128);  // 49 tiles, 1 padding
  EXPECT_FALSE(Choose(fortynine));
}

// The MXFP8 weight-gradient rule as ChooseWeightGradientKernel applies it, over padded sizes.
bool ChooseWide(const std::vector<int64_t>& sizes) {
  int64_t rows = 0, long_rows = 0;
  for (int64_t s : sizes) {
    const int64_t padded = (s + 31) / 32 * 32;
    rows += padded;
    long_rows += padded >= kWideWgradGroupRows ? padded : 0;
  }
  return PreferWideWeightGradient(long_rows, rows);
}

TEST(WeightGradientChoice, BenchmarkShapesTakeTheMeasuredFasterTiles) {
  EXPECT_FALSE(ChooseWide(Sizes(8192 * 8, 256, false)));  // dsv3: 256-row groups
  EXPECT_FALSE(ChooseWide(Sizes(8192 * 8, 256, true)));   // 57% of rows in long groups
  EXPECT_TRUE(ChooseWide(Sizes(16384 * 8, 128, false)));  // qwen3: 1024-row groups
  EXPECT_FALSE(ChooseWide(Sizes(16384 * 8, 128, true)));  // 82%
  EXPECT_TRUE(ChooseWide(Sizes(8192 * 2, 8, false)));     // mixtral
  EXPECT_TRUE(ChooseWide(Sizes(8192 * 2, 8, true)));
}

TEST(WeightGradientChoice, ThresholdAndEmptyCalls) {
  EXPECT_FALSE(ChooseWide({}));
  EXPECT_FALSE(ChooseWide({0, 0}));
  EXPECT_TRUE(ChooseWide({512}));
  EXPECT_FALSE(ChooseWide({480}));  // pads to 480: a short group
  EXPECT_TRUE(ChooseWide({481}));   // pads to 512: a long one
  EXPECT_TRUE(PreferWideWeightGradient(900, 1000));   // exactly 90%
  EXPECT_FALSE(PreferWideWeightGradient(899, 1000));
  EXPECT_TRUE(ChooseWide({600, 520, 0, 700, 512, 60}));  // the GPU test's two plans
  EXPECT_FALSE(ChooseWide({40, 300, 0, 7, 600, 129}));
}

// The fp32 weight gradient's device classes, from the memory clock (kHz) and bus width (bits)
// that the devices report.
TEST(MemoryBandwidthClass, HopperPartsFallOnTheirSideOfTheGap) {
  EXPECT_NEAR(PeakMemoryBytesPerSecond(2619000, 5120), 3.352e12, 1e9);  // H100 SXM, HBM3
  EXPECT_FALSE(IsHighMemoryBandwidth(2619000, 5120));
  EXPECT_NEAR(PeakMemoryBytesPerSecond(3201000, 6144), 4.917e12, 1e9);  // H200, HBM3e
  EXPECT_TRUE(IsHighMemoryBandwidth(3201000, 6144));
  EXPECT_FALSE(IsHighMemoryBandwidth(2619000, 6144));  // 4.0 TB/s parts (H100 NVL, GH200-96GB)
  EXPECT_FALSE(IsHighMemoryBandwidth(0, 6144));        // no clock reported
}

}  // namespace
}  // namespace dropless::kernels::grouped_gemm_internal
