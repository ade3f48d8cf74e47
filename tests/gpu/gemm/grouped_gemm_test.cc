// GPU tests of the grouped GEMM (kernels/include/dropless/kernels/grouped_gemm.h): every compiled
// kernel of every product against an fp64 CPU reference on fresh random data, with poisoned
// outputs, group sizes including 0 and odd values, device-side offsets captured in a CUDA graph.
// Without a Hopper GPU the device tests skip and say so.
#include "dropless/kernels/grouped_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/grouped_gemm/grouped_gemm_runner.h"
#include "kernels/cuda/grouped_gemm/kernel_choice.h"
#include "tests/gpu/gemm/gemm_test_util.h"

namespace dropless::kernels {
namespace {

using gemm_test::Problem;

constexpr double kTolerance = 1e-2;

class GroupedGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gemm_test::HasHopperDevice()) GTEST_SKIP() << "SKIPPED: no CUDA device (Hopper sm_90)";
  }

  static GroupedGemmOptions Options(const Problem& p, GradType grad) {
    GroupedGemmOptions o;
    o.num_groups = static_cast<int>(p.sizes.size());
    o.k = p.k;
    o.n = p.n;
    o.max_rows = p.max_rows;
    o.weight_grad_type = grad;
    return o;
  }
};

// Sizes chosen to cover empty groups, single rows, odd counts, counts just past a tile multiple,
// and a group larger than several tiles; k and n are multiples of 8 but not of the tile sizes.
Problem MixedProblem(uint64_t seed) {
  return gemm_test::MakeProblem({0, 1, 37, 0, 200, 129, 513, 3, 0, 64, 255, 0}, 264, 392, seed);
}

Problem RandomProblem(uint64_t seed) {
  std::mt19937_64 rng(seed ^ gemm_test::RunSeed());
  std::vector<int> sizes(24);
  for (int& s : sizes) s = (rng() % 4 == 0) ? 0 : static_cast<int>(rng() % 300);
  return gemm_test::MakeProblem(sizes, 512, 200, seed + 1);
}

