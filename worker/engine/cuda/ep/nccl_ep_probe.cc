// NcclEpLibraryAvailable (expert_dispatcher.h): whether NVIDIA's NCCL EP library can be loaded.
#include <dlfcn.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/ep/expert_dispatcher.h"

namespace dropless::cuda_engine {

absl::Status NcclEpLibraryAvailable() {
  void* library = dlopen("libnccl_ep.so", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    return absl::UnavailableError(absl::StrCat(
        "dispatcher: nccl-ep needs NVIDIA's NCCL EP library (libnccl_ep.so), which this node "
        "does not have (", why == nullptr ? "not found" : why,
        "); use nccl-lsa or auto"));
  }
  dlclose(library);
  // Loading works, but the engine does not drive the library's API yet.
  return absl::UnimplementedError(
      "dispatcher: nccl-ep: libnccl_ep.so is installed but the cuda engine does not drive it yet; "
      "use nccl-lsa or auto");
}

}  // namespace dropless::cuda_engine
