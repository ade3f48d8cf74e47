// One compiled CUTLASS grouped-GEMM kernel bound to a product: owns the per-group argument arrays
// (problem shapes, operand pointers, strides) and the kernel workspace, and fills the arrays on the
// device from the group offsets before each launch. Internal to dropless_grouped_gemm.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_GROUPED_GEMM_RUNNER_H_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_GROUPED_GEMM_RUNNER_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dropless/kernels/grouped_gemm.h"

namespace dropless::kernels::grouped_gemm_internal {

struct RunnerShape {
  int num_groups = 0;
  int k = 0;  // forward inner dimension (rows of W[e])
  int n = 0;  // forward output width (columns of W[e])
  int64_t max_rows = 0;
  int sm_count = 0;
  // Tile visiting order inside a group: along M (CUTLASS's grouped default) or along N, in
  // swizzled runs of `swizzle` tiles (1, 2, 4 or 8).
  bool raster_along_n = false;
  int swizzle = 1;
};

// Operands of one call, in the product's own terms (see grouped_gemm.h): for kForward a = X,
// b = W, d = Y; for kBackwardData a = dY, b = W, d = dX; for kBackwardWeight a = X, b = dY, d = dW.
struct RunnerCall {
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  const int32_t* offsets = nullptr;
  // When set (device int32), the GEMM computes nothing unless *gate == gate_value: its fill kernel
  // gives every group M = 0 (MakePairedRunner's choice between two kernels). Forward and data
  // gradient only: a weight-gradient runner's ZeroEmptyGroups launch does not look at the gate.
  const int32_t* gate = nullptr;
  int32_t gate_value = 0;
};

class GroupedGemmRunner {
 public:
  virtual ~GroupedGemmRunner() = default;
  virtual absl::Status Run(const RunnerCall& call, cudaStream_t stream) = 0;
};

enum class OutType { kBFloat16, kFloat32 };

using RunnerFactory = absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> (*)(const RunnerShape&);

struct KernelEntry {
  const char* name;
  GroupedGemmOp op;
  OutType out;
  RunnerFactory make;
};

// Every compiled kernel (defined in grouped_gemm.cc).
const KernelEntry* KernelTable(int* count);

// The forward / data-gradient pair of the 2x1- and 1x2-cluster kernels, chosen on the device per
// call from the group sizes (paired_runner.cu, kernel_choice.h). Not for the weight gradient
// (RunnerCall::gate).
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakePairedRunner(const RunnerShape& shape,
                                                                    RunnerFactory cluster_2x1,
                                                                    RunnerFactory cluster_1x2);

// The pair's choice alone (what MakePairedRunner's runner launches first): writes 1 (2x1 cluster)
// or 0 (1x2) to *choice from the device offsets. Exposed for the GPU test of the device rule.
absl::Status LaunchClusterChoice(const int32_t* offsets, int num_groups, int64_t max_rows,
                                 int32_t* choice, cudaStream_t stream);
// The MXFP8 weight gradient's choice (mxfp8/mx_grouped_gemm.cu): writes 1 (256 x 128 tiles) or 0
// (128 x 128) to *choice from the device padded offsets. Exposed for the same test.
absl::Status LaunchWeightGradientChoice(const int32_t* padded_offsets, int num_groups,
                                        int64_t padded_rows, int32_t* choice,
                                        cudaStream_t stream);

// Shared by the runners: the launches that surround the GEMM.
// Zeroes dW[e] of every empty group e (a group with no rows has no tile to write it).
absl::Status ZeroEmptyGroups(const int32_t* offsets, int num_groups, int64_t max_rows,
                             int64_t elements_per_group, int element_bytes, void* d,
                             cudaStream_t stream);

}  // namespace dropless::kernels::grouped_gemm_internal

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_GROUPED_GEMM_RUNNER_H_
