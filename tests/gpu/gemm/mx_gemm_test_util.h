// What the MXFP8 grouped GEMM tests share (mx_grouped_gemm_test.cc: the promotion kernels;
// mx_core_gemm_test.cc: the bf16-core kernel on weight images): random operands with a wide
// exponent range, the CPU quantizer and dequantizer, the fp64 m-grouped reference, and the
// forward / data-gradient runner that checks a kernel's output against it.
//
// Bounds. Per element |out - ref| <= tol_rel * |ref| + tol_abs * sum_k |a_k b_k|, where the first
// term is the output rounding (bf16: 2^-8 relative, written here as 1e-2 with margin; fp32 1e-5)
// and the second the accumulation (relative to the magnitude sum of the products; the fp8 tensor
// cores add a k32 block's products with a reduced alignment width). The norm-wise relative error
// must also stay below 1e-2 (bf16) / 1e-3 (fp32).
#ifndef DROPLESS_TESTS_GPU_GEMM_MX_GEMM_TEST_UTIL_H_
#define DROPLESS_TESTS_GPU_GEMM_MX_GEMM_TEST_UTIL_H_

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dropless/kernels/mx_grouped_gemm.h"
#include "dropless/kernels/mxfp8.h"
#include "tests/gpu/gemm/gemm_test_util.h"

namespace dropless::kernels::mx_test {

using gemm_test::DeviceBuffer;
using gemm_test::ExpectClose;
using gemm_test::Offsets;
using gemm_test::MGroupedReference;
using gemm_test::Ref;

inline constexpr double kBf16Rel = 1e-2, kBf16Abs = 2e-3, kBf16Norm = 1e-2;
inline constexpr double kF32Rel = 1e-5, kF32Abs = 2e-3, kF32Norm = 1e-3;

// Values u * 2^e with u uniform in (-1, 1) and e uniform in [-12, 12] per element: every 32-element
// block (along rows and along columns) gets its own scale, most blocks a different one.
inline std::vector<Bf16> RandomWide(size_t count, std::mt19937_64* rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-12, 12);
  std::vector<Bf16> v(count);
  for (auto& x : v) x = FloatToBf16(std::ldexp(u(*rng), e(*rng)));
  return v;
}

struct MxHost {
  std::vector<uint8_t> data, scales;
  std::vector<float> values;  // dequantized, [rows][cols]
};

inline MxHost QuantizeRows(const std::vector<Bf16>& x, int64_t rows, int64_t cols) {
  MxHost h;
  h.data.resize(rows * cols);
  h.scales.resize(rows * cols / 32);
  h.values.resize(rows * cols);
  MxRowwise out{h.data.data(), h.scales.data()};
  MxQuantizeShape shape{rows, cols, 1};
  EXPECT_TRUE(cpu::QuantizeMxfp8(shape, x.data(), nullptr, &out, nullptr).ok());
  EXPECT_TRUE(cpu::DequantizeMxfp8Rowwise(rows, cols, nullptr, h.data.data(), h.scales.data(),
                                          h.values.data())
                  .ok());
  return h;
}

template <class T>
std::unique_ptr<DeviceBuffer> Upload(const std::vector<T>& v) {
  auto b = std::make_unique<DeviceBuffer>(v.size() * sizeof(T), sizeof(T));
  b->Upload(v.data(), v.size() * sizeof(T));
  return b;
}




struct MGroupedCase {
  std::vector<int32_t> offsets;
  int64_t max_rows;
  int kred = 0, nout = 0;  // reduction length and output width of this product
  MxHost a, b;
};

// A [max_rows][kred] row-wise, B [E][nout][kred] row-wise (B K-major).
inline MGroupedCase MakeMGrouped(const std::vector<int>& sizes, int kred, int nout, uint64_t seed) {
  std::mt19937_64 rng(seed);
  MGroupedCase c;
  c.offsets = Offsets(sizes);
  c.max_rows = c.offsets.back() + 16;
  c.kred = kred;
  c.nout = nout;
  c.a = QuantizeRows(RandomWide(c.max_rows * kred, &rng), c.max_rows, kred);
  c.b = QuantizeRows(RandomWide(sizes.size() * nout * static_cast<size_t>(kred), &rng),
                     static_cast<int64_t>(sizes.size()) * nout, kred);
  return c;
}


// The device bf16 buffer holds exactly `expected`'s bits (NaN matches any NaN).
inline void ExpectSameBits(DeviceBuffer& got, const std::vector<Bf16>& expected, const char* what) {
  std::vector<uint16_t> host(expected.size());
  ASSERT_EQ(cudaMemcpy(host.data(), got.bf16(), host.size() * 2, cudaMemcpyDeviceToHost),
            cudaSuccess);
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    const bool nan_got = (host[i] & 0x7fff) > 0x7f80, nan_want = (expected[i].bits & 0x7fff) > 0x7f80;
    const bool same = nan_got ? nan_want : host[i] == expected[i].bits;
    if (!same && differ++ == 0) first = i;
  }
  EXPECT_EQ(differ, 0u) << what << ": weight image differs from the CPU's at " << differ
                        << " elements, first at " << first;
}

