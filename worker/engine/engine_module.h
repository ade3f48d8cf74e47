// The contract between the rank process and an engine built as a loadable module
// (libdropless_engine_cuda.so): the symbols it exports and their ABI version.
#ifndef DROPLESS_WORKER_ENGINE_ENGINE_MODULE_H_
#define DROPLESS_WORKER_ENGINE_ENGINE_MODULE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/engine/engine.h"

namespace dropless {

// Bump whenever EngineContext, EngineConfig, Engine or StepStats change shape.
inline constexpr int kEngineModuleAbi = 4;  // 4: OptimizerSpec::moment_dtype

inline constexpr char kCudaEngineLibrary[] = "libdropless_engine_cuda.so";
inline constexpr char kEngineModuleAbiSymbol[] = "DroplessEngineModuleAbi";
inline constexpr char kCreateCudaEngineSymbol[] = "DroplessCreateCudaEngine";

using EngineModuleAbiFn = int (*)();
using CreateEngineFn = void (*)(const EngineContext*, absl::StatusOr<std::unique_ptr<Engine>>*);

}  // namespace dropless

#endif  // DROPLESS_WORKER_ENGINE_ENGINE_MODULE_H_
