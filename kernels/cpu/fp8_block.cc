// CPU reference of fp8-block quantization and dequantization (format and layouts in fp8_block.h).
#include "dropless/kernels/fp8_block.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "dropless/kernels/group_offsets.h"
#include "kernels/cpu/dequantize_rowwise.h"
#include "dropless/kernels/mxfp8.h"

namespace dropless::kernels {

Fp8BlockScale Fp8BlockScaleForAmax(float amax, Fp8ScaleMode mode) {
  if (!std::isfinite(amax)) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    return {nan, nan};
  }
  const float a = std::max(amax, kFp8BlockMinAmax);
  if (mode == Fp8ScaleMode::kFloat32) {
    return {a / 448.0f, 448.0f / a};  // one fp32 rounding each, as the device's __fdiv_rn
  }
  // a = m * 2^ex with m in [0.5, 1) and 448 = 0.875 * 2^9: a <= 448 * 2^e holds first at
  // e = ex - 9 when m <= 0.875, at e = ex - 8 otherwise.
  int ex = 0;
  const float m = std::frexp(a, &ex);
  const int e = m <= 0.875f ? ex - 9 : ex - 8;
  return {std::ldexp(1.0f, e), std::ldexp(1.0f, -e)};
}

namespace {

// Largest magnitude of n values read at v[i * stride] (exact: bf16 values; NaN when one is NaN).
float BlockAmax(const Bf16* v, int64_t n, int64_t stride) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(Bf16ToFloat(v[i * stride]));
    if (std::isnan(a)) return a;
    amax = std::max(amax, a);
  }
  return amax;
}

uint8_t QuantizeElement(Bf16 v, const Fp8BlockScale& s) {
  if (std::isnan(s.scale)) return kE4M3Nan;
  return FloatToE4M3(Bf16ToFloat(v) * s.inverse);
}

}  // namespace

