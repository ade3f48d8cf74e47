// FP8 blockwise scaling (the Hopper recipe of DeepSeek-V3 and Transformer Engine's
// Float8BlockScaling): activations scaled per 1x128 tile, weights per 128x128 block, fp32 scales,
// FP8 E4M3 elements (codec in mxfp8.h: round to nearest even, saturation to +-448, 0x7F is NaN).
//
// Quantization of one block (a 1x128 tile of a row or a column, or a 128x128 weight block) with
// largest magnitude amax (exact: every input is bf16):
//   amax non-finite                -> scale = NaN, every element 0x7F (NaN)
//   a     = max(amax, kFp8BlockMinAmax)       (an all-zero block gets a finite, tiny scale)
//   Fp8ScaleMode::kFloat32:   inverse = 448 / a        (fp32, round to nearest)
//                             scale   = a / 448        (fp32, round to nearest)
//   Fp8ScaleMode::kPowerOfTwo: scale  = 2^e, e the smallest integer with a <= 448 * 2^e
//                             inverse = 2^-e           (exact; elements are exact rescalings)
//   element_i = E4M3(v_i * inverse)        (the fp32 product rounded to nearest, then E4M3)
// An element stands for element_i * scale. Every step is one IEEE fp32 operation, so the CUDA
// kernels produce the CPU references' bits exactly.
//
// Layouts (dense, byte-addressed; "rows" are tokens, "cols" the feature dimension, a multiple of
// 128; every scale is an fp32):
//   Row-wise (1x128 tiles along cols: the K of the forward and data-gradient GEMMs)
//     data   [rows][cols]          E4M3
//     scales [rows][cols / 128]    scale of data[r][128*j .. 128*j+127] at scales[r * cols/128 + j]
//   Column-wise (1x128 tiles along rows, i.e. tokens: the K of the weight-gradient GEMMs)
//     Rows form G groups (experts), group g owns rows [offsets[g], offsets[g+1]). A tile must not
//     straddle two groups, so each group is padded to a multiple of 128 rows:
//       padded_offsets[0] = 0, padded_offsets[g+1] = padded_offsets[g] + RoundUp128(count_g).
//     The output is transposed, P = padded_rows (a multiple of 128, at least
//     Fp8ColwisePaddedRows(rows, G)); row r of group g sits at padded row
//     p = padded_offsets[g] + (r - offsets[g]):
//       data   [cols][P]            E4M3, element (r, c) at data[c * P + p] (tokens contiguous)
//       scales [P / 128][cols]      scale of data[c][128*j .. 128*j+127] at scales[j * cols + c]
//     or, with Fp8ColwiseScaling::kPerBlock (one scale per 128 x 128 block of a padded tile: the
//     recipe of precision fp8-block-wgrad128 for the weight gradient's activation operand),
//       scales [P / 128][cols / 128] scale of data[128*i .. 128*i+127][128*j .. 128*j+127] at
//                                   scales[j * cols/128 + i], the block's amax over its live rows
//       group_offsets [G + 1]       int32, padded_offsets (written by the quantizer)
//     Padding elements (past a group's count, up to its padded end) are written as +0 (0x7F in a
//     tile whose scale is NaN) and take no part in their tile's amax; padded rows at or past
//     padded_offsets[G] are left untouched.
//   Weights (128x128 blocks; W [E][k][n] bf16 as the engine keeps expert weights, k and n
//   multiples of 128): both orientations from one read, with the same block scales,
//     data     [E][k][n]           E4M3, W itself           (the data-gradient GEMM's operand)
//     data_t   [E][n][k]           E4M3, W^T per expert     (the forward GEMM's operand)
//     scales   [E][k/128][n/128]   scale of the block of rows 128*i.., cols 128*j..
//     scales_t [E][n/128][k/128]   the same scales transposed
//     Either half (data + scales, or data_t + scales_t) may be skipped (null pointers).
//
// Group offsets (input): int32 [G + 1], offsets[0] = 0, non-decreasing, offsets[G] <= rows; device
// memory for the CUDA kernels (never read by the host: no synchronization), host memory for the CPU
// references. A null group_offsets means one group holding every row. Rows at or past offsets[G]
// are neither read nor written, in any layout. The row-wise-only quantization (no column-wise
// output) also takes offsets[0] > 0, a run of the groups: rows before offsets[0] are then neither
// read nor written (the engine quantizes one chunk of experts at a time so).
#ifndef DROPLESS_KERNELS_FP8_BLOCK_H_
#define DROPLESS_KERNELS_FP8_BLOCK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "dropless/kernels/adamw.h"
#include "dropless/kernels/permute.h"
#include "dropless/kernels/types.h"

