// Permute (tokens -> expert-contiguous rows) and unpermute + weighted combine (rows -> tokens),
// with their backward passes. The slot map is the dispatch plan's slot_of_choice [T][k] (see
// dispatch_plan.h); permuted buffers have T*k rows of H elements, row s = slot s.
//
//   Permute                 rows[slot(t,j)]   = x[t]                              bf16
//   PermuteMxfp8            the same rows quantized to row-wise MXFP8 (mxfp8.h): each token is
//                           quantized once and its bytes copied to its k slots
//   PermuteBackward         d_x[t]            = sum_j d_rows[slot(t,j)]
//   UnpermuteCombine        y[t]              = sum_j w[t][j] * rows[slot(t,j)]
//   UnpermuteCombineBackward
//                           d_rows[slot(t,j)] = w[t][j] * d_y[t]                 bf16
//                           d_w[t][j]         = <d_y[t], rows[slot(t,j)]>         fp32
//
// Arithmetic: fp32, summing j = 0, 1, ..., k-1 in order with fused multiply-adds
// (acc = fma(w, v, acc)), one rounding to bf16 at the end. The CPU reference does exactly that, so
// Permute, PermuteMxfp8, PermuteBackward, UnpermuteCombine and the d_rows of the backward match bit
// for bit; d_w is a dot product of H terms whose order differs (relative error ~1e-6).
//
// Each kernel reads every token row once and every permuted row once: permute scatters (a token's
// row is loaded once and stored k times), unpermute gathers. H is a multiple of 8 (16-byte rows
// chunks), and of 32 for PermuteMxfp8. A slot of -1 (a choice the plan dropped) is skipped: it is
// neither written nor read (it contributes 0). The CUDA UnpermuteCombineBackward takes a null
// d_rows (the weight gradients only): fp8_block.h's UnpermuteCombineBackwardFp8Block then writes
// d_rows' fp8-block forms.
#ifndef DROPLESS_KERNELS_PERMUTE_H_
#define DROPLESS_KERNELS_PERMUTE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "dropless/kernels/cpu_types.h"
#include "dropless/kernels/mxfp8.h"
#include "dropless/kernels/types.h"

namespace dropless::kernels {

struct PermuteShape {
  int64_t num_tokens = 0;  // T
  int64_t hidden = 0;      // H
  int top_k = 0;           // k, 1..16
};

// cuda_rows: H must be a multiple of 8 (of 32 with mxfp8), as the CUDA kernels' 16-byte row
// chunks need; the CPU references over float and double (cpu_types.h) take any H.
absl::Status ValidatePermuteShape(const PermuteShape& shape, bool mxfp8, bool cuda_rows = true);

namespace cpu {

// T is Bf16, float or double (cpu_types.h); weights and d_weights are MathOf<T> (fp32 for bf16).
// For float and double the arithmetic is the same fused multiply-adds in T, with no rounding to
// bf16. The CPU engine uses these (worker/engine/cpu/moe_layer.cc).
template <typename T>
absl::Status Permute(const PermuteShape& shape, const T* x, const int32_t* slot_of_choice, T* rows);
absl::Status PermuteMxfp8(const PermuteShape& shape, const Bf16* x, const int32_t* slot_of_choice,
                          const MxRowwise& rows);
template <typename T>
absl::Status PermuteBackward(const PermuteShape& shape, const T* d_rows,
                             const int32_t* slot_of_choice, T* d_x);
template <typename T>
absl::Status UnpermuteCombine(const PermuteShape& shape, const T* rows,
                              const int32_t* slot_of_choice, const MathOf<T>* weights, T* y);
template <typename T>
absl::Status UnpermuteCombineBackward(const PermuteShape& shape, const T* d_y, const T* rows,
                                      const int32_t* slot_of_choice, const MathOf<T>* weights,
                                      T* d_rows, MathOf<T>* d_weights);

}  // namespace cpu

namespace cuda {

absl::Status Permute(const PermuteShape& shape, const Bf16* x, const int32_t* slot_of_choice,
                     Bf16* rows, Stream stream);
absl::Status PermuteMxfp8(const PermuteShape& shape, const Bf16* x, const int32_t* slot_of_choice,
                          const MxRowwise& rows, Stream stream);
absl::Status PermuteBackward(const PermuteShape& shape, const Bf16* d_rows,
                             const int32_t* slot_of_choice, Bf16* d_x, Stream stream);
absl::Status UnpermuteCombine(const PermuteShape& shape, const Bf16* rows,
                              const int32_t* slot_of_choice, const float* weights, Bf16* y,
                              Stream stream);
absl::Status UnpermuteCombineBackward(const PermuteShape& shape, const Bf16* d_y, const Bf16* rows,
                                      const int32_t* slot_of_choice, const float* weights,
                                      Bf16* d_rows, float* d_weights, Stream stream);

}  // namespace cuda
}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_PERMUTE_H_
