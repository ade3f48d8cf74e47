// The fp8-block products on the Hopper-layer kernel (fp8_block_tma_kernel.cuh) as runners of
// fp8_block_runner.h: tensor maps encoded on the host at each call (host arithmetic on the
// pointers, no device work; a captured graph keeps the maps of its capture) and passed by value.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "dropless/kernels/fp8_block.h"
#include "kernels/cuda/grouped_gemm/e4m3_operand_map.h"
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_runner.h"
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_tma_kernel.cuh"

namespace dropless::kernels::fp8_block_gemm {
namespace {

namespace tma = fp8_block_tma;
using grouped_gemm_internal::EncodeE4m3Operand;

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

template <typename OutT, bool kGroupedK, bool kDoubleBuffer>
absl::Status Launch(const CUtensorMap& map_a, const CUtensorMap& map_b, const tma::Params& p,
                    int grid, cudaStream_t stream) {
  static const cudaError_t allowed = cudaFuncSetAttribute(
      tma::Fp8BlockGroupedGemmKernel<OutT, kGroupedK, kDoubleBuffer>,
      cudaFuncAttributeMaxDynamicSharedMemorySize, tma::kSmemBytes);
  if (absl::Status s = CudaStatus(allowed, "cudaFuncSetAttribute(max dynamic shared memory)");
      !s.ok()) {
    return s;
  }
  tma::Fp8BlockGroupedGemmKernel<OutT, kGroupedK, kDoubleBuffer>
      <<<grid, tma::kThreads, tma::kSmemBytes, stream>>>(map_a, map_b, p);
  return CudaStatus(cudaGetLastError(), "Fp8BlockGroupedGemmKernel launch");
}

// Forward (a = X [rows][k], b = W^T [E][n][k]) or data gradient (a = dY [rows][n], b = W
// [E][k][n]): C[rows][cols] = A[rows][red] . B[e][cols][red]^T per group, bf16 out; A's row-wise
// scales [rows][red / 128], B's block scales [E][cols / 128][red / 128].
template <bool kDoubleBuffer>
class MGroupedRunner final : public Runner {
 public:
  MGroupedRunner(const RunnerShape& shape, bool data_gradient)
      : shape_(shape),
        red_(data_gradient ? shape.n : shape.k),
        cols_(data_gradient ? shape.k : shape.n) {}

  absl::Status Run(const RunnerCall& call, cudaStream_t stream) override {
    CUtensorMap map_a, map_b;
    if (absl::Status s = EncodeE4m3Operand(&map_a, call.a, red_, shape_.max_rows, 0,
                                           tma::kBlockM, "a");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = EncodeE4m3Operand(&map_b, call.b, red_, cols_, shape_.num_groups,
                                           tma::kBlockN, "b");
        !s.ok()) {
      return s;
    }
    const int64_t red_blocks = red_ / kFp8Block;
    tma::Params p{};
    p.a_scales = call.a_scales;
    p.b_scales = call.b_scales;
    p.a_row_stride = red_blocks;
    p.a_kb_stride = 1;
    p.b_row_stride = red_blocks;
    p.b_kb_stride = 1;
    p.b_batch_stride = (cols_ / kFp8Block) * red_blocks;
    p.b_cols_per_scale = kFp8Block;
    p.a_rows = shape_.max_rows;
    p.offsets = call.offsets;
    p.num_groups = shape_.num_groups;
    p.m = 0;
    p.n = cols_;
    p.k = red_;
    p.offset_limit = shape_.max_rows;
    p.out = call.d;
    p.ldc = cols_;
    p.out_group_stride = 0;
    return Launch<__nv_bfloat16, false, kDoubleBuffer>(map_a, map_b, p, shape_.sm_count, stream);
  }

 private:
  const RunnerShape shape_;
  const int red_, cols_;
};

// dW[e][k][n] = X_e^T . dY_e over the group's 128-padded token range: a = X column-wise [k][P],
// b = dY column-wise [n][P], their scales [P / 128][k] and [P / 128][n]; fp32 out.
template <bool kDoubleBuffer>
class WeightGradientRunner final : public Runner {
 public:
  explicit WeightGradientRunner(const RunnerShape& shape) : shape_(shape) {}

  absl::Status Run(const RunnerCall& call, cudaStream_t stream) override {
    CUtensorMap map_a, map_b;
    if (absl::Status s = EncodeE4m3Operand(&map_a, call.a, shape_.padded_rows, shape_.k, 0,
                                           tma::kBlockM, "x_colwise");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = EncodeE4m3Operand(&map_b, call.b, shape_.padded_rows, shape_.n, 1,
                                           tma::kBlockN, "dy_colwise");
        !s.ok()) {
      return s;
    }
    tma::Params p{};
    p.a_scales = call.a_scales;
    p.b_scales = call.b_scales;
    p.a_row_stride = 1;
    p.a_kb_stride = shape_.k;
    p.b_row_stride = 1;
    p.b_kb_stride = shape_.n;
    p.b_batch_stride = 0;
    p.b_cols_per_scale = 1;
    p.a_rows = shape_.k;
    p.offsets = call.offsets;
    p.num_groups = shape_.num_groups;
    p.m = shape_.k;
    p.n = shape_.n;
    p.k = 0;
    p.offset_limit = shape_.padded_rows;
    p.out = call.d;
    p.ldc = shape_.n;
    p.out_group_stride = static_cast<int64_t>(shape_.k) * shape_.n;
    return Launch<float, true, kDoubleBuffer>(map_a, map_b, p, shape_.sm_count, stream);
  }

 private:
  const RunnerShape shape_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Runner>> MakeForwardTma128x128x128(const RunnerShape& shape) {
  return std::unique_ptr<Runner>(new MGroupedRunner<false>(shape, /*data_gradient=*/false));
}
absl::StatusOr<std::unique_ptr<Runner>> MakeBackwardDataTma128x128x128(const RunnerShape& shape) {
  return std::unique_ptr<Runner>(new MGroupedRunner<false>(shape, /*data_gradient=*/true));
}
absl::StatusOr<std::unique_ptr<Runner>> MakeBackwardWeightTma128x128x128(const RunnerShape& shape) {
  return std::unique_ptr<Runner>(new WeightGradientRunner<false>(shape));
}
absl::StatusOr<std::unique_ptr<Runner>> MakeForwardTma128x128x128Db(const RunnerShape& shape) {
  return std::unique_ptr<Runner>(new MGroupedRunner<true>(shape, /*data_gradient=*/false));
}
absl::StatusOr<std::unique_ptr<Runner>> MakeBackwardDataTma128x128x128Db(const RunnerShape& shape) {
  return std::unique_ptr<Runner>(new MGroupedRunner<true>(shape, /*data_gradient=*/true));
}
absl::StatusOr<std::unique_ptr<Runner>> MakeBackwardWeightTma128x128x128Db(
    const RunnerShape& shape) {
  return std::unique_ptr<Runner>(new WeightGradientRunner<true>(shape));
}

}  // namespace dropless::kernels::fp8_block_gemm
