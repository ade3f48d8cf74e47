// Test helpers for the grouped GEMM: random bf16 problems, device buffers with poison, fp64 CPU
// references and the comparisons.
#ifndef DROPLESS_TESTS_GPU_GEMM_GEMM_TEST_UTIL_H_
#define DROPLESS_TESTS_GPU_GEMM_GEMM_TEST_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace dropless::kernels::gemm_test {

inline bool HasHopperDevice() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return false;
  int major = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
         major == 9;
}

inline float Bf16ToFloat(uint16_t bits) {
  uint32_t word = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &word, sizeof(f));
  return f;
}

// Round to nearest even (inputs are finite).
inline uint16_t FloatToBf16(float f) {
  uint32_t word;
  std::memcpy(&word, &f, sizeof(word));
  word += 0x7fff + ((word >> 16) & 1);
  return static_cast<uint16_t>(word >> 16);
}

// Rows are expert-contiguous; max_rows leaves 16 rows past the last group that no product may
// write.
struct Problem {
  std::vector<int> sizes;
  std::vector<int32_t> offsets;  // sizes.size() + 1
  int k = 0;
  int n = 0;
  int64_t max_rows = 0;
  std::vector<uint16_t> x, w, dy;  // bf16 bits: [max_rows, k], [E, k, n], [max_rows, n]
};

inline void SetOffsets(Problem* p) {
  p->offsets.assign(1, 0);
  for (int s : p->sizes) p->offsets.push_back(p->offsets.back() + s);
}

