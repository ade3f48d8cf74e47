#include "worker/daemon/gpu_discovery.h"

#include <dlfcn.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dropless {
namespace {

// The few driver API entry points used, declared by hand (CUresult is an int enum, CUdevice an
// int) so no CUDA header or library is needed to build the daemon.
using CuInitFn = int (*)(unsigned int flags);
using CuDeviceGetCountFn = int (*)(int* count);
using CuDeviceGetFn = int (*)(int* device, int ordinal);
using CuDeviceGetNameFn = int (*)(char* name, int len, int device);
// CUuuid is a struct of 16 chars.
using CuDeviceGetUuidFn = int (*)(unsigned char* uuid, int device);
using CuDeviceTotalMemFn = int (*)(size_t* bytes, int device);

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

std::string FormatUuid(const unsigned char (&b)[16]) {
  return absl::StrFormat("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                         b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                         b[12], b[13], b[14], b[15]);
}

}  // namespace

absl::StatusOr<std::vector<CudaDevice>> DiscoverCudaDevices(const std::string& driver_library) {
  LibraryHandle lib(dlopen(driver_library.c_str(), RTLD_NOW | RTLD_LOCAL));
  if (lib.get() == nullptr) return std::vector<CudaDevice>{};

  auto cu_init = reinterpret_cast<CuInitFn>(dlsym(lib.get(), "cuInit"));
  auto cu_count = reinterpret_cast<CuDeviceGetCountFn>(dlsym(lib.get(), "cuDeviceGetCount"));
  auto cu_get = reinterpret_cast<CuDeviceGetFn>(dlsym(lib.get(), "cuDeviceGet"));
  auto cu_name = reinterpret_cast<CuDeviceGetNameFn>(dlsym(lib.get(), "cuDeviceGetName"));
  // _v2 (CUDA 11.4+) names MIG instances by their own UUID; either is optional.
  auto cu_uuid = reinterpret_cast<CuDeviceGetUuidFn>(dlsym(lib.get(), "cuDeviceGetUuid_v2"));
  if (cu_uuid == nullptr) {
    cu_uuid = reinterpret_cast<CuDeviceGetUuidFn>(dlsym(lib.get(), "cuDeviceGetUuid"));
  }
  auto cu_total_mem = reinterpret_cast<CuDeviceTotalMemFn>(dlsym(lib.get(), "cuDeviceTotalMem_v2"));
  if (cu_init == nullptr || cu_count == nullptr || cu_get == nullptr || cu_name == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(driver_library, ": missing driver API symbols (cuInit, cuDeviceGetCount, "
                                     "cuDeviceGet, cuDeviceGetName)"));
  }
  lib.Keep();
  int rc = cu_init(0);
  if (rc == kCudaErrorNoDevice) return std::vector<CudaDevice>{};
  if (rc != kCudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("cuInit failed with CUresult ", rc));
  }
  int count = 0;
  rc = cu_count(&count);
  if (rc != kCudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("cuDeviceGetCount failed with CUresult ", rc));
  }
  std::vector<CudaDevice> devices;
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
    CudaDevice found{name, "", 0};
    if (cu_uuid != nullptr) {
      unsigned char uuid[16] = {};
      rc = cu_uuid(uuid, device);
      if (rc != kCudaSuccess) {
        return absl::FailedPreconditionError(
            absl::StrCat("cuDeviceGetUuid(", ordinal, ") failed with CUresult ", rc));
      }
      found.uuid = FormatUuid(uuid);
    }
    // Advisory (placement on larger GPUs): a failure leaves it unknown rather than the GPU unused.
    if (size_t bytes = 0; cu_total_mem != nullptr && cu_total_mem(&bytes, device) == kCudaSuccess) {
      found.total_memory_bytes = static_cast<int64_t>(bytes);
    }
    devices.push_back(std::move(found));
  }
  return devices;
}

}  // namespace dropless
