// MXFP8 (OCP Microscaling Formats v1.0, MXFP8 E4M3): quantization, layouts, dequantization.
//
// Format. A block is 32 consecutive elements of one row (row-wise) or one column (column-wise). It
// stores one E8M0 scale X (a byte b, X = 2^(b - 127); b = 0xFF is NaN) and 32 FP8 E4M3 elements
// P_i (bias 7, 3 mantissa bits, no infinities, S.1111.111 is NaN, largest finite 448). An element
// means P_i * X.
//
// Quantization of a block V_0..V_31 (bf16 inputs):
//   amax       = max_i |V_i|
//   shared_exp = ceil(log2(amax / 448))           (448: E4M3's largest normal; the smallest power
//                                                  of two X with amax / X <= 448)
//   shared_exp < -127  -> -127                    (zero blocks and tiny amax: b = 0x00)
//   shared_exp > 119   -> 119                     (so that P_i * X stays finite: 448 * 2^119 is
//                                                  1.75 * 2^127, and 2^120 would let an element
//                                                  round up to 256 * 2^120 = 2^128, past fp32)
//   X          = 2^shared_exp
//   P_i        = E4M3(V_i / X): round to nearest, ties to even; results past 448 in magnitude are
//                clamped to +-448 (reached only by |V_i| above 1.75 * 2^127, under the cap);
//                signed zeros keep their sign.
//   amax is Inf or NaN (any element non-finite) -> b = 0xFF (NaN) and every P_i = 0x7F (NaN).
// For a bf16 amax = 2^e (1 + f / 128): shared_exp = e - 8 when f <= 96 (amax's significand at most
// 1.75, the spec's value), else e - 7. The OCP spec's section 6.3 takes floor(log2(amax)) - 8 for
// every block, which leaves amax / X in [256, 512): a block's largest elements then saturate to
// 448 whenever amax's significand is above 1.75, losing up to 12.5% of their value, always toward
// zero. That bias is what moved the 500-step loss 3.5% off bf16's (docs/mxfp8_gemm.md, "The MX
// scale rounds up"). Rounding the exponent up (the scale rounding of "Recipes for Pre-training
// LLMs with MXFP8", arXiv:2506.08027) keeps amax / X in (224, 448] for 1.75 * 2^-120 < amax <=
// 1.75 * 2^127 (below, the -127 clamp makes it smaller; above, the cap lets it reach 510) and
// costs those blocks one bit of their smaller elements. Decoding is the spec's (P_i * X), so the
// data is valid MXFP8 for any consumer.
// bf16 inputs never reach shared_exp > 127 (their amax is below 2^128), so no finite block has a
// NaN scale. Because X is a power of two, V_i / X is exact before the E4M3 rounding.
//
// Layouts (all dense, row-major, byte-addressed; "rows" are tokens, "cols" the quantized feature
// dimension, cols a multiple of 32):
//   Row-wise  (blocks along cols: the K dimension of the forward and data-gradient GEMMs)
//     data   [rows][cols]           E4M3, row r at data + r * cols
//     scales [rows][cols / 32]      E8M0, scale of data[r][32*j .. 32*j+31] at scales[r * cols/32 + j]
//   Column-wise (blocks along rows, i.e. along tokens: the K dimension of the weight-gradient GEMMs)
//     The input's rows form G groups (experts): group g owns rows [offsets[g], offsets[g+1]). A
//     block must not straddle two groups, so each group is padded to a multiple of 32 rows:
//       padded_offsets[0] = 0, padded_offsets[g+1] = padded_offsets[g] + RoundUp32(count_g).
//     The output is stored block-major, P = padded_rows (a multiple of 32, ColwisePaddedRows()):
//     padded rows [32j, 32j + 32) form block row j, one run of cols * 32 bytes in which column c's
//     32 elements (rows in order: K-contiguous for the GEMM) follow column c - 1's:
//       data   [P / 32][cols][32]     E4M3, element (row r of group g, col c), with padded row
//                                     p = padded_offsets[g] + (r - offsets[g]), at
//                                     data[(p / 32) * cols * 32 + c * 32 + p % 32]
//       scales [P / 32][cols]         E8M0, scale of data[j][c][0..31] at scales[j * cols + c]
//       group_offsets [G + 1]         int32, the padded_offsets above (written by the kernel)
//     Why block-major and not [cols][P]: the quantizer then writes each block row as one
//     contiguous run (a transposed [cols][P] output scatters one 32-byte piece per column and
//     block, which held the kernel to ~80% of the copy bandwidth), and a GEMM reducing over tokens
//     takes one 32-byte K slice per row for each k32 fp8 wgmma: exactly one block row.
//     Padding rows (past a group's count, up to its padded end) are written as +0 (0x00; 0x7F in a
//     block whose scale is NaN); they take no part in their block's amax, so a group's GEMM may
//     run over its whole padded range.
//     Block rows [padded_offsets[G] / 32, P / 32) are left untouched.
//
// Group offsets (input): int32 [G + 1], offsets[0] = 0, non-decreasing, offsets[G] <= rows; they
// live in device memory for the CUDA kernels (no host synchronization), host memory for the CPU
// references. A null group_offsets means one group holding every row. Rows at or past offsets[G]
// are neither read nor written, in any layout. The row-wise-only quantization (no column-wise
// output) also takes offsets[0] > 0, a run of the groups: rows before offsets[0] are then neither
// read nor written.
//
// Both layouts come from one read of the input (one launch for every group).
#ifndef DROPLESS_KERNELS_MXFP8_H_
#define DROPLESS_KERNELS_MXFP8_H_

