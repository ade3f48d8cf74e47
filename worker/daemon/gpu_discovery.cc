#include "worker/daemon/gpu_discovery.h"

#include <dlfcn.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dropless {
namespace {

// The few driver API entry points used, declared by hand (CUresult is an int enum, CUdevice an
// int) so no CUDA header or library is needed to build the daemon.
using CuInitFn = int (*)(unsigned int flags);
using CuDeviceGetCountFn = int (*)(int* count);
using CuDeviceGetFn = int (*)(int* device, int ordinal);
using CuDeviceGetNameFn = int (*)(char* name, int len, int device);

constexpr int kCudaSuccess = 0;
constexpr int kCudaErrorNoDevice = 100;

// Closes the library unless Keep() was called: once cuInit ran, driver threads may run code of
// the library, so it must stay loaded for the life of the process.
class LibraryHandle {
 public:
  explicit LibraryHandle(void* handle) : handle_(handle) {}
  ~LibraryHandle() {
    if (handle_ != nullptr && !keep_) dlclose(handle_);
  }
  LibraryHandle(const LibraryHandle&) = delete;
  LibraryHandle& operator=(const LibraryHandle&) = delete;
  void* get() const { return handle_; }
  void Keep() { keep_ = true; }

 private:
  void* handle_;
  bool keep_ = false;
};

}  // namespace

absl::StatusOr<std::vector<std::string>> DiscoverCudaDevices(const std::string& driver_library) {
  LibraryHandle lib(dlopen(driver_library.c_str(), RTLD_NOW | RTLD_LOCAL));
  if (lib.get() == nullptr) return std::vector<std::string>{};

  auto cu_init = reinterpret_cast<CuInitFn>(dlsym(lib.get(), "cuInit"));
  auto cu_count = reinterpret_cast<CuDeviceGetCountFn>(dlsym(lib.get(), "cuDeviceGetCount"));
  auto cu_get = reinterpret_cast<CuDeviceGetFn>(dlsym(lib.get(), "cuDeviceGet"));
  auto cu_name = reinterpret_cast<CuDeviceGetNameFn>(dlsym(lib.get(), "cuDeviceGetName"));
  if (cu_init == nullptr || cu_count == nullptr || cu_get == nullptr || cu_name == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(driver_library, ": missing driver API symbols (cuInit, cuDeviceGetCount, "
                                     "cuDeviceGet, cuDeviceGetName)"));
  }
  lib.Keep();
  int rc = cu_init(0);
  if (rc == kCudaErrorNoDevice) return std::vector<std::string>{};
  if (rc != kCudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("cuInit failed with CUresult ", rc));
  }
  int count = 0;
  rc = cu_count(&count);
  if (rc != kCudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("cuDeviceGetCount failed with CUresult ", rc));
  }
  std::vector<std::string> names;
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    int device = 0;
    rc = cu_get(&device, ordinal);
    if (rc != kCudaSuccess) {
      return absl::FailedPreconditionError(
          absl::StrCat("cuDeviceGet(", ordinal, ") failed with CUresult ", rc));
    }
    char name[256] = {};
    rc = cu_name(name, sizeof(name) - 1, device);
    if (rc != kCudaSuccess) {
      return absl::FailedPreconditionError(
          absl::StrCat("cuDeviceGetName(", ordinal, ") failed with CUresult ", rc));
    }
    names.emplace_back(name);
  }
  return names;
}

}  // namespace dropless
