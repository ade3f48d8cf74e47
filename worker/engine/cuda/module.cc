// The C entry of libdropless_engine_cuda.so: what the rank process's engine registry looks up
// with dlsym (engine_registry.cc). The library is built with the same compiler and headers as
// the rank executable, so C++ types cross the boundary; the ABI version guards against a stale
// library next to a newer executable.
#include <memory>
#include <utility>

#include "common/step_phase.h"
#include "worker/engine/cuda/cuda_engine.h"
#include "worker/engine/engine_module.h"

extern "C" {

__attribute__((visibility("default"))) int DroplessEngineModuleAbi() {
  return dropless::kEngineModuleAbi;
}

__attribute__((visibility("default"))) void DroplessSetStepPhaseListener(
    dropless::StepPhaseListener listener) {
  dropless::SetStepPhaseListener(listener);
}

__attribute__((visibility("default"))) void DroplessCreateCudaEngine(
    const dropless::EngineContext* context,
    absl::StatusOr<std::unique_ptr<dropless::Engine>>* out) {
  absl::StatusOr<std::unique_ptr<dropless::cuda_engine::CudaEngine>> engine =
      dropless::cuda_engine::CreateCudaEngine(context->config, context->rank, context->world_size,
                                              context->groups);
  if (!engine.ok()) {
    *out = engine.status();
    return;
  }
  *out = std::unique_ptr<dropless::Engine>(std::move(*engine));
}

}  // extern "C"
