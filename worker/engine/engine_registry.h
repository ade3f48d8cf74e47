// The engines by backend. cpu is linked into the rank executable; cuda is the loadable module
// libdropless_engine_cuda.so (engine_module.h), opened on first use so that CPU jobs, the worker
// daemon and CPU-only builds never load a CUDA library.
#ifndef DROPLESS_WORKER_ENGINE_ENGINE_REGISTRY_H_
#define DROPLESS_WORKER_ENGINE_ENGINE_REGISTRY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/engine_config.h"
#include "common/job_spec.h"
#include "worker/engine/engine.h"

namespace dropless {

// Checks that the backend's engine can run `config` and is present (loads the cuda module), before
// a rank spends time joining its groups: a worker without the module fails fast and clearly.
absl::Status PrepareEngine(Backend backend, const EngineConfig& config);

// Checks the config against the backend's capabilities (CheckEngineSupport), then builds it.
absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(Backend backend, const EngineContext& ctx);

// Where the cuda module is looked for: $DROPLESS_CUDA_ENGINE_LIBRARY when set, else
// libdropless_engine_cuda.so in the running executable's directory.
std::string CudaEngineLibraryPath();

}  // namespace dropless

#endif  // DROPLESS_WORKER_ENGINE_ENGINE_REGISTRY_H_
