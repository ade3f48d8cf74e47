// The bf16-core MXFP8 GEMM's operand images (mxfp8.h): the weight image of a row-wise operand, the
// column-wise image, and both weight images of a bf16 weight from one read. The element
// conversion is mx_bf16.cuh's.
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "dropless/kernels/mxfp8.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/mx_bf16.cuh"

namespace dropless::kernels::cuda {
namespace {

// 16 E4M3 bytes at physical columns 16 q .. 16 q + 15 of a run of 64 (one scale) as exact bf16 at
// their image positions 16 j + {2q, 2q+1} and 16 j + {2q+8, 2q+9}, j = 0..3
// (MxImagePhysicalColumn); run: the image's 64 positions (32 words).
__device__ __forceinline__ void StoreImageQuarter(uint4 x, const mxbf16::Factors& f, int q,
                                                  uint32_t* run) {
  const uint32_t words[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    run[8 * j + q] = mxbf16::E4m3PairToBf16<false>(words[j], f);
    run[8 * j + q + 4] = mxbf16::E4m3PairToBf16<true>(words[j], f);
  }
}

// One thread per 16 bytes of a row.
__global__ void __launch_bounds__(256)
    WeightImageKernel(const uint4* __restrict__ data, const uint8_t* __restrict__ scales,
                      int64_t rows, int64_t cols, uint32_t* __restrict__ image) {
  const int64_t chunks = cols / 16, total = rows * chunks;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / chunks, c16 = i % chunks;
    StoreImageQuarter(data[i], mxbf16::FactorsOf(scales[r * (cols / 32) + c16 / 2]),
                      static_cast<int>(c16 % 4), image + (r * cols + (c16 / 4) * 64) / 2);
  }
}

// Both images of a bf16 weight [E][k][n] from one read, one 64 x 64 tile per CTA (256 threads):
// along n, thread t quantizes 16 consecutive n of tile row t / 4 (two lanes per MX block,
// QuantizeMxPair: the row-wise quantizer's arithmetic) into image_along_n; along k, 16 consecutive
// k of tile column t / 4, read from shared memory, into image_along_k ([E][n][k]).
constexpr int kImageTile = 64;
__global__ void __launch_bounds__(256)
    WeightImagesKernel(const uint4* __restrict__ w, int64_t k, int64_t n,
                       uint32_t* __restrict__ image_n, uint32_t* __restrict__ image_k) {
  __shared__ uint16_t tile[kImageTile][kImageTile + 8];  // 144-byte rows: column reads spread
  const int64_t k_tiles = k / kImageTile, n_tiles = n / kImageTile;
  const int64_t e = blockIdx.x / (k_tiles * n_tiles), rest = blockIdx.x % (k_tiles * n_tiles);
  const int64_t k0 = (rest / n_tiles) * kImageTile, n0 = (rest % n_tiles) * kImageTile;
  const int t = threadIdx.x, r = t / 4, q = t % 4;
  {
    const int64_t row = e * k + k0 + r;  // element (row, n0 + 16 q) of the [E k][n] view
    const uint4* src = w + (row * n + n0 + 16 * q) / 8;
    const uint4 a = src[0], b = src[1];
    *reinterpret_cast<uint4*>(&tile[r][16 * q]) = a;
    *reinterpret_cast<uint4*>(&tile[r][16 * q + 8]) = b;
    const detail::MxPair p = detail::QuantizeMxPair(a, b);
    StoreImageQuarter(p.data, mxbf16::FactorsOf(p.scale), q, image_n + (row * n + n0) / 2);
  }
  __syncthreads();
  {
    uint32_t col[8];  // tile column r, rows 16 q .. 16 q + 15, as bf16 pairs
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      col[i] = tile[16 * q + 2 * i][r] | (static_cast<uint32_t>(tile[16 * q + 2 * i + 1][r]) << 16);
    }
    const detail::MxPair p = detail::QuantizeMxPair(make_uint4(col[0], col[1], col[2], col[3]),
                                                    make_uint4(col[4], col[5], col[6], col[7]));
    const int64_t row = e * n + n0 + r;  // row of the [E n][k] image
    StoreImageQuarter(p.data, mxbf16::FactorsOf(p.scale), q, image_k + (row * k + k0) / 2);
  }
}

