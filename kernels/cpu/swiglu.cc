// CPU reference of SwiGLU (swiglu.h), in the same fp32 formulas as the CUDA kernels (in fp64 for
// double).
#include "dropless/kernels/swiglu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/status/status.h"

namespace dropless::kernels::cpu {
namespace {

int64_t LiveRows(const SwigluShape& shape, const int32_t* num_rows) {
  if (num_rows == nullptr) return shape.rows;
  return std::min<int64_t>(shape.rows, std::max<int32_t>(0, *num_rows));
}

}  // namespace

template <typename T>
absl::Status SwigluForward(const SwigluShape& shape, const int32_t* num_rows, const T* h,
                           std::common_type_t<T>* out, const MxRowwise* out_mx) {
  using M = MathOf<T>;
  if (absl::Status s = ValidateSwigluShape(shape, out_mx != nullptr, kIsCudaStorage<T>); !s.ok()) {
    return s;
  }
  if (out == nullptr && out_mx == nullptr) {
    return absl::InvalidArgumentError("out: and out_mx are both null: nothing to produce");
  }
  if (out_mx != nullptr && !kIsCudaStorage<T>) {
    return absl::InvalidArgumentError("out_mx: MXFP8 output needs bf16 input");
  }
  if (out_mx != nullptr && (out_mx->data == nullptr || out_mx->scales == nullptr)) {
    return absl::InvalidArgumentError("out_mx: data and scales must be set");
  }
  const int64_t rows = LiveRows(shape, num_rows);
  if (rows > 0 && h == nullptr) return absl::InvalidArgumentError("h: is null");
  const int64_t ffn = shape.ffn;
  std::vector<T> row_out(ffn);
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = h + r * 2 * ffn;
    const T* up = gate + ffn;
    for (int64_t c = 0; c < ffn; ++c) {
      const M g = ToMath(gate[c]);
      const M silu = g / (M(1) + std::exp(-g));
      row_out[c] = FromMath<T>(silu * ToMath(up[c]));
    }
    if (out != nullptr) std::copy(row_out.begin(), row_out.end(), out + r * ffn);
    if constexpr (kIsCudaStorage<T>) {
      if (out_mx != nullptr) {
        for (int64_t b = 0; b < ffn / kMxBlock; ++b) {
          QuantizeMxBlock(row_out.data() + b * kMxBlock, 1, out_mx->data + r * ffn + b * kMxBlock,
                          1, out_mx->scales + r * (ffn / kMxBlock) + b);
        }
      }
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status SwigluBackward(const SwigluShape& shape, const int32_t* num_rows, const T* h,
                            const T* d_out, T* d_h) {
  using M = MathOf<T>;
  if (absl::Status s = ValidateSwigluShape(shape, false, kIsCudaStorage<T>); !s.ok()) return s;
  const int64_t rows = LiveRows(shape, num_rows);
  if (rows > 0 && (h == nullptr || d_out == nullptr || d_h == nullptr)) {
    return absl::InvalidArgumentError("h, d_out and d_h must be set");
  }
  const int64_t ffn = shape.ffn;
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = h + r * 2 * ffn;
    const T* up = gate + ffn;
    T* d_gate = d_h + r * 2 * ffn;
    T* d_up = d_gate + ffn;
    for (int64_t c = 0; c < ffn; ++c) {
      const M g = ToMath(gate[c]);
      const M u = ToMath(up[c]);
      const M dy = ToMath(d_out[r * ffn + c]);
      const M s = M(1) / (M(1) + std::exp(-g));
      d_gate[c] = FromMath<T>(dy * u * s * (M(1) + g * (M(1) - s)));
      d_up[c] = FromMath<T>(dy * g * s);
    }
  }
  return absl::OkStatus();
}

#define DROPLESS_INSTANTIATE_SWIGLU(T)                                                            \
  template absl::Status SwigluForward<T>(const SwigluShape&, const int32_t*, const T*, T*,        \
                                         const MxRowwise*);                                       \
  template absl::Status SwigluBackward<T>(const SwigluShape&, const int32_t*, const T*, const T*, \
                                          T*);
DROPLESS_INSTANTIATE_SWIGLU(Bf16)
DROPLESS_INSTANTIATE_SWIGLU(float)
DROPLESS_INSTANTIATE_SWIGLU(double)
#undef DROPLESS_INSTANTIATE_SWIGLU

}  // namespace dropless::kernels::cpu