namespace dropless::kernels {

inline constexpr int kFp8Block = 128;
// The smallest amax a scale is made for: an all-zero (or nearly zero) tile still gets a normal,
// non-zero scale and a finite inverse in both modes (448 / 2^-100 and 2^108 are far inside fp32's
// range), while tiles of tiny values (bf16 reaches 2^-133) down to 2^-100 keep their precision.
inline constexpr float kFp8BlockMinAmax = 7.888609052210118e-31f;  // 2^-100

enum class Fp8ScaleMode { kFloat32, kPowerOfTwo };

// ---- Scalar codec (host; the CUDA kernels produce the same bits). ----

struct Fp8BlockScale {
  float scale = 0;    // what an element is multiplied by to dequantize
  float inverse = 0;  // what an input is multiplied by before the E4M3 rounding
};

// The scale of a block whose largest magnitude is `amax` (>= 0, or NaN/Inf for a non-finite block:
// scale NaN, inverse NaN).
Fp8BlockScale Fp8BlockScaleForAmax(float amax, Fp8ScaleMode mode);

// ---- Layout descriptors. ----

struct Fp8BlockRowwise {
  uint8_t* data = nullptr;  // [rows][cols]
  float* scales = nullptr;  // [rows][cols / 128]
};

// The column-wise form's scale granularity: a scale per column of each 128-row tile (1 x 128
// along the tokens, the recipe's default), or one per 128 x 128 block of the tile.
enum class Fp8ColwiseScaling { kPerColumn, kPerBlock };

struct Fp8BlockColwise {
  uint8_t* data = nullptr;           // [cols][padded_rows]
  float* scales = nullptr;           // [padded_rows / 128][cols] ([.][cols / 128] per block)
  int32_t* group_offsets = nullptr;  // [num_groups + 1], padded offsets (output)
  int64_t padded_rows = 0;           // P, at least Fp8ColwisePaddedRows(rows, num_groups)
  Fp8ColwiseScaling scaling = Fp8ColwiseScaling::kPerColumn;
};

// Scales a column-wise form of `cols` columns holds per 128-row tile.
inline int64_t Fp8ColwiseScalesPerTile(int64_t cols, Fp8ColwiseScaling scaling) {
  return scaling == Fp8ColwiseScaling::kPerBlock ? cols / kFp8Block : cols;
}

struct Fp8BlockWeights {
  uint8_t* data = nullptr;    // [E][k][n]
  float* scales = nullptr;    // [E][k/128][n/128]
  uint8_t* data_t = nullptr;  // [E][n][k]
  float* scales_t = nullptr;  // [E][n/128][k/128]
};

// Padded rows that hold `rows` rows in `num_groups` groups whatever the group sizes:
// sum_g RoundUp128(count_g) <= rows + 127 * num_groups, rounded up to 128.
inline int64_t Fp8ColwisePaddedRows(int64_t rows, int num_groups) {
  const int64_t bound = rows + (kFp8Block - 1) * static_cast<int64_t>(num_groups < 1 ? 1 : num_groups);
  return (bound + kFp8Block - 1) / kFp8Block * kFp8Block;
}

struct Fp8BlockQuantizeShape {
  int64_t rows = 0;    // rows the input buffer holds (capacity); offsets[G] <= rows
  int64_t cols = 0;    // multiple of 128
  int num_groups = 1;  // G >= 1 (1 when group_offsets is null)
  Fp8ScaleMode mode = Fp8ScaleMode::kFloat32;
};

struct Fp8BlockWeightShape {
  int num_experts = 0;  // E >= 1
  int64_t k = 0;        // multiple of 128
  int64_t n = 0;        // multiple of 128
  Fp8ScaleMode mode = Fp8ScaleMode::kFloat32;
};

// One clear error naming the bad field (at least one output requested, colwise->padded_rows large
// enough, aligned sizes).
absl::Status ValidateFp8BlockQuantize(const Fp8BlockQuantizeShape& shape, const Bf16* x,
                                      const Fp8BlockRowwise* rowwise,
                                      const Fp8BlockColwise* colwise);
absl::Status ValidateFp8BlockWeights(const Fp8BlockWeightShape& shape, const Bf16* w,
                                     const Fp8BlockWeights& out);

namespace cpu {

// Row-wise and/or column-wise fp8-block quantization of x [rows][cols] (bf16); rowwise or colwise
// may be null (not both).
absl::Status QuantizeFp8Block(const Fp8BlockQuantizeShape& shape, const Bf16* x,
                              const int32_t* group_offsets, const Fp8BlockRowwise* rowwise,
                              const Fp8BlockColwise* colwise);

// Both orientations of the expert weights w [E][k][n] (bf16) per 128x128 block.
absl::Status QuantizeFp8BlockWeights(const Fp8BlockWeightShape& shape, const Bf16* w,
                                     const Fp8BlockWeights& out);

// out[r][c] = element[r][c] * scale[r][c / 128] for rows r < *num_rows (every row when num_rows is
// null); the float product is exact in kPowerOfTwo mode, the bf16 one rounded to nearest even.
absl::Status DequantizeFp8BlockRowwise(int64_t rows, int64_t cols, const int32_t* num_rows,
                                       const uint8_t* data, const float* scales, float* out);
absl::Status DequantizeFp8BlockRowwise(int64_t rows, int64_t cols, const int32_t* num_rows,
                                       const uint8_t* data, const float* scales, Bf16* out);

// Permute fused with row-wise quantization (permute.h's slot map): each token row of x [T][H] is
// quantized once (the row-wise layout above, H a multiple of 128) and its bytes and scales copied
// to its k slots of rows ([T*k] rows); slots of -1 are skipped.
absl::Status PermuteFp8Block(const PermuteShape& shape, const Bf16* x,
                             const int32_t* slot_of_choice, const Fp8BlockRowwise& rows,
                             Fp8ScaleMode mode);

}  // namespace cpu

namespace cuda {

// Same contracts; device pointers, queued on `stream`, never synchronizing (graph-capturable).
// QuantizeFp8Block is one launch for every group (plus a one-block kernel writing
// colwise->group_offsets when colwise is requested).
absl::Status QuantizeFp8Block(const Fp8BlockQuantizeShape& shape, const Bf16* x,
                              const int32_t* group_offsets, const Fp8BlockRowwise* rowwise,
                              const Fp8BlockColwise* colwise, Stream stream);

absl::Status QuantizeFp8BlockWeights(const Fp8BlockWeightShape& shape, const Bf16* w,
                                     const Fp8BlockWeights& out, Stream stream);

absl::Status DequantizeFp8BlockRowwise(int64_t rows, int64_t cols, const int32_t* num_rows,
                                       const uint8_t* data, const float* scales, Bf16* out,
                                       Stream stream);

absl::Status PermuteFp8Block(const PermuteShape& shape, const Bf16* x,
                             const int32_t* slot_of_choice, const Fp8BlockRowwise& rows,
                             Fp8ScaleMode mode, Stream stream);

// The permuted rows (Permute's output: rows[slot(t, j)] = x[t], T*k rows of H) in fp8-block form
// only, never stored in bf16: rowwise and/or colwise exactly as QuantizeFp8Block({T*k, H,
// num_groups, mode}, rows, group_offsets, ...) writes them, each row gathered from x through the
// dispatch plan's choice_of_slot. Every slot inside the groups must hold a choice (a dropless
// plan's slots below expert_offsets[E]).
absl::Status PermuteFp8BlockGrouped(const PermuteShape& shape, const Bf16* x,
                                    const int32_t* choice_of_slot, const int32_t* group_offsets,
                                    int num_groups, const Fp8BlockRowwise* rowwise,
                                    const Fp8BlockColwise* colwise, Fp8ScaleMode mode,
                                    Stream stream);

// The combine's row gradient (permute.h's UnpermuteCombineBackward: d_rows[slot(t, j)] =
// w[t][j] * d_y[t], T*k rows of H) in fp8-block form only, never stored in bf16: rowwise and/or
// colwise as PermuteFp8BlockGrouped writes the rows', from d_y and the gates.
absl::Status UnpermuteCombineBackwardFp8Block(const PermuteShape& shape, const Bf16* d_y,
                                              const int32_t* choice_of_slot, const float* weights,
                                              const int32_t* group_offsets, int num_groups,
                                              const Fp8BlockRowwise* rowwise,
                                              const Fp8BlockColwise* colwise, Fp8ScaleMode mode,
                                              Stream stream);

// AdamW (adamw_update.h) of an [E][k][n] fp32 weight (param, grad: 16-byte aligned; the moments
// fp32 or bf16, aligned to four elements) fused with its quantization into `out`: the same bits as
// the update followed by QuantizeFp8BlockWeights of the updated values rounded to bf16, in one pass
// (one block per 128x128 block). `step` is device memory (the step's scalars, computed on the
// device each step).
absl::Status AdamWQuantizeFp8BlockWeights(const Fp8BlockWeightShape& shape, const AdamWStep* step,
                                          const float* grad, float* param,
                                          const AdamWMoments& moments, const Fp8BlockWeights& out,
                                          Stream stream);

}  // namespace cuda
}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_FP8_BLOCK_H_
