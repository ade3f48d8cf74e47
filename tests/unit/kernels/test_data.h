// Random inputs for the kernel tests (CPU and GPU): fresh data per test, wide dynamic range.
#ifndef DROPLESS_TESTS_UNIT_KERNELS_TEST_DATA_H_
#define DROPLESS_TESTS_UNIT_KERNELS_TEST_DATA_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dropless/kernels/types.h"

namespace dropless::kernels::testing {

inline std::mt19937_64& Rng() {
  static std::mt19937_64 rng(std::random_device{}());
  return rng;
}

// Normal(0, scale) values rounded to bf16.
inline std::vector<Bf16> RandomBf16(int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<Bf16> out(n);
  for (auto& v : out) v = FloatToBf16(dist(Rng()));
  return out;
}

// Values whose magnitude changes by up to 2^+-spread from one 32-element run to the next, so MXFP8
// blocks see many scales, with a sprinkling of exact zeros and subnormal-range values.
inline std::vector<Bf16> RandomBf16WideRange(int64_t n, int spread = 40) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::uniform_int_distribution<int> exp_dist(-spread, spread);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<Bf16> out(n);
  int exponent = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 32 == 0) exponent = exp_dist(Rng());
    const int p = pick(Rng());
    float v = std::ldexp(dist(Rng()), exponent);
    if (p == 0) v = 0.0f;
    if (p == 1) v = -0.0f;
    if (p == 2) v = std::ldexp(dist(Rng()), -128);  // bf16 subnormal range
    out[i] = FloatToBf16(v);
  }
  return out;
}

inline std::vector<float> RandomFloat(int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(n);
  for (auto& v : out) v = dist(Rng());
  return out;
}

// Wide-range data with whole blocks of special content: zeros, NaN, +-Inf, bf16 max, subnormals.
inline std::vector<Bf16> QuantizeInput(int64_t rows, int64_t cols) {
  std::vector<Bf16> x = RandomBf16WideRange(rows * cols, 50);
  std::uniform_int_distribution<int64_t> pick(0, rows * cols - 1);
  const uint16_t specials[] = {0x7FC0, 0x7F80, 0xFF80, 0x7F7F, 0xFF7F, 0x0001, 0x8000};
  for (uint16_t s : specials) {
    for (int n = 0; n < 3; ++n) x[pick(Rng())] = Bf16{s};
  }
  for (int n = 0; n < 5; ++n) {  // whole zero rows (zero row-wise blocks)
    const int64_t r = pick(Rng()) / cols;
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] = Bf16{0};
  }
  return x;
}

// Random group sizes summing to at most `rows`, with empty and odd groups.
inline std::vector<int32_t> RandomGroupOffsets(int groups, int64_t rows) {
  std::vector<int32_t> offsets(groups + 1, 0);
  std::uniform_int_distribution<int> kind(0, 3);
  const int64_t mean = std::max<int64_t>(1, rows / groups);
  std::uniform_int_distribution<int64_t> size(0, 2 * mean);
  for (int g = 0; g < groups; ++g) {
    int64_t n = kind(Rng()) == 0 ? 0 : size(Rng()) | 1;
    n = std::min<int64_t>(n, rows - offsets[g]);
    offsets[g + 1] = offsets[g] + static_cast<int32_t>(n);
  }
  return offsets;
}

// Difference in units of the last bf16 place of `want` (exact 0 -> 0 units needed).
inline double Bf16UlpDiff(Bf16 got, double want) {
  const double g = Bf16ToFloat(got);
  if (want == 0) return g == 0 ? 0 : INFINITY;
  int e;
  std::frexp(want, &e);  // |want| in [2^(e-1), 2^e)
  const double ulp = std::ldexp(1.0, e - 1 - 7);
  return std::fabs(g - want) / ulp;
}

}  // namespace dropless::kernels::testing

#endif  // DROPLESS_TESTS_UNIT_KERNELS_TEST_DATA_H_