// One thread per (block row j, column pair c, c + 1): their 2 x 32 bytes and two scales, written
// as bf16x2 to rows 32 j .. 32 j + 31 (a warp covers 64 columns: 128-byte row segments).
__global__ void __launch_bounds__(256)
    ColwiseImageKernel(const uint4* __restrict__ data, const uint8_t* __restrict__ scales,
                       const int32_t* __restrict__ padded_offsets, int num_groups, int64_t padded,
                       int64_t cols, uint32_t* __restrict__ image) {
  const int64_t end = min(padded, static_cast<int64_t>(max(0, padded_offsets[num_groups])));
  const int64_t pairs = cols / 2, total = (end / kMxBlock) * pairs;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i / pairs, c = 2 * (i % pairs);
    const int64_t block = j * cols + c;  // column c's block; column c + 1's follows
    const uint4 a0 = data[2 * block], a1 = data[2 * block + 1];
    const uint4 b0 = data[2 * block + 2], b1 = data[2 * block + 3];
    const uint32_t wa[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const uint32_t wb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
    const mxbf16::Factors fa = mxbf16::FactorsOf(scales[block]);
    const mxbf16::Factors fb = mxbf16::FactorsOf(scales[block + 1]);
    const mxbf16::Factors f{(fa.first & 0xFFFFu) | (fb.first & 0xFFFF0000u),
                            (fa.second & 0xFFFFu) | (fb.second & 0xFFFF0000u), fa.twice || fb.twice};
    uint32_t* out = image + (j * kMxBlock * cols + c) / 2;
#pragma unroll
    for (int r = 0; r < kMxBlock; ++r) {
      uint32_t x;  // byte r of column c in byte 0, of column c + 1 in byte 1
      asm("prmt.b32 %0, %1, %2, %3;"
          : "=r"(x)
          : "r"(wa[r / 4]), "r"(wb[r / 4]), "r"((r % 4) | ((4 + r % 4) << 4)));
      out[r * cols / 2] = mxbf16::E4m3PairToBf16<false>(x, f);
    }
  }
}

}  // namespace

absl::Status MxWeightImage(int64_t rows, int64_t cols, const uint8_t* data, const uint8_t* scales,
                           Bf16* image, Stream stream) {
  if (rows < 0) return absl::InvalidArgumentError("rows: must be >= 0");
  if (cols <= 0 || cols % 64 != 0) {
    return absl::InvalidArgumentError("cols: must be a positive multiple of 64");
  }
  if (rows == 0) return absl::OkStatus();
  if (data == nullptr || scales == nullptr || image == nullptr) {
    return absl::InvalidArgumentError("data: data, scales and image must be set");
  }
  if (reinterpret_cast<uintptr_t>(data) % 16 != 0) {
    return absl::InvalidArgumentError("data: must be 16-byte aligned");
  }
  WeightImageKernel<<<GridStrideBlocks(rows * cols / 16, 256), 256, 0, stream>>>(
      reinterpret_cast<const uint4*>(data), scales, rows, cols, reinterpret_cast<uint32_t*>(image));
  return LaunchStatus("WeightImageKernel");
}

absl::Status MxColwiseImage(int64_t cols, int num_groups, const MxColwise& colwise, Bf16* image,
                            Stream stream) {
  if (absl::Status s = ValidateMxColwiseImage(cols, num_groups, colwise, image); !s.ok()) return s;
  if (reinterpret_cast<uintptr_t>(colwise.data) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(image) % 4 != 0) {
    return absl::InvalidArgumentError("colwise.data: must be 16-byte aligned (image 4-byte)");
  }
  if (colwise.padded_rows <= 0) return absl::OkStatus();
  ColwiseImageKernel<<<GridStrideBlocks(colwise.padded_rows / kMxBlock * (cols / 2), 256), 256, 0,
                       stream>>>(reinterpret_cast<const uint4*>(colwise.data), colwise.scales,
                                 colwise.group_offsets, num_groups, colwise.padded_rows, cols,
                                 reinterpret_cast<uint32_t*>(image));
  return LaunchStatus("ColwiseImageKernel");
}

absl::Status MxWeightImages(const MxWeightImagesShape& shape, const Bf16* w, Bf16* image_along_n,
                            Bf16* image_along_k, Stream stream) {
  if (shape.experts < 0) return absl::InvalidArgumentError("experts: must be >= 0");
  if (shape.k <= 0 || shape.k % kImageTile != 0) {
    return absl::InvalidArgumentError("k: must be a positive multiple of 64");
  }
  if (shape.n <= 0 || shape.n % kImageTile != 0) {
    return absl::InvalidArgumentError("n: must be a positive multiple of 64");
  }
  if (shape.experts == 0) return absl::OkStatus();
  if (w == nullptr || image_along_n == nullptr || image_along_k == nullptr) {
    return absl::InvalidArgumentError("w: w, image_along_n and image_along_k must be set");
  }
  if (reinterpret_cast<uintptr_t>(w) % 16 != 0) {
    return absl::InvalidArgumentError("w: must be 16-byte aligned");
  }
  const int64_t tiles = shape.experts * (shape.k / kImageTile) * (shape.n / kImageTile);
  if (tiles >= (int64_t{1} << 31)) return absl::InvalidArgumentError("experts: too many tiles");
  WeightImagesKernel<<<static_cast<int>(tiles), 256, 0, stream>>>(
      reinterpret_cast<const uint4*>(w), shape.k, shape.n,
      reinterpret_cast<uint32_t*>(image_along_n), reinterpret_cast<uint32_t*>(image_along_k));
  return LaunchStatus("WeightImagesKernel");
}

}  // namespace dropless::kernels::cuda
