// Host side of the fp8-block grouped-GEMM GPU test (fp8_block_grouped_gemm_test.cc): operands
// built by hand in the layouts of fp8_block.h (random E4M3 bytes without NaN codes, random positive
// fp32 scales), their fp64 references (the dequantized operands' products) and the untouched-rows
// check; the comparison with a reference is gemm_test_util.h's ExpectClose. Header-only, included
// by that test alone.
#ifndef DROPLESS_TESTS_GPU_GEMM_FP8_BLOCK_GEMM_REFERENCE_H_
#define DROPLESS_TESTS_GPU_GEMM_FP8_BLOCK_GEMM_REFERENCE_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "dropless/kernels/fp8_block.h"
#include "dropless/kernels/mxfp8.h"  // E4M3ToFloat, kE4M3Nan
#include "tests/gpu/gemm/gemm_test_util.h"

namespace dropless::kernels::fp8_block_gemm_test {

constexpr int kB = kFp8Block;
constexpr double kBf16Rel = 1e-2, kBf16Abs = 2e-3, kBf16Norm = 1e-2;
constexpr double kF32Rel = 1e-5, kF32Abs = 2e-3, kF32Norm = 1e-3;
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

inline std::mt19937_64 Rng(uint64_t salt) {
  return std::mt19937_64(salt ^ (gemm_test::RunSeed() * 0x9E3779B97F4A7C15ull));
}

// Any E4M3 byte but the NaN codes 0x7F / 0xFF.
inline uint8_t RandomE4m3(std::mt19937_64* rng) {
  uint8_t b = static_cast<uint8_t>((*rng)() & 0xFF);
  return (b & 0x7F) == 0x7F ? static_cast<uint8_t>(b ^ 1) : b;
}

// A positive fp32 scale in [2^-10, 2): mantissa and exponent both random.
inline float RandomScale(std::mt19937_64* rng) {
  std::uniform_real_distribution<float> u(1.0f, 2.0f);
  std::uniform_int_distribution<int> e(-10, 0);
  return std::ldexp(u(*rng), e(*rng));
}

using gemm_test::ExpectClose;
using gemm_test::Offsets;
using gemm_test::MGroupedReference;
using gemm_test::Ref;

// Row-wise [rows][cols] (fp8_block.h): data, scales [rows][cols / 128], dequantized values.
struct RowwiseHost {
  std::vector<uint8_t> data;
  std::vector<float> scales;
  std::vector<double> values;
};

// Rows [0, valid_rows) random; the rows past them hold NaN codes and NaN scales (never read).
inline RowwiseHost MakeRowwise(int64_t rows, int64_t cols, int64_t valid_rows,
                               std::mt19937_64* rng) {
  RowwiseHost h;
  h.data.assign(rows * cols, kE4M3Nan);
  h.scales.assign(rows * cols / kB, kNan);
  h.values.assign(rows * cols, kNan);
  for (int64_t r = 0; r < valid_rows; ++r) {
    for (int64_t j = 0; j < cols / kB; ++j) {
      const float scale = RandomScale(rng);
      h.scales[r * (cols / kB) + j] = scale;
      for (int64_t c = j * kB; c < (j + 1) * kB; ++c) {
        h.data[r * cols + c] = RandomE4m3(rng);
        h.values[r * cols + c] = static_cast<double>(E4M3ToFloat(h.data[r * cols + c])) * scale;
      }
    }
  }
  return h;
}

// Expert weights W [E][k][n] in both orientations with one scale per 128 x 128 block.
struct WeightsHost {
  std::vector<uint8_t> data, data_t;    // [E][k][n], [E][n][k]
  std::vector<float> scales, scales_t;  // [E][k/128][n/128], [E][n/128][k/128]
  std::vector<double> values;           // [E][k][n]
};

inline WeightsHost MakeWeights(int experts, int64_t k, int64_t n, std::mt19937_64* rng) {
  WeightsHost h;
  const int64_t kb = k / kB, nb = n / kB;
  h.data.resize(experts * k * n);
  h.data_t.resize(experts * k * n);
  h.values.resize(experts * k * n);
  h.scales.resize(experts * kb * nb);
  h.scales_t.resize(experts * kb * nb);
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t i = 0; i < kb; ++i) {
      for (int64_t j = 0; j < nb; ++j) {
        const float scale = RandomScale(rng);
        h.scales[(e * kb + i) * nb + j] = scale;
        h.scales_t[(e * nb + j) * kb + i] = scale;
      }
    }
    for (int64_t r = 0; r < k; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        const uint8_t b = RandomE4m3(rng);
        h.data[(e * k + r) * n + c] = b;
        h.data_t[(e * n + c) * k + r] = b;
        h.values[(e * k + r) * n + c] =
            static_cast<double>(E4M3ToFloat(b)) * h.scales[(e * kb + r / kB) * nb + c / kB];
      }
    }
  }
  return h;
}

