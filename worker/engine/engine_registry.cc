#include "worker/engine/engine_registry.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/engine_config.h"
#include "common/step_phase.h"
#include "worker/engine/engine_module.h"

namespace dropless {
namespace {

absl::StatusOr<CreateEngineFn> LoadCudaModule() {
  // Loaded once per process and never closed: engines from it may outlive any caller.
  static void* handle = nullptr;
  static std::string load_error;
  const std::string path = CudaEngineLibraryPath();
  if (handle == nullptr && load_error.empty()) {
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      load_error = why != nullptr ? why : "unknown dlopen error";
    }
  }
  if (handle == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "resources.backend cuda: the cuda engine module could not be loaded (", load_error,
        "); this worker was built without CUDA or its libraries are missing"));
  }
  auto abi = reinterpret_cast<EngineModuleAbiFn>(dlsym(handle, kEngineModuleAbiSymbol));
  if (abi == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " does not export the dropless engine entry points"));
  }
  if (abi() != kEngineModuleAbi) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is engine ABI ", abi(), ", this rank executable expects ", kEngineModuleAbi,
        ": install the library built with this worker"));
  }
  auto create = reinterpret_cast<CreateEngineFn>(dlsym(handle, kCreateCudaEngineSymbol));
  auto set_listener =
      reinterpret_cast<SetStepPhaseListenerFn>(dlsym(handle, kSetStepPhaseListenerSymbol));
  if (create == nullptr || set_listener == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " does not export the dropless engine entry points"));
  }
  set_listener(&EnterStepPhase);  // the module's phases go through this executable's hook
  return create;
}

}  // namespace

std::string CudaEngineLibraryPath() {
  if (const char* env = std::getenv("DROPLESS_CUDA_ENGINE_LIBRARY"); env != nullptr && *env != '\0') {
    return env;
  }
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  std::string dir = ".";
  if (n > 0) {
    exe[n] = '\0';
    dir = exe;
    dir = dir.substr(0, dir.find_last_of('/'));
  }
  return absl::StrCat(dir, "/", kCudaEngineLibrary);
}

absl::Status PrepareEngine(Backend backend, const EngineConfig& config) {
  if (absl::Status st = CheckEngineSupport(backend, config); !st.ok()) return st;
  if (backend == Backend::kCpu) return absl::OkStatus();
  return LoadCudaModule().status();
}

absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(Backend backend, const EngineContext& ctx) {
  if (absl::Status st = CheckEngineSupport(backend, ctx.config); !st.ok()) return st;
  if (backend == Backend::kCpu) return CreateCpuEngine(ctx);
  absl::StatusOr<CreateEngineFn> create = LoadCudaModule();
  if (!create.ok()) return create.status();
  absl::StatusOr<std::unique_ptr<Engine>> engine = absl::InternalError("cuda engine: no answer");
  (*create)(&ctx, &engine);
  return engine;
}

}  // namespace dropless