TEST_F(GroupedGemmTest, ForwardEveryKernelMatchesFp64) {
  for (const std::string& name : GroupedGemm::KernelNames(GroupedGemmOp::kForward, GradType::kFloat32)) {
    SCOPED_TRACE(name);
    for (const Problem& p : {MixedProblem(11), RandomProblem(12)}) {
      GroupedGemmOptions o = Options(p, GradType::kFloat32);
      o.forward_kernel = name;
      auto gemm = GroupedGemm::Create(o);
      ASSERT_TRUE(gemm.ok()) << gemm.status();
      gemm_test::Operands d(p);
      ASSERT_TRUE((*gemm)->Forward(d.x.bf16(), d.w.bf16(), d.offsets.i32(), d.y.bf16(), nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      gemm_test::ExpectRowsMatch(d.y.ToHostBf16(), gemm_test::ReferenceForward(p), p, p.n,
                                 kTolerance);
    }
  }
}

TEST_F(GroupedGemmTest, BackwardDataEveryKernelMatchesFp64) {
  for (const std::string& name :
       GroupedGemm::KernelNames(GroupedGemmOp::kBackwardData, GradType::kFloat32)) {
    SCOPED_TRACE(name);
    for (const Problem& p : {MixedProblem(21), RandomProblem(22)}) {
      GroupedGemmOptions o = Options(p, GradType::kFloat32);
      o.backward_data_kernel = name;
      auto gemm = GroupedGemm::Create(o);
      ASSERT_TRUE(gemm.ok()) << gemm.status();
      gemm_test::Operands d(p);
      ASSERT_TRUE(
          (*gemm)->BackwardData(d.dy.bf16(), d.w.bf16(), d.offsets.i32(), d.dx.bf16(), nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      gemm_test::ExpectRowsMatch(d.dx.ToHostBf16(), gemm_test::ReferenceBackwardData(p), p, p.k,
                                 kTolerance);
    }
  }
}

// The fixed-map kernels over many tiles per CTA: every persistent CTA walks several tiles and
// groups (its producer runs ahead into the next tile, the accumulators restart, the epilogue
// buffer is reused across tiles), the ping-pong kernel's two warpgroups alternate (k = 40: one K
// stage per tile, so the turn barrier flips every tile), the 2x1 cluster pads odd M-tile counts,
// the stage ring wraps, K and N tails, and the last group ends exactly at max_rows.
TEST_F(GroupedGemmTest, FixedMapKernelsWalkManyTilesPerCta) {
  std::mt19937_64 rng(gemm_test::RunSeed() ^ 0x7a11);
  std::vector<int> sizes(64);
  for (int& s : sizes) s = (rng() % 5 == 0) ? 0 : static_cast<int>(rng() % 700);
  sizes.back() = 383;  // an odd M-tile count, ending at max_rows
  for (const Problem& p : {gemm_test::MakeProblem(sizes, 520, 392, 51, /*pad_rows=*/0),
                           gemm_test::MakeProblem(sizes, 40, 136, 52, /*pad_rows=*/0)}) {
    SCOPED_TRACE(testing::Message() << "k=" << p.k << " n=" << p.n << " rows=" << p.max_rows);
    const std::vector<double> ref_fwd = gemm_test::ReferenceForward(p);
    const std::vector<double> ref_dgrad = gemm_test::ReferenceBackwardData(p);
    for (const char* name : {"tma_128x256x64", "tma_pingpong_128x128x64", "tma_128x256x64_c2x1"}) {
      SCOPED_TRACE(name);
      GroupedGemmOptions o = Options(p, GradType::kFloat32);
      o.forward_kernel = o.backward_data_kernel = name;
      auto gemm = GroupedGemm::Create(o);
      ASSERT_TRUE(gemm.ok()) << gemm.status();
      gemm_test::Operands d(p);
      ASSERT_TRUE(
          (*gemm)->Forward(d.x.bf16(), d.w.bf16(), d.offsets.i32(), d.y.bf16(), nullptr).ok());
      ASSERT_TRUE(
          (*gemm)->BackwardData(d.dy.bf16(), d.w.bf16(), d.offsets.i32(), d.dx.bf16(), nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      gemm_test::ExpectRowsMatch(d.y.ToHostBf16(), ref_fwd, p, p.n, kTolerance);
      gemm_test::ExpectRowsMatch(d.dx.ToHostBf16(), ref_dgrad, p, p.k, kTolerance);
    }
  }
}

// The fixed-map weight gradient over many tiles per CTA. Its last stage of a group holds rows of the
// next group or of the buffer past offsets[E]: here those padding rows of X and dY are NaN, and
// must contribute nothing.
TEST_F(GroupedGemmTest, FixedMapWeightGradientIgnoresRowsPastItsGroup) {
  std::mt19937_64 rng(gemm_test::RunSeed() ^ 0x3d1f);
  std::vector<int> sizes(48);
  for (int& s : sizes) s = (rng() % 5 == 0) ? 0 : static_cast<int>(rng() % 300);
  Problem p = gemm_test::MakeProblem(sizes, 392, 520, 61, /*pad_rows=*/40);
  const uint16_t kNaN = 0x7FC0;
  for (int64_t r = p.offsets.back(); r < p.max_rows; ++r) {
    std::fill(p.x.begin() + r * p.k, p.x.begin() + (r + 1) * p.k, kNaN);
    std::fill(p.dy.begin() + r * p.n, p.dy.begin() + (r + 1) * p.n, kNaN);
  }
  const std::vector<double> ref = gemm_test::ReferenceBackwardWeight(p);
  for (GradType grad : {GradType::kFloat32, GradType::kBFloat16}) {
    SCOPED_TRACE(grad == GradType::kFloat32 ? "fp32" : "bf16");
    GroupedGemmOptions o = Options(p, grad);
    o.backward_weight_kernel = "tma_128x256x64";
    auto gemm = GroupedGemm::Create(o);
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    gemm_test::Operands d(p);
    if (grad == GradType::kFloat32) {
      ASSERT_TRUE((*gemm)->BackwardWeight(d.x.bf16(), d.dy.bf16(), d.offsets.i32(), d.dw32.f32(),
                                          nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      gemm_test::ExpectWeightsMatch(d.dw32.ToHostF32(), ref, p, kTolerance);
    } else {
      ASSERT_TRUE((*gemm)->BackwardWeight(d.x.bf16(), d.dy.bf16(), d.offsets.i32(), d.dw16.bf16(),
                                          nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      gemm_test::ExpectWeightsMatch(d.dw16.ToHostBf16(), ref, p, kTolerance);
    }
  }
}

TEST_F(GroupedGemmTest, BackwardWeightEveryKernelMatchesFp64) {
  for (GradType grad : {GradType::kFloat32, GradType::kBFloat16}) {
    std::vector<std::string> names = GroupedGemm::KernelNames(GroupedGemmOp::kBackwardWeight, grad);
    // The visiting-order variants (tiles along N) that the fp32 defaults name above 1024 rows.
    if (grad == GradType::kFloat32) {
      names.push_back("pingpong_128x128x64_c2x1@N1");
      names.push_back("coop_128x256x64_c2x1@N1");
    }
    for (const std::string& name : names) {
      SCOPED_TRACE(name + (grad == GradType::kFloat32 ? " fp32" : " bf16"));
      for (const Problem& p : {MixedProblem(31), RandomProblem(32)}) {
        GroupedGemmOptions o = Options(p, grad);
        o.backward_weight_kernel = name;
        auto gemm = GroupedGemm::Create(o);
        ASSERT_TRUE(gemm.ok()) << gemm.status();
        gemm_test::Operands d(p);
        const std::vector<double> ref = gemm_test::ReferenceBackwardWeight(p);
        if (grad == GradType::kFloat32) {
          ASSERT_TRUE((*gemm)->BackwardWeight(d.x.bf16(), d.dy.bf16(), d.offsets.i32(),
                                              d.dw32.f32(), nullptr).ok());
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          gemm_test::ExpectWeightsMatch(d.dw32.ToHostF32(), ref, p, kTolerance);
        } else {
          ASSERT_TRUE((*gemm)->BackwardWeight(d.x.bf16(), d.dy.bf16(), d.offsets.i32(),
                                              d.dw16.bf16(), nullptr).ok());
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          gemm_test::ExpectWeightsMatch(d.dw16.ToHostBf16(), ref, p, kTolerance);
        }
      }
    }
  }
}

TEST_F(GroupedGemmTest, CublasLtReferenceMatchesFp64) {
  const Problem p = MixedProblem(41);
  auto gemm = CublasLtGroupedGemm::Create(static_cast<int>(p.sizes.size()), p.k, p.n);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  gemm_test::Operands d(p);
  ASSERT_TRUE((*gemm)->Forward(d.x.bf16(), d.w.bf16(), p.offsets, d.y.bf16(), nullptr).ok());
  ASSERT_TRUE((*gemm)->BackwardData(d.dy.bf16(), d.w.bf16(), p.offsets, d.dx.bf16(), nullptr).ok());
  ASSERT_TRUE(
      (*gemm)->BackwardWeight(d.x.bf16(), d.dy.bf16(), p.offsets, d.dw32.f32(), nullptr).ok());
  ASSERT_TRUE(
      (*gemm)->BackwardWeight(d.x.bf16(), d.dy.bf16(), p.offsets, d.dw16.bf16(), nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  gemm_test::ExpectRowsMatch(d.y.ToHostBf16(), gemm_test::ReferenceForward(p), p, p.n, kTolerance);
  gemm_test::ExpectRowsMatch(d.dx.ToHostBf16(), gemm_test::ReferenceBackwardData(p), p, p.k,
                             kTolerance);
  const std::vector<double> ref = gemm_test::ReferenceBackwardWeight(p);
  gemm_test::ExpectWeightsMatch(d.dw32.ToHostF32(), ref, p, kTolerance);
  gemm_test::ExpectWeightsMatch(d.dw16.ToHostBf16(), ref, p, kTolerance);
}

// The group sizes live only on the device: a graph captured once follows new offsets written into
// the same buffer, with no host involvement.
TEST_F(GroupedGemmTest, CapturedGraphFollowsDeviceOffsets) {
  Problem first = gemm_test::MakeProblem({5, 0, 300, 17, 0, 90}, 128, 256, 51);
  Problem second = first;
  second.sizes = {0, 211, 1, 0, 150, 50};
  gemm_test::SetOffsets(&second);
  ASSERT_EQ(first.offsets.back(), second.offsets.back());

  auto gemm = GroupedGemm::Create(Options(first, GradType::kFloat32));
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  gemm_test::Operands d(first);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  absl::Status fwd = (*gemm)->Forward(d.x.bf16(), d.w.bf16(), d.offsets.i32(), d.y.bf16(), stream);
  absl::Status wgrad =
      (*gemm)->BackwardWeight(d.x.bf16(), d.dy.bf16(), d.offsets.i32(), d.dw32.f32(), stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(fwd.ok()) << fwd;
  ASSERT_TRUE(wgrad.ok()) << wgrad;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  for (const Problem* p : {&first, &second}) {
    d.offsets.Upload(p->offsets.data(), p->offsets.size() * sizeof(int32_t));
    d.y.Poison();
    d.dw32.Poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    gemm_test::ExpectRowsMatch(d.y.ToHostBf16(), gemm_test::ReferenceForward(*p), *p, p->n,
                               kTolerance);
    gemm_test::ExpectWeightsMatch(d.dw32.ToHostF32(), gemm_test::ReferenceBackwardWeight(*p), *p,
                                  kTolerance);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The paired kernel chooses its cluster on the device from each call's offsets
// (kernel_choice.h): even tile counts take the 2x1-cluster kernel, a skewed split of the same rows
// the 1x2 one. One captured graph replays both, forward and data gradient, against fp64.
TEST_F(GroupedGemmTest, PairedClusterKernelFollowsEachCallsGroups) {
  Problem even = gemm_test::MakeProblem({256, 0, 130, 200, 512, 256}, 264, 392, 61);  // no padding
  Problem skewed = even;
  skewed.sizes = {1, 129, 0, 3, 1000, 221};  // 14 tiles, 2 of padding under a 2x1 cluster
  gemm_test::SetOffsets(&skewed);
  ASSERT_EQ(even.offsets.back(), skewed.offsets.back());

  GroupedGemmOptions o = Options(even, GradType::kFloat32);
  o.forward_kernel = o.backward_data_kernel = "coop_128x256x64_c2x1_or_c1x2";
  auto gemm = GroupedGemm::Create(o);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  EXPECT_EQ((*gemm)->KernelName(GroupedGemmOp::kForward), "coop_128x256x64_c2x1_or_c1x2");
  gemm_test::Operands d(even);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  absl::Status fwd = (*gemm)->Forward(d.x.bf16(), d.w.bf16(), d.offsets.i32(), d.y.bf16(), stream);
  absl::Status dgrad =
      (*gemm)->BackwardData(d.dy.bf16(), d.w.bf16(), d.offsets.i32(), d.dx.bf16(), stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(fwd.ok()) << fwd;
  ASSERT_TRUE(dgrad.ok()) << dgrad;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (const Problem* p : {&even, &skewed, &even}) {
    d.offsets.Upload(p->offsets.data(), p->offsets.size() * sizeof(int32_t));
    d.y.Poison();
    d.dx.Poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    gemm_test::ExpectRowsMatch(d.y.ToHostBf16(), gemm_test::ReferenceForward(*p), *p, p->n,
                               kTolerance);
    gemm_test::ExpectRowsMatch(d.dx.ToHostBf16(), gemm_test::ReferenceBackwardData(*p), *p, p->k,
                               kTolerance);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_F(GroupedGemmTest, AllGroupsEmptyWritesOnlyZeroGradients) {
  const Problem p = gemm_test::MakeProblem({0, 0, 0, 0}, 64, 64, 61);
  gemm_test::Operands d(p);
  auto gemm = GroupedGemm::Create(Options(p, GradType::kFloat32));
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  ASSERT_TRUE((*gemm)->Forward(d.x.bf16(), d.w.bf16(), d.offsets.i32(), d.y.bf16(), nullptr).ok());
  ASSERT_TRUE((*gemm)->BackwardWeight(d.x.bf16(), d.dy.bf16(), d.offsets.i32(), d.dw32.f32(),
                                      nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The rows past offsets[E] keep their poison; every gradient is exactly zero.
  gemm_test::ExpectRowsMatch(d.y.ToHostBf16(), gemm_test::ReferenceForward(p), p, p.n, kTolerance);
  for (float v : d.dw32.ToHostF32()) ASSERT_EQ(v, 0.0f);
}

// The device-side choices (the bf16 cluster pair, the MXFP8 weight gradient's tile shape) equal
// the host rules of kernel_choice.h on random group splits: zeros, tiny and long groups, offsets
// past max_rows clamped.
TEST_F(GroupedGemmTest, DeviceChoicesMatchTheHostRules) {
  using namespace grouped_gemm_internal;
  std::random_device rd;
  const uint64_t seed = rd();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  gemm_test::DeviceBuffer offsets(4 * 1025, 4), choice(4, 4);
  int taken[2][2] = {{0, 0}, {0, 0}};
  for (int trial = 0; trial < 300; ++trial) {
    const int groups = 1 + static_cast<int>(rng() % 1024);
    const int kind = static_cast<int>(rng() % 4);
    std::vector<int32_t> o(1, 0);
    for (int e = 0; e < groups; ++e) {
      int64_t size = 0;
      if (kind == 0) size = 256 * (1 + static_cast<int64_t>(rng() % 4));  // even tile counts
      if (kind == 1) size = static_cast<int64_t>(rng() % 3) == 0 ? 0 : rng() % 200;
      if (kind == 2) size = 32 * static_cast<int64_t>(rng() % 40);  // padded: 0-1248 rows
      if (kind == 3) size = static_cast<int64_t>(rng() % 2000);
      o.push_back(o.back() + static_cast<int32_t>(size));
    }
    const int64_t max_rows = rng() % 8 == 0 ? o.back() / 2 : o.back();  // some calls clamp
    offsets.Upload(o.data(), o.size() * 4);
    int64_t tiles = 0, padding = 0, rows = 0, long_rows = 0;
    for (int e = 0; e < groups; ++e) {
      const int64_t begin = std::min<int64_t>(o[e], max_rows), end = std::min<int64_t>(o[e + 1], max_rows);
      tiles += GroupTilesM(end - begin);
      padding += ClusterPaddingTiles(end - begin);
      rows += end - begin;
      long_rows += end - begin >= kWideWgradGroupRows ? end - begin : 0;
    }
    int32_t got = -1;
    ASSERT_TRUE(LaunchClusterChoice(offsets.i32(), groups, max_rows, choice.i32(), nullptr).ok());
    ASSERT_EQ(cudaMemcpy(&got, choice.i32(), 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(got, PreferClusterAlongM(tiles, padding) ? 1 : 0) << "cluster, trial " << trial;
    ++taken[0][got];
    ASSERT_TRUE(
        LaunchWeightGradientChoice(offsets.i32(), groups, max_rows, choice.i32(), nullptr).ok());
    ASSERT_EQ(cudaMemcpy(&got, choice.i32(), 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(got, PreferWideWeightGradient(long_rows, rows) ? 1 : 0) << "wgrad, trial " << trial;
    ++taken[1][got];
  }
  // Both answers of both rules occurred.
  for (const auto& t : taken) {
    EXPECT_GT(t[0], 0);
    EXPECT_GT(t[1], 0);
  }
}

// The shape-class defaults of grouped_gemm.cc on the benchmark's expert shapes. The fp32 weight
// gradient above 512 rows a group follows the device's memory bandwidth (H200 class or not).
TEST_F(GroupedGemmTest, DefaultKernelsFollowTheShapeRules) {
  int khz = 0, bits = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, 0), cudaSuccess);
  const bool h200_class = grouped_gemm_internal::IsHighMemoryBandwidth(khz, bits);
  std::printf("peak memory bandwidth %.2f TB/s: %s rules\n",
              grouped_gemm_internal::PeakMemoryBytesPerSecond(khz, bits) / 1e12,
              h200_class ? "H200-class" : "H100-class");
  struct Case {
    int k, n;
    int64_t rows;
    GradType grad;
    const char *fwd, *dgrad, *wgrad;
  };
  const char* pair = "coop_128x256x64_c2x1_or_c1x2";
  const char* tma = "tma_128x256x64";
  const char* pp = "tma_pingpong_128x128x64";
  const Case cases[] = {
      // dsv3 w13: long reductions (k = 7168, n = 4096): the cooperative tile; the weight
      // gradient: the fixed-map kernel to bf16, CUTLASS's cooperative tile to fp32 (short groups).
      {7168, 4096, 256, GradType::kBFloat16, tma, tma, tma},
      {7168, 4096, 256, GradType::kFloat32, tma, tma, "coop_128x256x64_c2x1"},
      // dsv3 w2: the forward reduces over 2048 (ping-pong), the data gradient over 7168.
      {2048, 7168, 256, GradType::kFloat32, pp, tma, "coop_128x256x64_c2x1"},
      // qwen3 w13 / w2: short reductions: ping-pong; to fp32, 1024-row groups: CUTLASS pingpong
      // (H200 class) or the fixed-map kernel.
      {2048, 1536, 1024, GradType::kBFloat16, pp, pp, tma},
      {768, 2048, 1024, GradType::kFloat32, pp, pp, h200_class ? "pingpong_128x128x64_c2x1" : tma},
      // mixtral w13: 2048-row groups to fp32: the pingpong kernel with its tiles along N, or
      // (H100 class, k < n) the fixed-map kernel.
      {4096, 28672, 2048, GradType::kBFloat16, tma, tma, tma},
      {4096, 28672, 2048, GradType::kFloat32, tma, tma,
       h200_class ? "pingpong_128x128x64_c2x1@N1" : tma},
      // dsv3 w2 at EP 8: a 2048-long forward reduction over 2048-row groups: the 128x256 tile.
      {2048, 7168, 2048, GradType::kFloat32, tma, tma,
       h200_class ? "pingpong_128x128x64_c2x1@N1" : tma},
      // dsv3 w13 at EP 8 (2048 rows, k > n): H100 class, CUTLASS's cooperative tile along N.
      {7168, 4096, 2048, GradType::kFloat32, tma, tma,
       h200_class ? "pingpong_128x128x64_c2x1@N1" : "coop_128x256x64_c2x1@N1"},
  };
  for (const Case& c : cases) {
    GroupedGemmOptions o;
    o.num_groups = 8;
    o.k = c.k;
    o.n = c.n;
    o.max_rows = c.rows * 8;
    o.expected_rows_per_group = c.rows;
    o.weight_grad_type = c.grad;
    auto gemm = GroupedGemm::Create(o);
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    SCOPED_TRACE(testing::Message() << "k=" << c.k << " n=" << c.n << " rows=" << c.rows);
    EXPECT_EQ((*gemm)->KernelName(GroupedGemmOp::kForward), c.fwd);
    EXPECT_EQ((*gemm)->KernelName(GroupedGemmOp::kBackwardData), c.dgrad);
    EXPECT_EQ((*gemm)->KernelName(GroupedGemmOp::kBackwardWeight), c.wgrad);
  }
  // The pair and the tma kernels take no visiting-order suffix.
  for (const char* name : {pair, tma}) {
    GroupedGemmOptions o;
    o.num_groups = 2;
    o.k = o.n = 64;
    o.max_rows = 64;
    o.forward_kernel = std::string(name) + "@N1";
    EXPECT_FALSE(GroupedGemm::Create(o).ok()) << name;
  }
}

TEST(GroupedGemmOptionsTest, RejectsBadShapesWithTheFieldName) {
  GroupedGemmOptions o;
  o.num_groups = 4;
  o.k = 100;  // not a multiple of 8
  o.n = 64;
  o.max_rows = 16;
  auto gemm = GroupedGemm::Create(o);
  ASSERT_FALSE(gemm.ok());
  EXPECT_EQ(gemm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(gemm.status().message().find("k must be"), std::string::npos);
  o.k = 64;
  o.n = 0;
  gemm = GroupedGemm::Create(o);
  ASSERT_FALSE(gemm.ok());
  EXPECT_NE(gemm.status().message().find("n must be"), std::string::npos);
}

TEST(GroupedGemmOptionsTest, ListsCompiledKernelsForEveryProduct) {
  for (GroupedGemmOp op :
       {GroupedGemmOp::kForward, GroupedGemmOp::kBackwardData, GroupedGemmOp::kBackwardWeight}) {
    EXPECT_FALSE(GroupedGemm::KernelNames(op, GradType::kFloat32).empty()) << GroupedGemmOpName(op);
  }
  EXPECT_FALSE(
      GroupedGemm::KernelNames(GroupedGemmOp::kBackwardWeight, GradType::kBFloat16).empty());
}

}  // namespace
}  // namespace dropless::kernels