// Column-wise [cols][P] with scales [P/128][cols] (per block: [P/128][cols/128]) and padded
// offsets (fp8_block.h): group g's tokens random, its padding up to the next multiple of 128 +0
// (under the tile's scale); padded rows past padded_offsets[G] hold NaN codes and NaN scales.
// values [cols][P] dequantized.
struct ColwiseHost {
  int64_t padded_rows = 0;
  std::vector<uint8_t> data;
  std::vector<float> scales;
  std::vector<int32_t> padded_offsets;
  std::vector<double> values;
};

inline ColwiseHost MakeColwise(const std::vector<int>& sizes, int64_t rows, int64_t cols,
                               std::mt19937_64* rng,
                               Fp8ColwiseScaling scaling = Fp8ColwiseScaling::kPerColumn) {
  const bool per_block = scaling == Fp8ColwiseScaling::kPerBlock;
  const int64_t per_tile = Fp8ColwiseScalesPerTile(cols, scaling);
  ColwiseHost h;
  const int groups = static_cast<int>(sizes.size());
  const int64_t p = h.padded_rows = Fp8ColwisePaddedRows(rows, groups);
  h.padded_offsets.assign(1, 0);
  for (int s : sizes) h.padded_offsets.push_back(h.padded_offsets.back() + (s + kB - 1) / kB * kB);
  EXPECT_LE(h.padded_offsets.back(), p);
  h.data.assign(cols * p, kE4M3Nan);
  h.scales.assign(p / kB * per_tile, kNan);
  h.values.assign(cols * p, kNan);
  for (int g = 0; g < groups; ++g) {
    for (int64_t t = h.padded_offsets[g] / kB; t < h.padded_offsets[g + 1] / kB; ++t) {
      for (int64_t c = 0; c < cols; ++c) {
        float& slot = h.scales[t * per_tile + (per_block ? c / kB : c)];
        if (!per_block || c % kB == 0) slot = RandomScale(rng);
        const float scale = slot;
        for (int64_t q = t * kB; q < (t + 1) * kB; ++q) {
          const uint8_t b = q - h.padded_offsets[g] < sizes[g] ? RandomE4m3(rng) : uint8_t{0};
          h.data[c * p + q] = b;
          h.values[c * p + q] = static_cast<double>(E4M3ToFloat(b)) * scale;
        }
      }
    }
  }
  return h;
}



// dW[e][i][j] = sum over group e's padded tokens t of X[i][t] dY[j][t].
inline Ref WeightGradientReference(const ColwiseHost& x, const ColwiseHost& dy, int k, int n) {
  const int groups = static_cast<int>(x.padded_offsets.size()) - 1;
  const int64_t p = x.padded_rows;
  Ref ref;
  ref.value.assign(static_cast<size_t>(groups) * k * n, 0.0);
  ref.magnitude.assign(ref.value.size(), 0.0);
  for (int e = 0; e < groups; ++e) {
    for (int i = 0; i < k; ++i) {
      for (int j = 0; j < n; ++j) {
        double sum = 0, mag = 0;
        for (int t = x.padded_offsets[e]; t < x.padded_offsets[e + 1]; ++t) {
          const double prod = x.values[i * p + t] * dy.values[j * p + t];
          sum += prod;
          mag += std::fabs(prod);
        }
        ref.value[(static_cast<size_t>(e) * k + i) * n + j] = sum;
        ref.magnitude[(static_cast<size_t>(e) * k + i) * n + j] = mag;
      }
    }
  }
  return ref;
}

// Elements [from, out.size()) are still the poison (NaN): never written.
inline void ExpectUntouched(const std::vector<float>& out, size_t from, const char* what) {
  size_t touched = 0;
  for (size_t i = from; i < out.size(); ++i) touched += std::isnan(out[i]) ? 0 : 1;
  EXPECT_EQ(touched, 0u) << what << ": rows past offsets[G] were written";
}

}  // namespace dropless::kernels::fp8_block_gemm_test

#endif  // DROPLESS_TESTS_GPU_GEMM_FP8_BLOCK_GEMM_REFERENCE_H_
