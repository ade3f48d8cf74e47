// The grouped weight gradient fused with AdamW (Hopper, bf16 operands, fp32 accumulation).
//
// Per group e, G[e] = X_e^T . dY_e (grouped_gemm.h's BackwardWeight: X [max_rows][k], dY
// [max_rows][n], groups by device offsets; G[e] = 0 for an empty group) is computed in registers
// and never stored: every element of W[e] takes its AdamW step at once (adamw_update.h's
// AdamWElement, the CPU engine's bits for a given gradient) on the fp32 master `param`, the moments
// (fp32, or bf16 stochastically rounded as adamw.h says) and the bf16 working copy `copy` of the
// new value, all [num_groups][k][n]. An optimizer that runs inside the GEMM's epilogue moves its
// bytes while the tensor cores work on other tiles, and the fp32 gradient's write and read
// disappear.
//
// The AdamW step's scalars are read from the device (`step`, computed by the caller's step
// preparation), so a call is one launch, never synchronizes and can be captured in a CUDA graph.
// A call reads and writes every element of the four tensors: nothing else may read `copy` or
// touch the AdamW state while it runs. `Gradient` is the same kernel storing G[e] in fp32
// instead (tests and benchmarks compare the two).
#ifndef DROPLESS_KERNELS_GROUPED_WGRAD_ADAMW_H_
#define DROPLESS_KERNELS_GROUPED_WGRAD_ADAMW_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dropless/kernels/adamw.h"

namespace dropless::kernels {

struct WgradAdamWShape {
  int num_groups = 0;    // E
  int k = 0;             // rows of W[e]; multiple of 8
  int n = 0;             // columns of W[e]; multiple of 8
  int64_t max_rows = 0;  // rows the X / dY buffers hold (offsets are clamped to it)
  // The persistent kernel stays on at most this many multiprocessors (0: every one), as
  // GroupedGemmOptions::max_sms.
  int max_sms = 0;
};

// One expert weight's AdamW state: [num_groups][k][n] each, 16-byte aligned. The moments' `first`
// is the index of element 0 in their buffer (the bf16 rounding's key).
struct AdamWTensors {
  float* param = nullptr;
  AdamWMoments moments;
  __nv_bfloat16* copy = nullptr;
};

class GroupedWgradAdamW {
 public:
  // Needs a Hopper (sm_90) device current on the calling thread.
  static absl::StatusOr<std::unique_ptr<GroupedWgradAdamW>> Create(const WgradAdamWShape& shape);
  virtual ~GroupedWgradAdamW() = default;

  virtual absl::Status Update(const __nv_bfloat16* x, const __nv_bfloat16* dy,
                              const int32_t* offsets, const AdamWStep* step,
                              const AdamWTensors& state, cudaStream_t stream) = 0;
  virtual absl::Status Gradient(const __nv_bfloat16* x, const __nv_bfloat16* dy,
                                const int32_t* offsets, float* grad, cudaStream_t stream) = 0;
};

}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_GROUPED_WGRAD_ADAMW_H_
