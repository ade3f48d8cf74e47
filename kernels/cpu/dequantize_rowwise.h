// The CPU references' row-wise dequantization (MXFP8 in mxfp8.cc, fp8-block in fp8_block.cc): the
// live rows of an E4M3 [rows][cols] buffer, scaled per `block` consecutive elements of a row, to
// float or bf16. `value_of(element, scale)` is the format's element value. Internal to
// dropless_kernels_cpu.
#ifndef DROPLESS_KERNELS_CPU_DEQUANTIZE_ROWWISE_H_
#define DROPLESS_KERNELS_CPU_DEQUANTIZE_ROWWISE_H_

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "dropless/kernels/cpu_types.h"

namespace dropless::kernels::cpu_internal {

template <typename Scale, typename Out, typename ValueOf>
absl::Status DequantizeRowwise(int64_t rows, int64_t cols, int block, const int32_t* num_rows,
                               const uint8_t* data, const Scale* scales, Out* out,
                               ValueOf value_of) {
  if (rows < 0) return absl::InvalidArgumentError("rows: must be >= 0");
  if (cols <= 0 || cols % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cols: must be a positive multiple of ", block));
  }
  if ((data == nullptr || scales == nullptr || out == nullptr) && rows > 0) {
    return absl::InvalidArgumentError("data: data, scales and out must be set");
  }
  const int64_t live = num_rows == nullptr ? rows : std::min<int64_t>(rows, std::max(0, *num_rows));
  for (int64_t r = 0; r < live; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float v = value_of(data[r * cols + c], scales[r * (cols / block) + c / block]);
      if constexpr (std::is_same_v<Out, float>) {
        out[r * cols + c] = v;
      } else {
        out[r * cols + c] = FloatToBf16(v);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace dropless::kernels::cpu_internal

#endif  // DROPLESS_KERNELS_CPU_DEQUANTIZE_ROWWISE_H_