#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "dropless/kernels/types.h"

namespace dropless::kernels {

inline constexpr int kMxBlock = 32;
inline constexpr uint8_t kE8M0Nan = 0xFF;
inline constexpr uint8_t kE4M3Nan = 0x7F;
inline constexpr float kE4M3Max = 448.0f;

// ---- Scalar codecs (host; the CUDA kernels produce the same bits). ----

// Scale byte of a block whose largest magnitude is the bf16 `amax` (sign ignored).
inline uint8_t E8M0ScaleForAmax(Bf16 amax) {
  const uint32_t magnitude = amax.bits & 0x7fffu;
  if (magnitude >= 0x7f80u) return kE8M0Nan;            // Inf or NaN in the block
  const int exponent_field = static_cast<int>(magnitude >> 7);  // biased exponent of amax
  // ceil(log2(amax / 448)) + 127: exponent_field - 8, plus one when the 7-bit fraction is above
  // 96 (significand above 1.75), clamped to [0, 246] (2^-127 .. 2^119); subnormal and zero amax
  // have exponent_field 0.
  const int biased = exponent_field - 8 + ((magnitude & 0x7fu) > 96u ? 1 : 0);
  return static_cast<uint8_t>(biased < 0 ? 0 : (biased > 246 ? 246 : biased));
}

inline float E8M0ToFloat(uint8_t scale) {
  if (scale == kE8M0Nan) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(scale) - 127);
}

// E4M3 with round-to-nearest-even and saturation to +-448; NaN -> 0x7F; +-Inf -> +-448.
inline uint8_t FloatToE4M3(float v) {
  if (std::isnan(v)) return kE4M3Nan;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(v));
  if (a >= 448.0) return sign | 0x7E;
  int exponent;
  std::frexp(a, &exponent);                      // a = m * 2^exponent, m in [0.5, 1)
  const int e = a < std::ldexp(1.0, -6) ? -6 : exponent - 1;  // subnormals share 2^-6's quantum
  // Code = ((e + 7) << 3) + (mantissa steps); a carry from rounding moves into the exponent field,
  // and subnormals (e = -6 with q < 8) encode as exponent 0 with the same arithmetic.
  const double q = std::nearbyint(a / std::ldexp(1.0, e - 3));  // in [0, 16]; ties to even
  const int code = e == -6 ? static_cast<int>(q) : ((e + 7) << 3) + static_cast<int>(q) - 8;
  return sign | static_cast<uint8_t>(code);
}

