#include "worker/daemon/gpu_discovery.h"

#include <dlfcn.h>

#include "gtest/gtest.h"

namespace dropless {
namespace {

TEST(GpuDiscoveryTest, MissingDriverLibraryMeansNoGpus) {
  absl::StatusOr<std::vector<std::string>> gpus =
      DiscoverCudaDevices("libdropless-no-such-driver.so.1");
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_TRUE(gpus->empty());
}

TEST(GpuDiscoveryTest, LibraryWithoutDriverSymbolsIsAnError) {
  // libm is loadable everywhere and has no cuInit.
  absl::StatusOr<std::vector<std::string>> gpus = DiscoverCudaDevices("libm.so.6");
  EXPECT_EQ(gpus.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(gpus.status().message().find("cuInit"), std::string::npos);
}

TEST(GpuDiscoveryTest, ThisMachine) {
  absl::StatusOr<std::vector<std::string>> gpus = DiscoverCudaDevices();
  void* driver = dlopen(kCudaDriverLibrary, RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) {
    // CPU machine: no driver, zero GPUs, no error.
    ASSERT_TRUE(gpus.ok()) << gpus.status();
    EXPECT_TRUE(gpus->empty());
  } else {
    // GPU machine: every device has a name.
    ASSERT_TRUE(gpus.ok()) << gpus.status();
    for (const std::string& name : *gpus) EXPECT_FALSE(name.empty());
  }
}

}  // namespace
}  // namespace dropless
