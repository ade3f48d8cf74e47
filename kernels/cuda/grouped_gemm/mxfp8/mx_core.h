// The launcher of the bf16-core MXFP8 m-grouped GEMM (mx_core_kernel.cuh), for MxGroupedGemm's
// forward and data gradient on weight images (mx_grouped_gemm.h). Internal to
// dropless_grouped_gemm.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_MXFP8_MX_CORE_H_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_MXFP8_MX_CORE_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dropless/kernels/mx_grouped_gemm.h"

namespace dropless::kernels::mxgemm {

struct CoreCall {
  MxOperand a;             // E4M3 [max_rows][k_red] + scales [max_rows][k_red / 32]
  const Bf16* image;       // [num_groups][n_out][k_red], MxWeightImage's layout
  const int32_t* offsets;  // [num_groups + 1], device
  Bf16* c;                 // [max_rows][n_out]
  int num_groups;
  int k_red;               // a multiple of 64
  int n_out;               // a multiple of 32
  int64_t max_rows;
};

// Once per object before its first launch: the shared-memory opt-in of the variant (cluster 1, or
// 2: a 2 x 1 cluster sharing the image tile) and its grid for `sms` multiprocessors.
absl::StatusOr<int> PrepareCore(int cluster, int sms);

// Checks the call (errors name the field: a_field, "image", c_field) and launches the variant
// with `grid` persistent CTAs (PrepareCore's); no host synchronization.
absl::Status LaunchCore(const CoreCall& call, int cluster, int grid, const char* a_field,
                        const char* c_field, cudaStream_t stream);

}  // namespace dropless::kernels::mxgemm

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_MXFP8_MX_CORE_H_
