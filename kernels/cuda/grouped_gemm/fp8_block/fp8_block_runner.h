// One compiled CUTLASS fp8-blockwise grouped-GEMM kernel bound to a product of
// fp8_block_grouped_gemm.h: owns the per-group argument arrays (problem shapes, operand and scale
// pointers, strides, scale layouts) and the kernel workspace, and fills the arrays on the device
// from the group offsets before each launch. Internal to dropless_grouped_gemm; no CUTLASS here
// (the instances in this folder compile the kernels, fp8_block_grouped_gemm.cc only calls them).
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_FP8_BLOCK_RUNNER_H_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_FP8_BLOCK_RUNNER_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dropless/kernels/fp8_block.h"

namespace dropless::kernels::fp8_block_gemm {

enum class Product { kForward, kBackwardData, kBackwardWeight };

struct RunnerShape {
  int num_groups = 0;
  int k = 0;  // forward reduction dimension
  int n = 0;  // forward output width
  int64_t max_rows = 0;
  int64_t padded_rows = 0;  // a multiple of 128
  int sm_count = 0;
};

// Operands of one call in the product's terms (fp8_block_grouped_gemm.h): kForward a = X,
// b = W^T, d = Y; kBackwardData a = dY, b = W, d = dX; kBackwardWeight a = X column-wise,
// b = dY column-wise, d = dW. offsets are padded offsets for kBackwardWeight.
struct RunnerCall {
  const uint8_t* a = nullptr;
  const float* a_scales = nullptr;
  const uint8_t* b = nullptr;
  const float* b_scales = nullptr;
  void* d = nullptr;
  const int32_t* offsets = nullptr;
};

class Runner {
 public:
  virtual ~Runner() = default;
  virtual absl::Status Run(const RunnerCall& call, cudaStream_t stream) = 0;
};

using RunnerFactory = absl::StatusOr<std::unique_ptr<Runner>> (*)(const RunnerShape&);

// The compiled kernels, listed in the tables below, one translation unit each (the weight
// gradient's default is chosen by X's scale layout and the rows a group is expected to get,
// Fp8BlockGroupedGemm::WeightGradientKernelFor; the m-grouped products' by output width and
// reduction length, Fp8BlockGroupedGemm::MGroupedKernelFor). A variant is a new
// instance file plus a table row; it is then chosen by name (Fp8BlockGroupedGemmOptions), tested
// by every GPU test of its products, and timed by bench/peers/interleaved_gemm.py
// --fp8-block-m-kernels / --fp8-block-wgrad-kernels. A pingpong 64 x 128 x 128 m-grouped
// variant, an overlapped-promotion weight gradient with per-column X, and store-buffer variants of
// the 192-wide kernels were measured and removed (docs/fp8_block_gemm.md).
//
// The m-grouped kernels (A row-wise 1 x 128 scales, B 128 x 128 block scales, bf16 out), each
// compiled once for both m-grouped products: m_grouped_coop_128x128x128_c1x2.cu,
// m_grouped_coop_128x192x128_c1x2.cu, m_grouped_coop_128x192x128_c1x1.cu,
// m_grouped_wave_256x128x128_c1x2.cu.
absl::StatusOr<std::unique_ptr<Runner>> MakeForwardCoop128x128x128C1x2(const RunnerShape& shape);
absl::StatusOr<std::unique_ptr<Runner>> MakeBackwardDataCoop128x128x128C1x2(
    const RunnerShape& shape);
absl::StatusOr<std::unique_ptr<Runner>> MakeForwardCoop128x192x128C1x2(const RunnerShape& shape);
absl::StatusOr<std::unique_ptr<Runner>> MakeBackwardDataCoop128x192x128C1x2(
    const RunnerShape& shape);
absl::StatusOr<std::unique_ptr<Runner>> MakeForwardCoop128x192x128C1x1(const RunnerShape& shape);
absl::StatusOr<std::unique_ptr<Runner>> MakeBackwardDataCoop128x192x128C1x1(
    const RunnerShape& shape);
absl::StatusOr<std::unique_ptr<Runner>> MakeForwardWave256x128x128C1x2(const RunnerShape& shape);
absl::StatusOr<std::unique_ptr<Runner>> MakeBackwardDataWave256x128x128C1x2(
    const RunnerShape& shape);

// The weight-gradient kernels (fp32 out): column-wise 1 x 128 scales on both operands,
// wgrad_coop_128x128x128_c1x2_d4.cu and wgrad_pingpong_64x128x128_c1x2.cu; X's per 128 x 128
// block and dY's per column, wgrad_x_blocks_coop_128x128x128_c1x2_d4.cu and
// wgrad_x_blocks_pingpong_64x128x128_c1x2.cu.
absl::StatusOr<std::unique_ptr<Runner>> MakeBackwardWeightCoop128x128x128C1x2D4(
    const RunnerShape& shape);
absl::StatusOr<std::unique_ptr<Runner>> MakeBackwardWeightXBlocksCoop128x128x128C1x2D4(
    const RunnerShape& shape);
absl::StatusOr<std::unique_ptr<Runner>> MakeBackwardWeightPingpong64x128x128C1x2(
    const RunnerShape& shape);
absl::StatusOr<std::unique_ptr<Runner>> MakeBackwardWeightXBlocksPingpong64x128x128C1x2(
    const RunnerShape& shape);
// The cooperative one with X per block and our overlapped-promotion consumer mainloop (the
// default above 1024 rows a group): wgrad_x_blocks_coop_overlap_128x128x128_c1x2_d4.cu. (The
// pingpong form of it was measured and removed: +2% / -3% on qwen3, docs/fp8_block_gemm.md.)
absl::StatusOr<std::unique_ptr<Runner>> MakeBackwardWeightXBlocksCoopOverlap128x128x128C1x2D4(
    const RunnerShape& shape);

struct NamedWeightGradientRunner {
  const char* name;
  RunnerFactory make;
  Fp8ColwiseScaling x_scaling;  // the layout of X's scales the kernel reads
};
struct NamedMGroupedRunners {
  const char* name;
  RunnerFactory forward;
  RunnerFactory backward_data;
};
inline constexpr NamedMGroupedRunners kMGroupedKernels[] = {
    {"fp8_block_coop_128x128x128_c1x2", MakeForwardCoop128x128x128C1x2,
     MakeBackwardDataCoop128x128x128C1x2},
    {"fp8_block_coop_128x192x128_c1x2", MakeForwardCoop128x192x128C1x2,
     MakeBackwardDataCoop128x192x128C1x2},
    {"fp8_block_coop_128x192x128_c1x1", MakeForwardCoop128x192x128C1x1,
     MakeBackwardDataCoop128x192x128C1x1},
    {"fp8_block_wave_256x128x128_c1x2", MakeForwardWave256x128x128C1x2,
     MakeBackwardDataWave256x128x128C1x2},
};
inline constexpr NamedWeightGradientRunner kWeightGradientKernels[] = {
    {"fp8_block_wgrad_coop_128x128x128_c1x2_d4", MakeBackwardWeightCoop128x128x128C1x2D4,
     Fp8ColwiseScaling::kPerColumn},
    {"fp8_block_wgrad_x_blocks_coop_128x128x128_c1x2_d4",
     MakeBackwardWeightXBlocksCoop128x128x128C1x2D4, Fp8ColwiseScaling::kPerBlock},
    {"fp8_block_wgrad_pingpong_64x128x128_c1x2", MakeBackwardWeightPingpong64x128x128C1x2,
     Fp8ColwiseScaling::kPerColumn},
    {"fp8_block_wgrad_x_blocks_pingpong_64x128x128_c1x2",
     MakeBackwardWeightXBlocksPingpong64x128x128C1x2, Fp8ColwiseScaling::kPerBlock},
    {"fp8_block_wgrad_x_blocks_coop_overlap_128x128x128_c1x2_d4",
     MakeBackwardWeightXBlocksCoopOverlap128x128x128C1x2D4, Fp8ColwiseScaling::kPerBlock},
};

}  // namespace dropless::kernels::fp8_block_gemm

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_FP8_BLOCK_RUNNER_H_
