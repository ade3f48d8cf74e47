// MXFP8 grouped GEMM over expert-contiguous token groups (Hopper sm_90a, E4M3 x E4M3, fp32
// accumulation), with the operands in the layouts the MXFP8 quantize kernels produce (mxfp8.h).
//
// Semantics. Every operand element is an E4M3 byte with one E8M0 scale byte per 32 consecutive
// elements along the reduction dimension K (scale byte b means 2^(b - 127), 0xFF is NaN). Per
// output element and per 32-element K block kb:
//   C[m][n] = sum_kb (sa[m][kb] * sb[n][kb]) * (sum_{k in kb} A[m][k] * B[n][k])
// The inner sum runs on the fp8 tensor cores (one k32 wgmma); its fp32 result is multiplied by the
// fp32 product of the two scales and added to an fp32 accumulator after every K block, so the
// result equals the fp64 product of the dequantized operands up to fp32 rounding (NaN scales and
// NaN elements give NaN outputs in their rows / columns).
//
// Products (group e owns token rows [offsets[e], offsets[e+1])):
//   Forward        Y_e   = X_e . W[e]         A = X   row-wise  [rows][k]  (+ scales [rows][k/32])
//                                             B = W^T quantized along k: [E][n][k] (+ [E][n][k/32])
//                                             C = Y [rows][n] bf16
//   BackwardData   dX_e  = dY_e . W[e]^T      A = dY  row-wise  [rows][n]  (+ scales [rows][n/32])
//                                             B = W quantized along n:   [E][k][n] (+ [E][k][n/32])
//                                             C = dX [rows][k] bf16
//   BackwardWeight dW[e] = X_e^T . dY_e       A = X   column-wise, block-major [P/32][k][32]
//                                                     (+ scales [P/32][k], 16-byte aligned)
//                                             B = dY  column-wise, block-major [P/32][n][32]
//                                                     (+ scales [P/32][n], 16-byte aligned)
//                                             C = dW [E][k][n] fp32 or bf16; zeros for an empty
//                                             group
// The forward and data-gradient products are m-grouped (group e's rows of A against B[e]); the
// weight gradient is k-grouped: the reduction runs over the group's padded token range
// [padded_offsets[e], padded_offsets[e+1]) of the column-wise buffers (P = padded_rows, padding
// elements are zero), exactly as QuantizeMxfp8 writes them.
//
// Offsets live on the device (int32, num_groups + 1 entries) and are never read by the host:
// calls only launch (no host synchronization) and can be captured in a CUDA graph. Offsets are
// clamped to [0, max_rows] (row offsets) or [0, padded_rows] (padded offsets) on the device. Rows
// of Y / dX at or past offsets[num_groups] are never written. Forward and BackwardData also take
// a run of a larger grouping's groups (row offsets[0] > 0; rows before it untouched).
//
// Weight-gradient calls on one object must be ordered on one stream: the default picks its tile
// shape on the device per call through a choice word the object owns (the other products keep no
// device state between calls).
//
// Data pointers must be 16-byte aligned (the tensor-memory-access engine reads them), output
// pointers 8-byte aligned; k and n are multiples of 32.
#ifndef DROPLESS_KERNELS_MX_GROUPED_GEMM_H_
#define DROPLESS_KERNELS_MX_GROUPED_GEMM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dropless/kernels/types.h"

