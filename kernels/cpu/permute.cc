// CPU reference of permute / unpermute (permute.h). fp32 fused multiply-adds in choice order, as the
// CUDA kernels, so the bf16 outputs agree bit for bit.
#include "dropless/kernels/permute.h"

#include <cmath>
#include <vector>

#include "absl/status/status.h"

namespace dropless::kernels::cpu {
namespace {

absl::Status Check(const PermuteShape& shape, bool mxfp8, std::initializer_list<const void*> ptrs) {
  if (absl::Status s = ValidatePermuteShape(shape, mxfp8); !s.ok()) return s;
  if (shape.num_tokens == 0) return absl::OkStatus();
  for (const void* p : ptrs) {
    if (p == nullptr) return absl::InvalidArgumentError("permute: a required buffer is null");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Permute(const PermuteShape& shape, const Bf16* x, const int32_t* slot_of_choice,
                     Bf16* rows) {
  if (absl::Status s = Check(shape, false, {x, slot_of_choice, rows}); !s.ok()) return s;
  const int64_t hidden = shape.hidden;
  for (int64_t t = 0; t < shape.num_tokens; ++t) {
    for (int j = 0; j < shape.top_k; ++j) {
      const int32_t slot = slot_of_choice[t * shape.top_k + j];
      if (slot < 0) continue;
      std::copy(x + t * hidden, x + (t + 1) * hidden, rows + static_cast<int64_t>(slot) * hidden);
    }
  }
  return absl::OkStatus();
}

absl::Status PermuteMxfp8(const PermuteShape& shape, const Bf16* x, const int32_t* slot_of_choice,
                          const MxRowwise& rows) {
  if (absl::Status s = Check(shape, true, {x, slot_of_choice, rows.data, rows.scales}); !s.ok()) {
    return s;
  }
  const int64_t hidden = shape.hidden;
  const int64_t blocks = hidden / kMxBlock;
  std::vector<uint8_t> data(hidden);
  std::vector<uint8_t> scales(blocks);
  for (int64_t t = 0; t < shape.num_tokens; ++t) {
    for (int64_t b = 0; b < blocks; ++b) {
      QuantizeMxBlock(x + t * hidden + b * kMxBlock, 1, data.data() + b * kMxBlock, 1,
                      scales.data() + b);
    }
    for (int j = 0; j < shape.top_k; ++j) {
      const int64_t slot = slot_of_choice[t * shape.top_k + j];
      if (slot < 0) continue;
      std::copy(data.begin(), data.end(), rows.data + slot * hidden);
      std::copy(scales.begin(), scales.end(), rows.scales + slot * blocks);
    }
  }
  return absl::OkStatus();
}

absl::Status PermuteBackward(const PermuteShape& shape, const Bf16* d_rows,
                             const int32_t* slot_of_choice, Bf16* d_x) {
  return UnpermuteCombine(shape, d_rows, slot_of_choice, nullptr, d_x);
}

// weights == nullptr means weight 1 (PermuteBackward): fma(1, v, acc) == acc + v exactly.
absl::Status UnpermuteCombine(const PermuteShape& shape, const Bf16* rows,
                              const int32_t* slot_of_choice, const float* weights, Bf16* y) {
  if (absl::Status s = Check(shape, false, {rows, slot_of_choice, y}); !s.ok()) return s;
  const int64_t hidden = shape.hidden;
  std::vector<float> acc(hidden);
  for (int64_t t = 0; t < shape.num_tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int j = 0; j < shape.top_k; ++j) {
      const int64_t slot = slot_of_choice[t * shape.top_k + j];
      if (slot < 0) continue;
      const float w = weights == nullptr ? 1.0f : weights[t * shape.top_k + j];
      const Bf16* row = rows + slot * hidden;
      for (int64_t h = 0; h < hidden; ++h) acc[h] = std::fmaf(w, Bf16ToFloat(row[h]), acc[h]);
    }
    for (int64_t h = 0; h < hidden; ++h) y[t * hidden + h] = FloatToBf16(acc[h]);
  }
  return absl::OkStatus();
}

absl::Status UnpermuteCombineBackward(const PermuteShape& shape, const Bf16* d_y, const Bf16* rows,
                                      const int32_t* slot_of_choice, const float* weights,
                                      Bf16* d_rows, float* d_weights) {
  if (absl::Status s =
          Check(shape, false, {d_y, rows, slot_of_choice, weights, d_rows, d_weights});
      !s.ok()) {
    return s;
  }
  const int64_t hidden = shape.hidden;
  for (int64_t t = 0; t < shape.num_tokens; ++t) {
    const Bf16* dy = d_y + t * hidden;
    for (int j = 0; j < shape.top_k; ++j) {
      const int64_t choice = t * shape.top_k + j;
      const int64_t slot = slot_of_choice[choice];
      if (slot < 0) {
        d_weights[choice] = 0.0f;
        continue;
      }
      const float w = weights[choice];
      const Bf16* row = rows + slot * hidden;
      Bf16* d_row = d_rows + slot * hidden;
      double dot = 0;
      for (int64_t h = 0; h < hidden; ++h) {
        const float g = Bf16ToFloat(dy[h]);
        d_row[h] = FloatToBf16(w * g);
        dot += static_cast<double>(g) * Bf16ToFloat(row[h]);
      }
      d_weights[choice] = static_cast<float>(dot);
    }
  }
  return absl::OkStatus();
}

}  // namespace dropless::kernels::cpu
