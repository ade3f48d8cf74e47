// CPU reference of SwiGLU (swiglu.h), in the same fp32 formulas as the CUDA kernels.
#include "dropless/kernels/swiglu.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"

namespace dropless::kernels::cpu {
namespace {

int64_t LiveRows(const SwigluShape& shape, const int32_t* num_rows) {
  if (num_rows == nullptr) return shape.rows;
  return std::min<int64_t>(shape.rows, std::max<int32_t>(0, *num_rows));
}

}  // namespace

absl::Status SwigluForward(const SwigluShape& shape, const int32_t* num_rows, const Bf16* h,
                           Bf16* out, const MxRowwise* out_mx) {
  if (absl::Status s = ValidateSwigluShape(shape, out_mx != nullptr); !s.ok()) return s;
  if (out == nullptr && out_mx == nullptr) {
    return absl::InvalidArgumentError("out: and out_mx are both null: nothing to produce");
  }
  if (out_mx != nullptr && (out_mx->data == nullptr || out_mx->scales == nullptr)) {
    return absl::InvalidArgumentError("out_mx: data and scales must be set");
  }
  const int64_t rows = LiveRows(shape, num_rows);
  if (rows > 0 && h == nullptr) return absl::InvalidArgumentError("h: is null");
  const int64_t ffn = shape.ffn;
  std::vector<Bf16> row_out(ffn);
  for (int64_t r = 0; r < rows; ++r) {
    const Bf16* gate = h + r * 2 * ffn;
    const Bf16* up = gate + ffn;
    for (int64_t c = 0; c < ffn; ++c) {
      const float g = Bf16ToFloat(gate[c]);
      const float silu = g / (1.0f + std::exp(-g));
      row_out[c] = FloatToBf16(silu * Bf16ToFloat(up[c]));
    }
    if (out != nullptr) std::copy(row_out.begin(), row_out.end(), out + r * ffn);
    if (out_mx != nullptr) {
      for (int64_t b = 0; b < ffn / kMxBlock; ++b) {
        QuantizeMxBlock(row_out.data() + b * kMxBlock, 1, out_mx->data + r * ffn + b * kMxBlock, 1,
                        out_mx->scales + r * (ffn / kMxBlock) + b);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status SwigluBackward(const SwigluShape& shape, const int32_t* num_rows, const Bf16* h,
                            const Bf16* d_out, Bf16* d_h) {
  if (absl::Status s = ValidateSwigluShape(shape, false); !s.ok()) return s;
  const int64_t rows = LiveRows(shape, num_rows);
  if (rows > 0 && (h == nullptr || d_out == nullptr || d_h == nullptr)) {
    return absl::InvalidArgumentError("h, d_out and d_h must be set");
  }
  const int64_t ffn = shape.ffn;
  for (int64_t r = 0; r < rows; ++r) {
    const Bf16* gate = h + r * 2 * ffn;
    const Bf16* up = gate + ffn;
    Bf16* d_gate = d_h + r * 2 * ffn;
    Bf16* d_up = d_gate + ffn;
    for (int64_t c = 0; c < ffn; ++c) {
      const float g = Bf16ToFloat(gate[c]);
      const float u = Bf16ToFloat(up[c]);
      const float dy = Bf16ToFloat(d_out[r * ffn + c]);
      const float s = 1.0f / (1.0f + std::exp(-g));
      d_gate[c] = FloatToBf16(dy * u * s * (1.0f + g * (1.0f - s)));
      d_up[c] = FloatToBf16(dy * g * s);
    }
  }
  return absl::OkStatus();
}

}  // namespace dropless::kernels::cpu
