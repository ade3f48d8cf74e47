// Device buffers, poisoning and the no-GPU skip for the kernel GPU tests.
#ifndef DROPLESS_TESTS_GPU_KERNELS_GPU_TEST_UTIL_H_
#define DROPLESS_TESTS_GPU_KERNELS_GPU_TEST_UTIL_H_

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"

namespace dropless::kernels::testing {

inline bool HaveCudaDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// Every test of these suites derives from GpuTest: on a machine without a GPU it is skipped and
// says so, which ctest reports as skipped.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveCudaDevice()) {
      std::printf("SKIPPED: no CUDA device\n");
      GTEST_SKIP() << "no CUDA device";
    }
  }
};

#define CUDA_ASSERT(expr)                                                          \
  do {                                                                             \
    const cudaError_t _e = (expr);                                                 \
    ASSERT_EQ(_e, cudaSuccess) << #expr << ": " << cudaGetErrorString(_e);         \
  } while (0)

#define STATUS_ASSERT(expr)                                                        \
  do {                                                                             \
    const absl::Status _s = (expr);                                                \
    ASSERT_TRUE(_s.ok()) << #expr << ": " << _s;                                   \
  } while (0)

// A device array of T, poisoned with a byte pattern on creation so unwritten outputs show.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n, unsigned char poison = 0xA5) : n_(n) {
    if (cudaMalloc(&ptr_, bytes() == 0 ? 1 : bytes()) != cudaSuccess) ptr_ = nullptr;
    Poison(poison);
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { Upload(host); }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  void Poison(unsigned char byte) {
    if (ptr_ != nullptr && bytes() > 0) cudaMemset(ptr_, byte, bytes());
  }
  void Upload(const std::vector<T>& host) {
    cudaMemcpy(ptr_, host.data(), sizeof(T) * std::min(host.size(), n_), cudaMemcpyHostToDevice);
  }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    cudaDeviceSynchronize();
    cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost);
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

// Host vector filled with the same poison byte, for the CPU reference's outputs.
template <typename T>
std::vector<T> Poisoned(size_t n, unsigned char byte = 0xA5) {
  std::vector<T> v(n);
  std::memset(static_cast<void*>(v.data()), byte, n * sizeof(T));
  return v;
}

// Byte-wise equality; on mismatch names the first differing element.
template <typename T>
::testing::AssertionResult BitEqual(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size differs";
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      size_t mismatches = 0;
      for (size_t j = i; j < got.size(); ++j) mismatches += std::memcmp(&got[j], &want[j], sizeof(T)) != 0;
      uint32_t g = 0, w = 0;
      std::memcpy(&g, &got[i], std::min(sizeof(T), sizeof(g)));
      std::memcpy(&w, &want[i], std::min(sizeof(T), sizeof(w)));
      return ::testing::AssertionFailure()
             << "first mismatch at element " << i << " of " << got.size() << ": got 0x" << std::hex
             << g << ", want 0x" << w << std::dec << " (" << mismatches << " differ)";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace dropless::kernels::testing

#endif  // DROPLESS_TESTS_GPU_KERNELS_GPU_TEST_UTIL_H_