inline float E4M3ToFloat(uint8_t p) {
  const int exponent = (p >> 3) & 0xF;
  const int mantissa = p & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                        : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  return (p & 0x80) ? -magnitude : magnitude;
}

// The value an MXFP8 element stands for (NaN when either the scale or the element is NaN).
inline float MxElementValue(uint8_t element, uint8_t scale) {
  return E4M3ToFloat(element) * E8M0ToFloat(scale);
}

// Quantizes one block of 32 values read at v[i * stride]; writes out[i * out_stride] and *scale.
void QuantizeMxBlock(const Bf16* v, int64_t stride, uint8_t* out, int64_t out_stride,
                     uint8_t* scale);

// ---- Layout descriptors. ----

struct MxRowwise {
  uint8_t* data = nullptr;    // [rows][cols]
  uint8_t* scales = nullptr;  // [rows][cols / 32]
};

struct MxColwise {
  uint8_t* data = nullptr;            // [padded_rows / 32][cols][32]
  uint8_t* scales = nullptr;          // [padded_rows / 32][cols]
  int32_t* group_offsets = nullptr;   // [num_groups + 1], padded offsets (output)
  int64_t padded_rows = 0;            // P, at least ColwisePaddedRows(rows, num_groups)
};

// Padded rows that hold `rows` rows in `num_groups` groups whatever the group sizes:
// sum_g RoundUp32(count_g) <= rows + 31 * num_groups, rounded up to 32.
inline int64_t ColwisePaddedRows(int64_t rows, int num_groups) {
  const int64_t bound = rows + 31 * static_cast<int64_t>(num_groups < 1 ? 1 : num_groups);
  return (bound + kMxBlock - 1) / kMxBlock * kMxBlock;
}

struct MxQuantizeShape {
  int64_t rows = 0;     // rows the input buffer holds (capacity); offsets[G] <= rows
  int64_t cols = 0;     // multiple of 32
  int num_groups = 1;   // G >= 1 (1 when group_offsets is null)
};

// One clear error naming the bad field; also checks that at least one output is requested and that
// colwise->padded_rows is large enough.
absl::Status ValidateMxQuantize(const MxQuantizeShape& shape, const Bf16* x,
                                const MxRowwise* rowwise, const MxColwise* colwise);

// ---- The weight image of the bf16-core MXFP8 GEMM (mx_grouped_gemm.h). ----
//
// A row-wise MXFP8 operand [rows][cols] (+ scales [rows][cols / 32]) as bf16 [rows][cols]: every
// element's exact value P * X (bf16 holds it: 3 mantissa bits, fp32's exponent range; a value
// below bf16's smallest subnormal 2^-133, possible only under a scale of 2^-124 or less, rounds to
// nearest even), NaN for a NaN scale, with
// the column index permuted within each run of 64: image position 64 b + l holds the element of
// column 64 b + MxImagePhysicalColumn(l). That is the order in which the bf16-core kernel's
// register fragments read the other (activation) operand's bytes, so the two meet in the
// reduction. cols must be a multiple of 64.
//
// The kernel fills k16 step j's fragment columns {2q, 2q+1, 2q+8, 2q+9} of thread quad q from the
// 4 consecutive bytes 16q + 4j .. 16q + 4j + 3 of its row (one 16-byte load per row and 64).
DROPLESS_KERNELS_HD constexpr int MxImagePhysicalColumn(int logical) {
  return 16 * (((logical % 16) % 8) / 2) + 4 * (logical / 16) + (logical % 2) +
         2 * ((logical % 16) / 8);
}

// Both weight images of a bf16 weight W [experts][k][n] straight from W, as the quantize-then-image
// path makes them: image_along_n [experts][k][n] = the weight image of W quantized along n (the
// data gradient's operand), image_along_k [experts][n][k] = that of W^T quantized along k (the
// forward's). k and n multiples of 64.
struct MxWeightImagesShape {
  int64_t experts = 0;
  int64_t k = 0;
  int64_t n = 0;
};

