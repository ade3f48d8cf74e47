// SwiGLU on the expert GEMM's output h [M][2F]: gate = h[:, 0:F], up = h[:, F:2F],
//   out = silu(gate) * up,  silu(g) = g * sigmoid(g) = g / (1 + exp(-g)).
// Backward, with s = sigmoid(g):
//   d_gate = d_out * up * s * (1 + g * (1 - s)),   d_up = d_out * g * s.
// Math in fp32, one rounding to bf16 per output. F is a multiple of 8 (of 32 for MXFP8 output).
//
// Rows: the buffers hold `rows` rows; num_rows (device pointer for CUDA, host pointer for the CPU
// reference, null for all rows) gives how many are live, so a call never needs the routed token
// count on the host. Rows at or past *num_rows are neither read nor written.
//
// Forward outputs (either or both): out [M][F] bf16, and/or out_mx, row-wise MXFP8 of the same
// [M][F] (mxfp8.h). The MXFP8 output quantizes the bf16-rounded values, so it equals
// QuantizeMxfp8 applied to `out` bit for bit. SwigluForwardFp8Block (CUDA): out (may be null) and
// out_fb, row-wise fp8-block 1x128 tiles of the same [M][F] (fp8_block.h; F a multiple of 128),
// likewise from the bf16-rounded values: it equals QuantizeFp8Block's row-wise output of `out`
// (over the live rows) bit for bit.
//
// SwigluForwardFp8BlockGrouped (CUDA): out in fp8-block form only, without storing it: rowwise
// and/or colwise (not both null) as QuantizeFp8Block of {rows, F, num_groups, mode} writes them
// from SwigluForward's bf16 out over group_offsets (device, num_groups + 1; null for one group of
// `rows` rows), bit for bit (F a multiple of 128). Rows outside the groups are not read.
//
// SwigluBackwardFp8Block (CUDA): the backward's d_h in fp8-block form only, without storing d_h:
// rowwise (may be null) and colwise (may be null, not both) as QuantizeFp8Block of
// {rows, 2F, num_groups, mode} writes them from d_h over group_offsets (device, num_groups + 1;
// null for one group of `rows` rows), bit for bit those of SwigluBackward's d_h (F a multiple of
// 128). Rows outside the groups are not read.
#ifndef DROPLESS_KERNELS_SWIGLU_H_
#define DROPLESS_KERNELS_SWIGLU_H_

#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "dropless/kernels/cpu_types.h"
#include "dropless/kernels/fp8_block.h"
#include "dropless/kernels/mxfp8.h"
#include "dropless/kernels/types.h"

namespace dropless::kernels {

struct SwigluShape {
  int64_t rows = 0;  // M the buffers hold
  int64_t ffn = 0;   // F
};

// cuda_rows: F must be a multiple of 8 (of 32 with mxfp8), as the CUDA kernels need; the CPU
// references over float and double (cpu_types.h) take any F.
absl::Status ValidateSwigluShape(const SwigluShape& shape, bool mxfp8, bool cuda_rows = true);

namespace cpu {

// T is Bf16, float or double (cpu_types.h): the same formulas in MathOf<T>, rounded to bf16 per
// output for Bf16 only. out_mx (MXFP8 output) is for Bf16 only. The CPU engine's experts use
// these between their GEMMs (worker/engine/cpu/swiglu_expert.cc).
// (T is deduced from h alone, so out may be a plain nullptr.)
template <typename T>
absl::Status SwigluForward(const SwigluShape& shape, const int32_t* num_rows, const T* h,
                           std::common_type_t<T>* out, const MxRowwise* out_mx);
// d_out [M][F], d_h [M][2F].
template <typename T>
absl::Status SwigluBackward(const SwigluShape& shape, const int32_t* num_rows, const T* h,
                            const T* d_out, T* d_h);

}  // namespace cpu

namespace cuda {

absl::Status SwigluForward(const SwigluShape& shape, const int32_t* num_rows, const Bf16* h,
                           Bf16* out, const MxRowwise* out_mx, Stream stream);
absl::Status SwigluForwardFp8Block(const SwigluShape& shape, const int32_t* num_rows,
                                   const Bf16* h, Bf16* out, const Fp8BlockRowwise& out_fb,
                                   Fp8ScaleMode mode, Stream stream);
absl::Status SwigluForwardFp8BlockGrouped(const SwigluShape& shape, const int32_t* group_offsets,
                                          int num_groups, const Bf16* h,
                                          const Fp8BlockRowwise* rowwise,
                                          const Fp8BlockColwise* colwise, Fp8ScaleMode mode,
                                          Stream stream);
absl::Status SwigluBackward(const SwigluShape& shape, const int32_t* num_rows, const Bf16* h,
                            const Bf16* d_out, Bf16* d_h, Stream stream);
absl::Status SwigluBackwardFp8Block(const SwigluShape& shape, const int32_t* group_offsets,
                                    int num_groups, const Bf16* h, const Bf16* d_out,
                                    const Fp8BlockRowwise* rowwise, const Fp8BlockColwise* colwise,
                                    Fp8ScaleMode mode, Stream stream);

}  // namespace cuda
}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_SWIGLU_H_