namespace dropless::kernels {

// One MXFP8 operand as the kernel reads it: E4M3 data and its E8M0 scales (layouts per product
// above). Device pointers.
struct MxOperand {
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;
};

enum class MxGradType { kFloat32, kBFloat16 };

struct MxGroupedGemmOptions {
  int num_groups = 0;    // E, experts on this rank
  int k = 0;             // forward reduction dimension (hidden); multiple of 32
  int n = 0;             // forward output width; multiple of 32
  int64_t max_rows = 0;  // rows the X / Y / dX / dY buffers hold
  // P of the column-wise buffers the weight gradient reads (mxfp8.h's MxColwise::padded_rows);
  // 0 means ColwisePaddedRows(max_rows, num_groups).
  int64_t padded_rows = 0;
  // Tokens an expert is expected to get; reserved for picking a tile shape class.
  int64_t expected_rows_per_group = 0;
  // Force a compiled kernel by name (one of KernelNames(), for benchmarks and tests); empty: the
  // default.
  std::string kernel;
  // The persistent kernels' CTAs stay on at most this many multiprocessors (0: every one), so
  // that kernels on other streams (an expert exchange beside the GEMMs) find some free.
  int max_sms = 0;
};

class MxGroupedGemm {
 public:
  // Needs a Hopper (sm_90) device current on the calling thread. Checks the options (errors name
  // the field) and picks the kernel configuration once.
  static absl::StatusOr<std::unique_ptr<MxGroupedGemm>> Create(const MxGroupedGemmOptions& options);

  // Names of the compiled promotion kernels (they differ in how B's scales are staged in shared
  // memory); the bf16-core kernel of the image products is kCoreKernelName.
  static std::vector<std::string> KernelNames();
  static constexpr char kCoreKernelName[] = "mx_core_bf16_128x256x64_s4";
  // The same as a 2 x 1 cluster sharing the weight image's tile (options.kernel selects either for
  // the image products; the promotion products then run their default).
  static constexpr char kCoreClusterKernelName[] = "mx_core_bf16_128x256x64_s4_c2x1";

  virtual ~MxGroupedGemm() = default;

  // y [max_rows][n] bf16.
  virtual absl::Status Forward(const MxOperand& x, const MxOperand& w_t, const int32_t* offsets,
                               Bf16* y, Stream stream) = 0;
  // dx [max_rows][k] bf16; w is W quantized along n ([E][k][n] + scales [E][k][n/32]).
  virtual absl::Status BackwardData(const MxOperand& dy, const MxOperand& w, const int32_t* offsets,
                                    Bf16* dx, Stream stream) = 0;
  // The same two products on the bf16 tensor cores ("bf16 core", kernel kCoreKernelName): the
  // weights come as their exact bf16 image (MxWeightImage, mxfp8.h; written once per weight
  // update), w_t_image [E][n][k] the image of W^T quantized along k, w_image [E][k][n] that of W
  // quantized along n; the activations stay MXFP8 and are converted to exact bf16 values in
  // registers. Every product of two MXFP8 values is exact in bf16, so the result is the product
  // of the dequantized operands with fp32 accumulation, as above (the summation order differs).
  // No per-32 promotion: on Hopper its fp32 instructions, not the tensor cores, bound the
  // kernels above. The reduction length (Forward: k, BackwardData: n) must be a multiple of 64;
  // the output 16-byte aligned.
  virtual absl::Status Forward(const MxOperand& x, const Bf16* w_t_image, const int32_t* offsets,
                               Bf16* y, Stream stream) = 0;
  virtual absl::Status BackwardData(const MxOperand& dy, const Bf16* w_image,
                                    const int32_t* offsets, Bf16* dx, Stream stream) = 0;

  // x_colwise and dy_colwise as QuantizeMxfp8 writes them (block-major, mxfp8.h); padded_offsets
  // as it wrote them.
  virtual absl::Status BackwardWeight(const MxOperand& x_colwise, const MxOperand& dy_colwise,
                                      const int32_t* padded_offsets, float* dw, Stream stream) = 0;
  virtual absl::Status BackwardWeight(const MxOperand& x_colwise, const MxOperand& dy_colwise,
                                      const int32_t* padded_offsets, Bf16* dw, Stream stream) = 0;

  // The compiled configuration chosen at creation (tile, stages), for benchmarks and logs.
  virtual std::string KernelName() const = 0;
  // The bf16-core variant the image products run: kCoreKernelName unless options.kernel names
  // kCoreClusterKernelName. (The cluster variant measured 2-4.5% faster alone on groups of 2048
  // rows and 1-3% slower at 1024, but 3-5% slower inside the training step, where the expert
  // GEMMs share the GPU with other streams: docs/mxfp8_gemm.md.)
  virtual std::string CoreKernelName() const = 0;
};

}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_MX_GROUPED_GEMM_H_