// Runs Forward (dgrad = false) or BackwardData and checks it (every row_stride-th row against the
// reference, all rows for NaN poison), rows past offsets[E] untouched.
inline void RunMGrouped(const MGroupedCase& c, bool dgrad, const char* what, const std::string& kernel,
                 int row_stride = 1, const Ref* precomputed = nullptr) {
  SCOPED_TRACE(kernel);
  const int kred = c.kred, nout = c.nout;
  // The bf16-core kernels (mx_core_*) read B as its weight image.
  const bool core = kernel.rfind("mx_core_", 0) == 0;
  if (core) ASSERT_EQ(kred % 64, 0) << "core: k % 64";
  const int groups = static_cast<int>(c.offsets.size()) - 1;
  MxGroupedGemmOptions options;
  options.num_groups = groups;
  options.max_rows = c.max_rows;
  options.k = dgrad ? nout : kred;  // the forward's k and n
  options.n = dgrad ? kred : nout;
  options.kernel = kernel;
  auto gemm = MxGroupedGemm::Create(options);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  auto a_data = Upload(c.a.data), a_scales = Upload(c.a.scales);
  auto b_data = Upload(c.b.data), b_scales = Upload(c.b.scales);
  auto offsets = Upload(c.offsets);
  DeviceBuffer out(static_cast<size_t>(c.max_rows) * nout * 2, 2);  // poisoned (NaN)
  const MxOperand a{static_cast<const uint8_t*>(static_cast<void*>(a_data->i32())),
                    static_cast<const uint8_t*>(static_cast<void*>(a_scales->i32()))};
  const MxOperand b{static_cast<const uint8_t*>(static_cast<void*>(b_data->i32())),
                    static_cast<const uint8_t*>(static_cast<void*>(b_scales->i32()))};
  Bf16* y = reinterpret_cast<Bf16*>(out.bf16());
  absl::Status s;
  if (core) {
    // The weight image, made on the device and checked bit for bit against the CPU's.
    const int64_t b_rows = static_cast<int64_t>(groups) * nout;
    DeviceBuffer image(static_cast<size_t>(b_rows) * kred * 2, 2);
    ASSERT_TRUE(cuda::MxWeightImage(b_rows, kred, b.data, b.scales,
                                    reinterpret_cast<Bf16*>(image.bf16()), nullptr)
                    .ok());
    std::vector<Bf16> expected(static_cast<size_t>(b_rows) * kred);
    ASSERT_TRUE(
        cpu::MxWeightImage(b_rows, kred, c.b.data.data(), c.b.scales.data(), expected.data())
            .ok());
    ExpectSameBits(image, expected, what);
    const Bf16* img = reinterpret_cast<const Bf16*>(image.bf16());
    s = dgrad ? (*gemm)->BackwardData(a, img, offsets->i32(), y, nullptr)
              : (*gemm)->Forward(a, img, offsets->i32(), y, nullptr);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  } else {
    s = dgrad ? (*gemm)->BackwardData(a, b, offsets->i32(), y, nullptr)
              : (*gemm)->Forward(a, b, offsets->i32(), y, nullptr);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  const std::vector<float> host = out.ToHostBf16();
  const Ref ref = precomputed != nullptr ? *precomputed
                                         : MGroupedReference(c.a.values, c.b.values, c.offsets,
                                                             kred, nout, row_stride);
  const size_t valid = static_cast<size_t>(c.offsets.back()) * nout;
  std::vector<float> sampled;
  for (size_t r = 0; r < static_cast<size_t>(c.offsets.back()); r += row_stride) {
    sampled.insert(sampled.end(), host.begin() + r * nout, host.begin() + (r + 1) * nout);
  }
  ExpectClose(sampled, ref, sampled.size(), kBf16Rel, kBf16Abs, kBf16Norm, what);
  size_t unwritten = 0, touched = 0;
  if (row_stride > 1) {  // rows the reference skipped must still be written (no NaN inputs here)
    for (size_t i = 0; i < valid; ++i) unwritten += std::isnan(host[i]) ? 1 : 0;
  }
  for (size_t i = valid; i < host.size(); ++i) touched += std::isnan(host[i]) ? 0 : 1;
  EXPECT_EQ(unwritten, 0u) << what << ": outputs left NaN (unwritten) in the groups' rows";
  EXPECT_EQ(touched, 0u) << what << ": rows past offsets[E] were written";
}

}  // namespace dropless::kernels::mx_test

#endif  // DROPLESS_TESTS_GPU_GEMM_MX_GEMM_TEST_UTIL_H_
