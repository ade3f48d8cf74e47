// kernels/cuda/cuda_check.h on a device: an error is reported once, by the check of the call that
// failed, and not again by the next launch check.
#include <cuda_runtime.h>

#include <cstddef>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_check.h"
#include "tests/gpu/gemm/gemm_test_util.h"

namespace dropless::kernels {
namespace {

namespace kc = ::dropless::kernels::cuda;

class CudaCheckGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gemm_test::HasHopperDevice()) GTEST_SKIP() << "SKIPPED: no CUDA device (Hopper sm_90)";
  }
};

#define CUDA_ASSERT(expr)                                                  \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

TEST_F(CudaCheckGpu, AFailedAllocationIsNotReportedAgainByTheNextLaunchCheck) {
  void* p = nullptr;
  const absl::Status failed =
      kc::CudaStatus(cudaMalloc(&p, size_t{1} << 50), "cudaMalloc of 1 PiB");  // never fits
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("cudaErrorMemoryAllocation"), absl::string_view::npos) << failed;
  EXPECT_TRUE(kc::LaunchStatus("the launch after it").ok());
  // The device still works.
  CUDA_ASSERT(cudaMalloc(&p, 256));
  CUDA_ASSERT(cudaMemset(p, 0, 256));
  CUDA_ASSERT(cudaDeviceSynchronize());
  CUDA_ASSERT(cudaFree(p));
}

TEST_F(CudaCheckGpu, TheDeviceShapeIsTheDevicesOwn) {
  int device = 0, sms = 0;
  CUDA_ASSERT(cudaGetDevice(&device));
  CUDA_ASSERT(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  EXPECT_EQ(kc::CurrentDeviceShape().multiprocessors, sms);
  EXPECT_GT(kc::CurrentDeviceShape().smem_per_multiprocessor, 0);
  EXPECT_TRUE(kc::LaunchStatus("after the queries").ok());
}

}  // namespace
}  // namespace dropless::kernels