// Mixed into every problem's seed: fresh data each run, printed once so that a failure can be
// repeated with DROPLESS_TEST_SEED=<value>.
inline uint64_t RunSeed() {
  static const uint64_t seed = [] {
    uint64_t s = 0;
    if (const char* env = std::getenv("DROPLESS_TEST_SEED")) {
      s = std::strtoull(env, nullptr, 0);
    } else {
      std::random_device rd;
      s = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }
    std::printf("grouped gemm test data seed: %llu (set DROPLESS_TEST_SEED to repeat)\n",
                static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// max_rows = the groups' rows + pad_rows (the padding rows must stay untouched).
inline Problem MakeProblem(std::vector<int> sizes, int k, int n, uint64_t seed,
                           int64_t pad_rows = 16) {
  Problem p;
  p.sizes = std::move(sizes);
  p.k = k;
  p.n = n;
  SetOffsets(&p);
  p.max_rows = p.offsets.back() + pad_rows;
  std::mt19937_64 rng(seed ^ (RunSeed() * 0x9E3779B97F4A7C15ull));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto fill = [&](std::vector<uint16_t>* v, size_t count) {
    v->resize(count);
    for (auto& b : *v) b = FloatToBf16(uniform(rng));
  };
  fill(&p.x, static_cast<size_t>(p.max_rows) * k);
  fill(&p.w, p.sizes.size() * static_cast<size_t>(k) * n);
  fill(&p.dy, static_cast<size_t>(p.max_rows) * n);
  return p;
}

class DeviceBuffer {
 public:
  DeviceBuffer(size_t bytes, int element_bytes) : bytes_(bytes), element_bytes_(element_bytes) {
    EXPECT_EQ(cudaMalloc(&ptr_, bytes_ > 0 ? bytes_ : 16), cudaSuccess);
    Poison();
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // All bits set: NaN in bf16 and fp32, so an unwritten element fails every comparison.
  void Poison() { EXPECT_EQ(cudaMemset(ptr_, 0xff, bytes_), cudaSuccess); }
  void Upload(const void* src, size_t bytes) {
    EXPECT_EQ(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  __nv_bfloat16* bf16() { return static_cast<__nv_bfloat16*>(ptr_); }
  float* f32() { return static_cast<float*>(ptr_); }
  int32_t* i32() { return static_cast<int32_t*>(ptr_); }

  std::vector<float> ToHostBf16() const {
    std::vector<uint16_t> bits(bytes_ / 2);
    EXPECT_EQ(cudaMemcpy(bits.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<float> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) out[i] = Bf16ToFloat(bits[i]);
    return out;
  }
  std::vector<float> ToHostF32() const {
    std::vector<float> out(bytes_ / 4);
    EXPECT_EQ(cudaMemcpy(out.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
  int element_bytes_;
};

// Inputs uploaded, every output poisoned.
struct Operands {
  explicit Operands(const Problem& p)
      : x(p.x.size() * 2, 2),
        w(p.w.size() * 2, 2),
        dy(p.dy.size() * 2, 2),
        y(static_cast<size_t>(p.max_rows) * p.n * 2, 2),
        dx(static_cast<size_t>(p.max_rows) * p.k * 2, 2),
        dw32(p.w.size() * 4, 4),
        dw16(p.w.size() * 2, 2),
        offsets(p.offsets.size() * 4, 4) {
    x.Upload(p.x.data(), p.x.size() * 2);
    w.Upload(p.w.data(), p.w.size() * 2);
    dy.Upload(p.dy.data(), p.dy.size() * 2);
    offsets.Upload(p.offsets.data(), p.offsets.size() * 4);
  }
  DeviceBuffer x, w, dy, y, dx, dw32, dw16, offsets;
};

// Y[r] = X[r] . W[e] for each row r of group e; rows past the last group are not produced.
inline std::vector<double> ReferenceForward(const Problem& p) {
  std::vector<double> y(static_cast<size_t>(p.offsets.back()) * p.n, 0.0);
  for (size_t e = 0; e < p.sizes.size(); ++e) {
    for (int r = p.offsets[e]; r < p.offsets[e + 1]; ++r) {
      double* out = &y[static_cast<size_t>(r) * p.n];
      for (int i = 0; i < p.k; ++i) {
        const double a = Bf16ToFloat(p.x[static_cast<size_t>(r) * p.k + i]);
        const uint16_t* wrow = &p.w[(e * p.k + i) * static_cast<size_t>(p.n)];
        for (int j = 0; j < p.n; ++j) out[j] += a * Bf16ToFloat(wrow[j]);
      }
    }
  }
  return y;
}

// dX[r][i] = sum_j dY[r][j] W[e][i][j].
inline std::vector<double> ReferenceBackwardData(const Problem& p) {
  std::vector<double> dx(static_cast<size_t>(p.offsets.back()) * p.k, 0.0);
  for (size_t e = 0; e < p.sizes.size(); ++e) {
    for (int r = p.offsets[e]; r < p.offsets[e + 1]; ++r) {
      for (int i = 0; i < p.k; ++i) {
        const uint16_t* wrow = &p.w[(e * p.k + i) * static_cast<size_t>(p.n)];
        const uint16_t* g = &p.dy[static_cast<size_t>(r) * p.n];
        double sum = 0.0;
        for (int j = 0; j < p.n; ++j) sum += Bf16ToFloat(g[j]) * Bf16ToFloat(wrow[j]);
        dx[static_cast<size_t>(r) * p.k + i] = sum;
      }
    }
  }
  return dx;
}

// dW[e][i][j] = sum over the group's rows r of X[r][i] dY[r][j]; zero for an empty group.
inline std::vector<double> ReferenceBackwardWeight(const Problem& p) {
  std::vector<double> dw(p.w.size(), 0.0);
  for (size_t e = 0; e < p.sizes.size(); ++e) {
    double* out = &dw[e * p.k * static_cast<size_t>(p.n)];
    for (int r = p.offsets[e]; r < p.offsets[e + 1]; ++r) {
      for (int i = 0; i < p.k; ++i) {
        const double a = Bf16ToFloat(p.x[static_cast<size_t>(r) * p.k + i]);
        const uint16_t* g = &p.dy[static_cast<size_t>(r) * p.n];
        for (int j = 0; j < p.n; ++j) out[static_cast<size_t>(i) * p.n + j] += a * Bf16ToFloat(g[j]);
      }
    }
  }
  return dw;
}

inline double RelativeError(const float* out, const double* ref, size_t count, size_t* bad) {
  double diff = 0.0, norm = 0.0;
  *bad = 0;
  for (size_t i = 0; i < count; ++i) {
    if (!std::isfinite(out[i])) ++*bad;
    const double d = static_cast<double>(out[i]) - ref[i];
    diff += d * d;
    norm += ref[i] * ref[i];
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// Rows of the groups match the reference; the rows past the last group still hold the poison.
inline void ExpectRowsMatch(const std::vector<float>& out, const std::vector<double>& ref,
                            const Problem& p, int cols, double tolerance) {
  const size_t valid = static_cast<size_t>(p.offsets.back()) * cols;
  ASSERT_EQ(ref.size(), valid);
  ASSERT_EQ(out.size(), static_cast<size_t>(p.max_rows) * cols);
  size_t bad = 0;
  const double err = RelativeError(out.data(), ref.data(), valid, &bad);
  EXPECT_EQ(bad, 0u) << "unwritten or non-finite outputs";
  EXPECT_LE(err, tolerance) << "relative error " << err;
  size_t touched = 0;
  for (size_t i = valid; i < out.size(); ++i) touched += std::isnan(out[i]) ? 0 : 1;
  EXPECT_EQ(touched, 0u) << "rows past offsets[E] were written";
}

// Each non-empty group's gradient matches the reference; an empty group's is exactly zero.
inline void ExpectWeightsMatch(const std::vector<float>& out, const std::vector<double>& ref,
                               const Problem& p, double tolerance) {
  ASSERT_EQ(out.size(), ref.size());
  const size_t per_group = static_cast<size_t>(p.k) * p.n;
  for (size_t e = 0; e < p.sizes.size(); ++e) {
    const float* o = &out[e * per_group];
    if (p.sizes[e] == 0) {
      size_t nonzero = 0;
      for (size_t i = 0; i < per_group; ++i) nonzero += o[i] == 0.0f ? 0 : 1;
      EXPECT_EQ(nonzero, 0u) << "empty group " << e << " gradient not zero";
      continue;
    }
    size_t bad = 0;
    const double err = RelativeError(o, &ref[e * per_group], per_group, &bad);
    EXPECT_EQ(bad, 0u) << "group " << e << ": unwritten or non-finite outputs";
    EXPECT_LE(err, tolerance) << "group " << e << ": relative error " << err;
  }
}

// Row offsets [E + 1] of groups of these sizes.
inline std::vector<int32_t> Offsets(const std::vector<int>& sizes) {
  std::vector<int32_t> o(1, 0);
  for (int s : sizes) o.push_back(o.back() + s);
  return o;
}

// The quantized GEMMs' fp64 reference of each output element, with the sum of |a| |b| over its
// products (the scale of its error bound).
struct Ref {
  std::vector<double> value, magnitude;
};

// m-grouped: C[r][c] = sum_k A[r][k] B[e][c][k] for the rows r of group e, in fp64 (A, B: the
// dequantized operands, float or double), with the magnitude sums of the error bound; with
// row_stride > 1 only rows r % row_stride == 0, stored compactly (row r at r / row_stride).
template <typename T>
inline Ref MGroupedReference(const std::vector<T>& a, const std::vector<T>& b,
                             const std::vector<int32_t>& offsets, int kred, int nout,
                             int row_stride = 1) {
  Ref ref;
  const size_t rows = (offsets.back() + row_stride - 1) / row_stride;
  ref.value.assign(rows * nout, 0.0);
  ref.magnitude.assign(rows * nout, 0.0);
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    for (int r = offsets[e]; r < offsets[e + 1]; ++r) {
      if (r % row_stride != 0) continue;
      const T* ar = &a[static_cast<size_t>(r) * kred];
      for (int c = 0; c < nout; ++c) {
        const T* bc = &b[(e * nout + c) * static_cast<size_t>(kred)];
        double sum = 0, mag = 0;
        for (int k = 0; k < kred; ++k) {
          const double p = static_cast<double>(ar[k]) * static_cast<double>(bc[k]);
          sum += p;
          mag += std::fabs(p);
        }
        ref.value[static_cast<size_t>(r / row_stride) * nout + c] = sum;
        ref.magnitude[static_cast<size_t>(r / row_stride) * nout + c] = mag;
      }
    }
  }
  return ref;
}

// out[0, count) against ref; NaN positions must agree. Prints the observed errors.
inline void ExpectClose(const std::vector<float>& out, const Ref& ref, size_t count, double rel,
                        double abs_of_magnitude, double norm_bound, const char* what) {
  ASSERT_GE(out.size(), count);
  ASSERT_GE(ref.value.size(), count);
  double diff2 = 0, ref2 = 0, worst = 0;
  size_t bad = 0, nan_mismatch = 0, first_bad = count;
  for (size_t i = 0; i < count; ++i) {
    const double r = ref.value[i], o = out[i];
    if (std::isnan(r) || std::isnan(o)) {
      if (std::isnan(r) != std::isnan(o)) ++nan_mismatch;
      continue;
    }
    const double d = std::fabs(o - r);
    if (!(d <= rel * std::fabs(r) + abs_of_magnitude * ref.magnitude[i])) {
      ++bad;
      first_bad = std::min(first_bad, i);
    }
    if (ref.magnitude[i] > 0) worst = std::max(worst, d / ref.magnitude[i]);
    diff2 += d * d;
    ref2 += r * r;
  }
  const double norm_err = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  std::printf("[%s] norm-relative error %.3g, worst |err| / sum|ab| %.3g\n", what, norm_err, worst);
  EXPECT_EQ(nan_mismatch, 0u) << what << ": NaN where the reference has none, or the reverse";
  EXPECT_EQ(bad, 0u) << what << ": first bad element " << first_bad << " out "
                     << (first_bad < count ? out[first_bad] : 0.0f) << " ref "
                     << (first_bad < count ? ref.value[first_bad] : 0.0);
  EXPECT_LE(norm_err, norm_bound) << what;
}


}  // namespace dropless::kernels::gemm_test

#endif  // DROPLESS_TESTS_GPU_GEMM_GEMM_TEST_UTIL_H_
