// FP8 blockwise-scaled grouped GEMM over expert-contiguous token groups (Hopper sm_90a, E4M3 x
// E4M3, fp32 accumulation), with the operands in the fp8-block layouts of fp8_block.h: activations
// scaled per 1 x 128 tile, weights per 128 x 128 block, fp32 scales. Built on CUTLASS's sm90
// ptr-array grouped GEMM with blockwise scaling (TMA loads, warp-specialized persistent kernel).
//
// Semantics. Per output element and per 128-wide K block kb:
//   C[m][n] = sum_kb (sa[m][kb] * sb[n][kb]) * (sum_{k in kb} A[m][k] * B[n][k])
// The inner sum runs on the fp8 tensor cores (four k32 wgmmas into a zeroed fp32 accumulator);
// after every K block it is multiplied by the scales and added to the fp32 result, so the output
// is the fp64 product of the dequantized operands up to fp32 rounding (and the bf16 rounding of
// the bf16 outputs). NaN scales or NaN elements give NaN outputs in their rows / columns.
//
// Products (group e owns token rows [offsets[e], offsets[e+1]); fp8_block.h names the buffers):
//   Forward        Y_e   = X_e . W[e]      A = X row-wise       data [rows][k], scales [rows][k/128]
//                                          B = W^T              Fp8BlockWeights::data_t [E][n][k],
//                                                               scales_t [E][n/128][k/128]
//                                          C = Y [rows][n] bf16
//   BackwardData   dX_e  = dY_e . W[e]^T   A = dY row-wise      data [rows][n], scales [rows][n/128]
//                                          B = W                Fp8BlockWeights::data [E][k][n],
//                                                               scales [E][k/128][n/128]
//                                          C = dX [rows][k] bf16
//   BackwardWeight dW[e] = X_e^T . dY_e    A = X column-wise    data [k][P], scales [P/128][k],
//                                                               or [P/128][k/128] per 128 x 128
//                                                               block (options.x_scaling)
//                                          B = dY column-wise   data [n][P], scales [P/128][n]
//                                          C = dW [E][k][n] fp32; zeros for an empty group
// The forward and data-gradient products are m-grouped (group e's rows of A against B[e]); the
// weight gradient is k-grouped: the reduction runs over the group's padded token range
// [padded_offsets[e], padded_offsets[e+1]) of the column-wise buffers (P = padded_rows; padding
// elements are +0, as the quantizer writes them), padded_offsets being Fp8BlockColwise's
// group_offsets.
//
// Offsets live on the device (int32, num_groups + 1 entries) and are never read by the host:
// calls only launch (a small kernel writing the per-group arguments, for the weight gradient one
// zeroing empty groups' dW, and the GEMM) and can be captured in a CUDA graph whose replays follow
// the offsets' contents. Row offsets are clamped to [0, max_rows] on the device; padded offsets to
// [0, padded_rows] and widened to multiples of 128 (a no-op for the quantizer's). Rows of Y / dX
// at or past offsets[num_groups] are never written; no row of A at or past a group's end is read
// for that group. Forward and BackwardData also take a run of a larger grouping's groups (row
// offsets[0] > 0; rows before it untouched).
//
// Scale buffers need no slack rows: the scale loads are per element (cp.async), predicated on the
// group's extent along M (and N, K); a tile's scale rows past its group's end are not loaded (their
// shared-memory slots keep stale values that only scale accumulator rows the epilogue does not
// store). So row-wise scales may be exactly [rows][cols/128] and column-wise ones [P/128][cols].
//
// Alignment: data pointers 16 bytes (TMA), scale pointers 4 bytes, outputs 16 bytes; k and n are
// multiples of 128. Calls of one product on one object must be ordered on one stream (each product
// owns the device argument arrays its launch reads); different products may run concurrently.
#ifndef DROPLESS_KERNELS_FP8_BLOCK_GROUPED_GEMM_H_
#define DROPLESS_KERNELS_FP8_BLOCK_GROUPED_GEMM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dropless/kernels/fp8_block.h"
#include "dropless/kernels/types.h"

