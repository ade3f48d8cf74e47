// Grouped GEMM over expert-contiguous token groups (Hopper, bf16 in, fp32 accumulate).
//
// One launch multiplies every expert's token group by that expert's weight matrix. Group sizes are
// read from device memory (int32 offsets of the dispatch plan), so a call never synchronizes with
// the host and can be captured in a CUDA graph; an empty group launches no tile.
//
// Layouts, all row-major, chosen so that no product needs a transposed copy:
//   X  [rows, k]    tokens in expert-contiguous order: group e owns rows [offsets[e], offsets[e+1])
//   W  [E, k, n]    W[e] is k x n (the weight as the forward multiplies it)
//   Y  [rows, n]    forward output; dY has the same layout, dX the layout of X
//   dW [E, k, n]    weight gradient, fp32 or bf16
// Products (per group e, with X_e the group's rows):
//   Forward        Y_e   = X_e  . W[e]        (m_e x k)(k x n)
//   BackwardData   dX_e  = dY_e . W[e]^T      (m_e x n)(n x k)
//   BackwardWeight dW[e] = X_e^T . dY_e       (k x m_e)(m_e x n); dW[e] = 0 for an empty group
// The transposes are read through the operand layout (the tensor cores take either major order for
// 16-bit types), never materialized.
//
// offsets: device int32 [num_groups + 1], non-decreasing; offsets[0] is 0, or for Forward and
// BackwardData a run of a larger grouping's groups (offsets + first with W at its expert first):
// rows before offsets[0] are then neither read nor written. Values are clamped to
// [0, max_rows] on the device (a corrupt plan cannot make the kernel read past the buffers). Rows
// at or past offsets[num_groups] of Y / dX are left untouched.
//
// A GroupedGemm picks one kernel (tile shape, schedule) per product when it is created, from the
// shape class (expected rows per group, k, n) and, for the fp32 weight gradient, the device's
// peak memory bandwidth (docs/grouped_gemm.md, "Defaults"); the pair of cluster shapes, chosen
// on the device per call from the offsets, runs where a caller names it. Calls do no host work
// beyond launching: one or two small kernels and the GEMM (the pair: three small kernels and two
// GEMMs, the one not chosen finding no tile). Calls of
// the same product on one object must be ordered on one stream (each product owns the device
// arrays its launch reads); different products may run on different streams concurrently.
#ifndef DROPLESS_KERNELS_GROUPED_GEMM_H_
#define DROPLESS_KERNELS_GROUPED_GEMM_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dropless::kernels {

enum class GroupedGemmOp { kForward, kBackwardData, kBackwardWeight };

enum class GradType { kFloat32, kBFloat16 };

const char* GroupedGemmOpName(GroupedGemmOp op);

struct GroupedGemmOptions {
  int num_groups = 0;     // E, experts on this rank
  int k = 0;              // rows of each W[e] (forward inner dimension); multiple of 8
  int n = 0;              // columns of each W[e] (forward output width); multiple of 8
  int64_t max_rows = 0;   // rows the X / Y / dX / dY buffers hold
  // Tokens an expert is expected to get (tokens * top_k / experts); picks the tile shape class.
  int64_t expected_rows_per_group = 0;
  GradType weight_grad_type = GradType::kFloat32;
  // Force a kernel by name (one of KernelNames(op, ...)), optionally with a tile visiting order
  // "@M<s>" / "@N<s>" (raster along M or N, swizzle s in 1, 2, 4, 8; default "@M1");
  // empty: chosen by shape class.
  std::string forward_kernel;
  std::string backward_data_kernel;
  std::string backward_weight_kernel;
  // The persistent kernels' CTAs stay on at most this many multiprocessors (0: every one), so
  // that kernels on other streams (an expert exchange beside the GEMMs) find some free.
  int max_sms = 0;
};

class GroupedGemm {
 public:
  // Needs a Hopper (sm_90) device current on the calling thread; allocates the per-product
  // argument arrays and kernel workspaces there.
  static absl::StatusOr<std::unique_ptr<GroupedGemm>> Create(const GroupedGemmOptions& options);

  // Names of the compiled kernels for a product (for benchmarks and tests that sweep them).
  static std::vector<std::string> KernelNames(GroupedGemmOp op, GradType weight_grad_type);

  virtual ~GroupedGemm() = default;

  virtual absl::Status Forward(const __nv_bfloat16* x, const __nv_bfloat16* w,
                               const int32_t* offsets, __nv_bfloat16* y, cudaStream_t stream) = 0;
  virtual absl::Status BackwardData(const __nv_bfloat16* dy, const __nv_bfloat16* w,
                                    const int32_t* offsets, __nv_bfloat16* dx,
                                    cudaStream_t stream) = 0;
  // The overload must match options.weight_grad_type.
  virtual absl::Status BackwardWeight(const __nv_bfloat16* x, const __nv_bfloat16* dy,
                                      const int32_t* offsets, float* dw, cudaStream_t stream) = 0;
  virtual absl::Status BackwardWeight(const __nv_bfloat16* x, const __nv_bfloat16* dy,
                                      const int32_t* offsets, __nv_bfloat16* dw,
                                      cudaStream_t stream) = 0;

  // The kernel chosen for a product at creation.
  virtual std::string KernelName(GroupedGemmOp op) const = 0;
};

// Whether a CUDA device is H200-class by its peak memory bandwidth (its memory clock and bus
// width; docs/grouped_gemm.md, "Defaults"): the rule that picks the fp32 weight gradient's tiles,
// and the engine's choice of the weight gradient fused with AdamW. An error when the device cannot
// be queried.
absl::StatusOr<bool> DeviceHasHighMemoryBandwidth(int device);

// The correctness reference and fallback: one cuBLASLt matmul per non-empty group, with the group
// offsets on the host (the caller has synchronized to get them). Same layouts and products as
// GroupedGemm.
class CublasLtGroupedGemm {
 public:
  static absl::StatusOr<std::unique_ptr<CublasLtGroupedGemm>> Create(int num_groups, int k, int n);
  virtual ~CublasLtGroupedGemm() = default;

  // host_offsets: num_groups + 1 entries, as for GroupedGemm.
  virtual absl::Status Forward(const __nv_bfloat16* x, const __nv_bfloat16* w,
                               const std::vector<int32_t>& host_offsets, __nv_bfloat16* y,
                               cudaStream_t stream) = 0;
  virtual absl::Status BackwardData(const __nv_bfloat16* dy, const __nv_bfloat16* w,
                                    const std::vector<int32_t>& host_offsets, __nv_bfloat16* dx,
                                    cudaStream_t stream) = 0;
  virtual absl::Status BackwardWeight(const __nv_bfloat16* x, const __nv_bfloat16* dy,
                                      const std::vector<int32_t>& host_offsets, float* dw,
                                      cudaStream_t stream) = 0;
  virtual absl::Status BackwardWeight(const __nv_bfloat16* x, const __nv_bfloat16* dy,
                                      const std::vector<int32_t>& host_offsets,
                                      __nv_bfloat16* dw, cudaStream_t stream) = 0;
};

}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_GROUPED_GEMM_H_