// ---- The column-wise image (the bf16-core weight gradient's operands, mx_grouped_gemm.h). ----
//
// A column-wise MXFP8 operand (block-major, the layout above) as exact bf16 rows: image [P][cols],
// image[p][c] = the value of padded row p, column c (exact as in the weight image; padding rows
// are +0). Block rows at or past padded_offsets[G] / 32 are not written. The bf16 grouped GEMM's
// weight gradient over these rows and padded_offsets computes exactly the MXFP8 weight gradient
// (every product exact in bf16, fp32 accumulation).

// One clear error naming the bad field of an MxColwiseImage call (CPU and CUDA share it).
absl::Status ValidateMxColwiseImage(int64_t cols, int num_groups, const MxColwise& colwise,
                                    const Bf16* image);

namespace cpu {

// Row-wise and/or column-wise MXFP8 of x [rows][cols] (bf16) per the layouts above. rowwise or
// colwise may be null (not both).
absl::Status QuantizeMxfp8(const MxQuantizeShape& shape, const Bf16* x,
                           const int32_t* group_offsets, const MxRowwise* rowwise,
                           const MxColwise* colwise);

// out[r][c] = P[r][c] * X[r][c / 32] for rows r < *num_rows (every row when num_rows is null).
// The float result is exact; the bf16 one is rounded to nearest even.
absl::Status DequantizeMxfp8Rowwise(int64_t rows, int64_t cols, const int32_t* num_rows,
                                    const uint8_t* data, const uint8_t* scales, float* out);
absl::Status DequantizeMxfp8Rowwise(int64_t rows, int64_t cols, const int32_t* num_rows,
                                    const uint8_t* data, const uint8_t* scales, Bf16* out);

// The weight image above: image [rows][cols] bf16 of data [rows][cols] + scales [rows][cols / 32].
absl::Status MxWeightImage(int64_t rows, int64_t cols, const uint8_t* data, const uint8_t* scales,
                           Bf16* image);
// The column-wise image above, for padded_rows and cols of `colwise` (its data, scales and
// group_offsets, num_groups + 1 of them, read).
absl::Status MxColwiseImage(int64_t cols, int num_groups, const MxColwise& colwise, Bf16* image);
absl::Status MxWeightImages(const MxWeightImagesShape& shape, const Bf16* w, Bf16* image_along_n,
                            Bf16* image_along_k);

}  // namespace cpu

namespace cuda {

// Same contracts; pointers are device pointers, work is queued on `stream` and never synchronizes.
// One launch covers every group (plus a one-block kernel that writes colwise->group_offsets).
absl::Status QuantizeMxfp8(const MxQuantizeShape& shape, const Bf16* x,
                           const int32_t* group_offsets, const MxRowwise* rowwise,
                           const MxColwise* colwise, Stream stream);

absl::Status DequantizeMxfp8Rowwise(int64_t rows, int64_t cols, const int32_t* num_rows,
                                    const uint8_t* data, const uint8_t* scales, float* out,
                                    Stream stream);
absl::Status DequantizeMxfp8Rowwise(int64_t rows, int64_t cols, const int32_t* num_rows,
                                    const uint8_t* data, const uint8_t* scales, Bf16* out,
                                    Stream stream);
absl::Status MxWeightImage(int64_t rows, int64_t cols, const uint8_t* data, const uint8_t* scales,
                           Bf16* image, Stream stream);
absl::Status MxColwiseImage(int64_t cols, int num_groups, const MxColwise& colwise, Bf16* image,
                            Stream stream);
// One read of w, one 64 x 64 tile per CTA.
absl::Status MxWeightImages(const MxWeightImagesShape& shape, const Bf16* w, Bf16* image_along_n,
                            Bf16* image_along_k, Stream stream);

}  // namespace cuda
}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_MXFP8_H_