namespace dropless::kernels {

// One fp8-block operand as the GEMM reads it: E4M3 data and its fp32 scales (layouts per product
// above). Device pointers.
struct Fp8BlockOperand {
  const uint8_t* data = nullptr;
  const float* scales = nullptr;
};

struct Fp8BlockGroupedGemmOptions {
  int num_groups = 0;    // E, experts on this rank
  int k = 0;             // forward reduction dimension (hidden); multiple of 128
  int n = 0;             // forward output width; multiple of 128
  int64_t max_rows = 0;  // rows the X / Y / dX / dY row-wise buffers hold
  // P of the column-wise buffers the weight gradient reads (Fp8BlockColwise::padded_rows), a
  // multiple of 128; 0 means Fp8ColwisePaddedRows(max_rows, num_groups).
  int64_t padded_rows = 0;
  // The kernel of the forward and data gradient, one of MGroupedKernelNames(), and of the weight
  // gradient, one of WeightGradientKernelNames(). An empty m_grouped_kernel picks each m-grouped
  // product's kernel by its shape (MGroupedKernelFor); an empty weight_gradient_kernel picks
  // the weight gradient's by the groups' size (WeightGradientKernelFor).
  std::string m_grouped_kernel;
  std::string weight_gradient_kernel;
  // Rows a group is expected to get (tokens * top_k / experts): the weight gradient's reduction
  // length, which picks its default kernel; 0 means max_rows / num_groups.
  int64_t expected_rows_per_group = 0;
  // The layout of BackwardWeight's x_colwise scales (fp8_block.h's Fp8ColwiseScaling): per
  // column of each 128-token tile, or one per 128 x 128 block. Per block, a partial sum is
  // promoted with one FMA an accumulator instead of a multiply and an FMA (the weight-gradient
  // kernels are bound by that promotion). weight_gradient_kernel must read the same layout.
  Fp8ColwiseScaling x_scaling = Fp8ColwiseScaling::kPerColumn;
  // The persistent kernels' CTAs stay on at most this many multiprocessors (0: every one), so
  // that kernels on other streams (an expert exchange beside the GEMMs) find some free.
  int max_sms = 0;
};

class Fp8BlockGroupedGemm {
 public:
  // Checks the options first (errors name the field; no device is touched for that), then needs a
  // Hopper (sm_90) device current on the calling thread, where it allocates each product's
  // per-group argument arrays and kernel workspace.
  static absl::StatusOr<std::unique_ptr<Fp8BlockGroupedGemm>> Create(
      const Fp8BlockGroupedGemmOptions& options);

  virtual ~Fp8BlockGroupedGemm() = default;

  // The compiled kernels (for benchmarks and the options above); the weight gradient's that read
  // X's scales as `x_scaling`.
  static std::vector<std::string> MGroupedKernelNames();
  static std::vector<std::string> WeightGradientKernelNames(
      Fp8ColwiseScaling x_scaling = Fp8ColwiseScaling::kPerColumn);

  // The m-grouped kernel a product gets by default, from the width of its output and the length
  // of its reduction (the forward: n and k; the data gradient: k and n): the 192-wide N tile where
  // its tiles cover that width about as tightly as 128-wide ones (in 1 x 2 clusters for
  // reductions of at most 2048, without beyond); else, where
  // the 192-wide tile without clusters does, that tile for long reductions and the 256 x 128 wave
  // kernel for reductions of at most 2048; else the 128-wide tile. Needs no device.
  static std::string MGroupedKernelFor(int output_width, int reduction);
  // The weight-gradient kernel a product gets by default, for X's scale layout and the rows a
  // group is expected to get: the pingpong kernel (one warp group's epilogue under the other's
  // K loop) for groups of at most 1024 rows, whose short K loops make the store of the fp32
  // gradient a large share of a tile; the cooperative kernel for longer ones. Needs no device.
  static std::string WeightGradientKernelFor(Fp8ColwiseScaling x_scaling,
                                             int64_t expected_rows_per_group);

  // y [max_rows][n] bf16; x row-wise [max_rows][k]; w_t = {data_t, scales_t} of Fp8BlockWeights.
  virtual absl::Status Forward(const Fp8BlockOperand& x, const Fp8BlockOperand& w_t,
                               const int32_t* offsets, Bf16* y, Stream stream) = 0;
  // dx [max_rows][k] bf16; dy row-wise [max_rows][n]; w = {data, scales} of Fp8BlockWeights.
  virtual absl::Status BackwardData(const Fp8BlockOperand& dy, const Fp8BlockOperand& w,
                                    const int32_t* offsets, Bf16* dx, Stream stream) = 0;
  // dw [E][k][n] fp32; x_colwise [k][P] and dy_colwise [n][P] with their scales (X's as
  // options.x_scaling; [P/128][n]) and the padded offsets, as QuantizeFp8Block writes them.
  virtual absl::Status BackwardWeight(const Fp8BlockOperand& x_colwise,
                                      const Fp8BlockOperand& dy_colwise,
                                      const int32_t* padded_offsets, float* dw, Stream stream) = 0;

  // The compiled configuration (tile, schedule, cluster), for benchmarks and logs:
  // "<forward kernel>+<data-gradient kernel>+<weight-gradient kernel>".
  virtual std::string KernelName() const = 0;
};

}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_FP8_BLOCK_GROUPED_GEMM_H_
