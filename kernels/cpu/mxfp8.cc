// CPU reference of MXFP8 quantization and dequantization (layouts in mxfp8.h).
#include "dropless/kernels/mxfp8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "dropless/kernels/group_offsets.h"
#include "kernels/cpu/dequantize_rowwise.h"

namespace dropless::kernels {

void QuantizeMxBlock(const Bf16* v, int64_t stride, uint8_t* out, int64_t out_stride,
                     uint8_t* scale) {
  uint16_t amax = 0;
  for (int i = 0; i < kMxBlock; ++i) {
    amax = std::max<uint16_t>(amax, v[i * stride].bits & 0x7fffu);
  }
  const uint8_t b = E8M0ScaleForAmax(Bf16{amax});
  *scale = b;
  if (b == kE8M0Nan) {
    for (int i = 0; i < kMxBlock; ++i) out[i * out_stride] = kE4M3Nan;
    return;
  }
  // 1 / X = 2^(127 - b), a normal float for every b in [0, 246]; the product is exact.
  const float inverse_scale = std::ldexp(1.0f, 127 - static_cast<int>(b));
  for (int i = 0; i < kMxBlock; ++i) {
    out[i * out_stride] = FloatToE4M3(Bf16ToFloat(v[i * stride]) * inverse_scale);
  }
}

namespace cpu {
absl::Status QuantizeMxfp8(const MxQuantizeShape& shape, const Bf16* x,
                           const int32_t* group_offsets, const MxRowwise* rowwise,
                           const MxColwise* colwise) {
  if (absl::Status s = ValidateMxQuantize(shape, x, rowwise, colwise); !s.ok()) return s;
  absl::StatusOr<std::vector<int32_t>> host_offsets =
      HostGroupOffsets(group_offsets, shape.num_groups, shape.rows);
  if (!host_offsets.ok()) return host_offsets.status();
  const std::vector<int32_t>& offsets = *host_offsets;
  const int num_groups = shape.num_groups;
  const int64_t cols = shape.cols;
  const int64_t blocks_per_row = cols / kMxBlock;

  if (rowwise != nullptr) {
    for (int64_t r = 0; r < offsets[num_groups]; ++r) {
      for (int64_t j = 0; j < blocks_per_row; ++j) {
        QuantizeMxBlock(x + r * cols + j * kMxBlock, 1, rowwise->data + r * cols + j * kMxBlock, 1,
                        rowwise->scales + r * blocks_per_row + j);
      }
    }
  }
  if (colwise != nullptr) {
    int32_t padded_offset = 0;
    Bf16 block[kMxBlock];
    for (int g = 0; g < num_groups; ++g) {
      colwise->group_offsets[g] = padded_offset;
      const int64_t count = offsets[g + 1] - offsets[g];
      const int64_t padded_count = (count + kMxBlock - 1) / kMxBlock * kMxBlock;
      for (int64_t c = 0; c < cols; ++c) {
        for (int64_t b = 0; b < padded_count; b += kMxBlock) {
          for (int i = 0; i < kMxBlock; ++i) {
            const int64_t local = b + i;
            block[i] = local < count ? x[(offsets[g] + local) * cols + c] : Bf16{0};
          }
          const int64_t at = (padded_offset + b) / kMxBlock * cols + c;  // block row, column
          QuantizeMxBlock(block, 1, colwise->data + at * kMxBlock, 1, colwise->scales + at);
        }
      }
      padded_offset += static_cast<int32_t>(padded_count);
    }
    colwise->group_offsets[num_groups] = padded_offset;
  }
  return absl::OkStatus();
}

namespace {

template <typename Out>
absl::Status Dequantize(int64_t rows, int64_t cols, const int32_t* num_rows, const uint8_t* data,
                        const uint8_t* scales, Out* out) {
  return cpu_internal::DequantizeRowwise(rows, cols, kMxBlock, num_rows, data, scales, out,
                                         [](uint8_t e, uint8_t s) { return MxElementValue(e, s); });
}

}  // namespace

absl::Status DequantizeMxfp8Rowwise(int64_t rows, int64_t cols, const int32_t* num_rows,
                                    const uint8_t* data, const uint8_t* scales, float* out) {
  return Dequantize(rows, cols, num_rows, data, scales, out);
}

absl::Status DequantizeMxfp8Rowwise(int64_t rows, int64_t cols, const int32_t* num_rows,
                                    const uint8_t* data, const uint8_t* scales, Bf16* out) {
  return Dequantize(rows, cols, num_rows, data, scales, out);
}

absl::Status MxWeightImage(int64_t rows, int64_t cols, const uint8_t* data, const uint8_t* scales,
                           Bf16* image) {
  if (cols <= 0 || cols % 64 != 0) {
    return absl::InvalidArgumentError("cols: must be a positive multiple of 64");
  }
  std::vector<Bf16> plain(static_cast<size_t>(std::max<int64_t>(rows, 0) * cols));
  if (absl::Status s = Dequantize(rows, cols, nullptr, data, scales, plain.data()); !s.ok()) {
    return s;
  }
  if (rows > 0 && image == nullptr) return absl::InvalidArgumentError("image: must be set");
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t block = c / 64 * 64;
      image[r * cols + c] = plain[r * cols + block + MxImagePhysicalColumn(c % 64)];
    }
  }
  return absl::OkStatus();
}

absl::Status MxColwiseImage(int64_t cols, int num_groups, const MxColwise& colwise, Bf16* image) {
  if (absl::Status s = ValidateMxColwiseImage(cols, num_groups, colwise, image); !s.ok()) return s;
  const int64_t end = std::min<int64_t>(colwise.padded_rows,
                                        std::max(0, colwise.group_offsets[num_groups]));
  for (int64_t p = 0; p < end; ++p) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t block = (p / kMxBlock) * cols + c;
      image[p * cols + c] = FloatToBf16(
          MxElementValue(colwise.data[block * kMxBlock + p % kMxBlock], colwise.scales[block]));
    }
  }
  return absl::OkStatus();
}

absl::Status MxWeightImages(const MxWeightImagesShape& shape, const Bf16* w, Bf16* image_along_n,
                            Bf16* image_along_k) {
  const int64_t E = shape.experts, K = shape.k, N = shape.n;
  if (E < 0 || K <= 0 || K % 64 != 0 || N <= 0 || N % 64 != 0) {
    return absl::InvalidArgumentError("shape: experts >= 0, k and n positive multiples of 64");
  }
  // Along n: W as [E k][n] rows. Along k: W^T as [E n][k] rows.
  std::vector<Bf16> transposed(static_cast<size_t>(E * K * N));
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = 0; i < K; ++i) {
      for (int64_t j = 0; j < N; ++j) transposed[(e * N + j) * K + i] = w[(e * K + i) * N + j];
    }
  }
  const struct {
    const Bf16* in;
    int64_t rows, cols;
    Bf16* image;
  } views[2] = {{w, E * K, N, image_along_n}, {transposed.data(), E * N, K, image_along_k}};
  for (const auto& v : views) {
    std::vector<uint8_t> data(static_cast<size_t>(v.rows * v.cols)), scales(data.size() / kMxBlock);
    MxRowwise rowwise{data.data(), scales.data()};
    if (absl::Status s = QuantizeMxfp8({v.rows, v.cols, 1}, v.in, nullptr, &rowwise, nullptr);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = MxWeightImage(v.rows, v.cols, data.data(), scales.data(), v.image);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace cpu
}  // namespace dropless::kernels
