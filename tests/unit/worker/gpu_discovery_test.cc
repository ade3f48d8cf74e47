#include "worker/daemon/gpu_discovery.h"

#include <dlfcn.h>

#include "gtest/gtest.h"

namespace dropless {
namespace {

TEST(GpuDiscoveryTest, MissingDriverLibraryMeansNoGpus) {
  absl::StatusOr<std::vector<CudaDevice>> gpus =
      DiscoverCudaDevices("libdropless-no-such-driver.so.1");
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_TRUE(gpus->empty());
}

TEST(GpuDiscoveryTest, LibraryWithoutDriverSymbolsIsAnError) {
  // libm is loadable everywhere and has no cuInit.
  absl::StatusOr<std::vector<CudaDevice>> gpus = DiscoverCudaDevices("libm.so.6");
  EXPECT_EQ(gpus.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(gpus.status().message().find("cuInit"), std::string::npos);
}

TEST(GpuDiscoveryTest, ThisMachine) {
  absl::StatusOr<std::vector<CudaDevice>> gpus = DiscoverCudaDevices();
  void* driver = dlopen(kCudaDriverLibrary, RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) {
    // CPU machine: no driver, zero GPUs, no error.
    ASSERT_TRUE(gpus.ok()) << gpus.status();
    EXPECT_TRUE(gpus->empty());
  } else {
    // GPU machine: every device has a name.
    ASSERT_TRUE(gpus.ok()) << gpus.status();
    for (const CudaDevice& gpu : *gpus) {
      EXPECT_FALSE(gpu.name.empty());
      EXPECT_EQ(gpu.uuid.rfind("GPU-", 0), 0u) << gpu.uuid;
      EXPECT_GT(gpu.total_memory_bytes, int64_t{1} << 30) << gpu.name;
    }
  }
}

// A stand-in driver (tests/unit/worker/fake_cuda_driver.c) with two devices.
TEST(GpuDiscoveryTest, NamesUuidsAsNvidiaSmiPrintsThemAndTotalMemory) {
  absl::StatusOr<std::vector<CudaDevice>> gpus = DiscoverCudaDevices(DROPLESS_FAKE_CUDA_DRIVER);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ((*gpus)[0].name, "Fake H200");
  EXPECT_EQ((*gpus)[0].uuid, "GPU-00010203-0405-0607-0809-0a0b0c0d0eab");
  EXPECT_EQ((*gpus)[1].name, "Fake H100");
  EXPECT_EQ((*gpus)[1].uuid, "GPU-10111213-1415-1617-1819-1a1b1c1d1eab");
  EXPECT_EQ((*gpus)[0].total_memory_bytes, int64_t{141} << 30);
  EXPECT_EQ((*gpus)[1].total_memory_bytes, int64_t{80} << 30);
}

}  // namespace
}  // namespace dropless