namespace cpu {

absl::Status QuantizeFp8Block(const Fp8BlockQuantizeShape& shape, const Bf16* x,
                              const int32_t* group_offsets, const Fp8BlockRowwise* rowwise,
                              const Fp8BlockColwise* colwise) {
  if (absl::Status s = ValidateFp8BlockQuantize(shape, x, rowwise, colwise); !s.ok()) return s;
  absl::StatusOr<std::vector<int32_t>> host_offsets =
      HostGroupOffsets(group_offsets, shape.num_groups, shape.rows);
  if (!host_offsets.ok()) return host_offsets.status();
  const std::vector<int32_t>& offsets = *host_offsets;
  const int num_groups = shape.num_groups;
  const int64_t cols = shape.cols;
  const int64_t tiles_per_row = cols / kFp8Block;

  if (rowwise != nullptr) {
    for (int64_t r = 0; r < offsets[num_groups]; ++r) {
      for (int64_t j = 0; j < tiles_per_row; ++j) {
        const Bf16* v = x + r * cols + j * kFp8Block;
        const Fp8BlockScale s = Fp8BlockScaleForAmax(BlockAmax(v, kFp8Block, 1), shape.mode);
        rowwise->scales[r * tiles_per_row + j] = s.scale;
        uint8_t* out = rowwise->data + r * cols + j * kFp8Block;
        for (int i = 0; i < kFp8Block; ++i) out[i] = QuantizeElement(v[i], s);
      }
    }
  }
  if (colwise != nullptr) {
    const int64_t p = colwise->padded_rows;
    const bool per_block = colwise->scaling == Fp8ColwiseScaling::kPerBlock;
    int32_t padded_offset = 0;
    for (int g = 0; g < num_groups; ++g) {
      colwise->group_offsets[g] = padded_offset;
      const int64_t count = offsets[g + 1] - offsets[g];
      const int64_t padded_count = (count + kFp8Block - 1) / kFp8Block * kFp8Block;
      for (int64_t b = 0; b < padded_count; b += kFp8Block) {
        const int64_t live = std::min<int64_t>(kFp8Block, count - b);
        const Bf16* first = x + (offsets[g] + b) * cols;
        const int64_t tile_row = (padded_offset + b) / kFp8Block;
        // kPerBlock: the largest magnitude of each 128-column block of the tile's live rows.
        std::vector<float> block_amax(per_block ? tiles_per_row : 0, 0.0f);
        for (int64_t c = 0; per_block && c < cols; ++c) {
          const float a = BlockAmax(first + c, live, cols);
          float& m = block_amax[c / kFp8Block];
          m = std::isnan(m) || std::isnan(a) ? std::numeric_limits<float>::quiet_NaN()
                                             : std::max(m, a);
        }
        for (int64_t c = 0; c < cols; ++c) {
          const float amax =
              per_block ? block_amax[c / kFp8Block] : BlockAmax(first + c, live, cols);
          const Fp8BlockScale s = Fp8BlockScaleForAmax(amax, shape.mode);
          if (!per_block) {
            colwise->scales[tile_row * cols + c] = s.scale;
          } else if (c % kFp8Block == 0) {
            colwise->scales[tile_row * tiles_per_row + c / kFp8Block] = s.scale;
          }
          uint8_t* out = colwise->data + c * p + padded_offset + b;
          for (int64_t i = 0; i < kFp8Block; ++i) {
            out[i] = i < live ? QuantizeElement(first[i * cols + c], s)
                              : (std::isnan(s.scale) ? kE4M3Nan : uint8_t{0});
          }
        }
      }
      padded_offset += static_cast<int32_t>(padded_count);
    }
    colwise->group_offsets[num_groups] = padded_offset;
  }
  return absl::OkStatus();
}

absl::Status QuantizeFp8BlockWeights(const Fp8BlockWeightShape& shape, const Bf16* w,
                                     const Fp8BlockWeights& out) {
  if (absl::Status s = ValidateFp8BlockWeights(shape, w, out); !s.ok()) return s;
  const int64_t k = shape.k, n = shape.n;
  const int64_t kb = k / kFp8Block, nb = n / kFp8Block;
  for (int e = 0; e < shape.num_experts; ++e) {
    const Bf16* we = w + e * k * n;
    for (int64_t i = 0; i < kb; ++i) {
      for (int64_t j = 0; j < nb; ++j) {
        float amax = 0;
        for (int64_t r = 0; r < kFp8Block && !std::isnan(amax); ++r) {
          const float row_amax = BlockAmax(we + (i * kFp8Block + r) * n + j * kFp8Block, kFp8Block, 1);
          amax = std::isnan(row_amax) ? row_amax : std::max(amax, row_amax);
        }
        const Fp8BlockScale s = Fp8BlockScaleForAmax(amax, shape.mode);
        if (out.scales != nullptr) out.scales[(e * kb + i) * nb + j] = s.scale;
        if (out.scales_t != nullptr) out.scales_t[(e * nb + j) * kb + i] = s.scale;
        for (int64_t r = i * kFp8Block; r < (i + 1) * kFp8Block; ++r) {
          for (int64_t c = j * kFp8Block; c < (j + 1) * kFp8Block; ++c) {
            const uint8_t q = QuantizeElement(we[r * n + c], s);
            if (out.data != nullptr) out.data[(e * k + r) * n + c] = q;
            if (out.data_t != nullptr) out.data_t[(e * n + c) * k + r] = q;
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

namespace {

template <typename Out>
absl::Status Dequantize(int64_t rows, int64_t cols, const int32_t* num_rows, const uint8_t* data,
                        const float* scales, Out* out) {
  return cpu_internal::DequantizeRowwise(rows, cols, kFp8Block, num_rows, data, scales, out,
                                         [](uint8_t e, float s) { return E4M3ToFloat(e) * s; });
}

}  // namespace

absl::Status DequantizeFp8BlockRowwise(int64_t rows, int64_t cols, const int32_t* num_rows,
                                       const uint8_t* data, const float* scales, float* out) {
  return Dequantize(rows, cols, num_rows, data, scales, out);
}

absl::Status DequantizeFp8BlockRowwise(int64_t rows, int64_t cols, const int32_t* num_rows,
                                       const uint8_t* data, const float* scales, Bf16* out) {
  return Dequantize(rows, cols, num_rows, data, scales, out);
}

absl::Status PermuteFp8Block(const PermuteShape& shape, const Bf16* x,
                             const int32_t* slot_of_choice, const Fp8BlockRowwise& rows,
                             Fp8ScaleMode mode) {
  if (absl::Status s = ValidatePermuteShape(shape, /*mxfp8=*/false); !s.ok()) return s;
  const int64_t hidden = shape.hidden, tiles = hidden / kFp8Block;
  if (hidden % kFp8Block != 0) {
    return absl::InvalidArgumentError("hidden: must be a multiple of 128 for fp8-block");
  }
  if (shape.num_tokens > 0 &&
      (x == nullptr || slot_of_choice == nullptr || rows.data == nullptr || rows.scales == nullptr)) {
    return absl::InvalidArgumentError("x: x, slot_of_choice and rows must be set");
  }
  std::vector<uint8_t> data(hidden);
  std::vector<float> scales(tiles);
  Fp8BlockRowwise token{data.data(), scales.data()};
  for (int64_t t = 0; t < shape.num_tokens; ++t) {
    if (absl::Status s = QuantizeFp8Block({1, hidden, 1, mode}, x + t * hidden, nullptr, &token,
                                          nullptr);
        !s.ok()) {
      return s;
    }
    for (int j = 0; j < shape.top_k; ++j) {
      const int64_t slot = slot_of_choice[t * shape.top_k + j];
      if (slot < 0) continue;
      std::copy(data.begin(), data.end(), rows.data + slot * hidden);
      std::copy(scales.begin(), scales.end(), rows.scales + slot * tiles);
    }
  }
  return absl::OkStatus();
}

}  // namespace cpu
}  // namespace dropless::kernels
