// The contract between the rank process and an engine built as a loadable module
// (libdropless_engine_cuda.so): the symbols it exports and their ABI version.
#ifndef DROPLESS_WORKER_ENGINE_ENGINE_MODULE_H_
#define DROPLESS_WORKER_ENGINE_ENGINE_MODULE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/step_phase.h"
#include "worker/engine/engine.h"

namespace dropless {

// Bump whenever EngineContext, EngineConfig, Engine or StepStats change shape, or a symbol is
// added.
inline constexpr int kEngineModuleAbi = 5;  // 5: DroplessSetStepPhaseListener

inline constexpr char kCudaEngineLibrary[] = "libdropless_engine_cuda.so";
inline constexpr char kEngineModuleAbiSymbol[] = "DroplessEngineModuleAbi";
inline constexpr char kCreateCudaEngineSymbol[] = "DroplessCreateCudaEngine";
// The module links its own copy of common/step_phase.cc (its symbols are hidden): the registry
// sets the module's listener to the rank executable's EnterStepPhase once loaded, so the phases
// the module's engine enters reach whatever listens in the executable (the PhaseReporter, which
// starts after the engine is built).
inline constexpr char kSetStepPhaseListenerSymbol[] = "DroplessSetStepPhaseListener";

using EngineModuleAbiFn = int (*)();
using CreateEngineFn = void (*)(const EngineContext*, absl::StatusOr<std::unique_ptr<Engine>>*);
using SetStepPhaseListenerFn = void (*)(StepPhaseListener);

}  // namespace dropless

#endif  // DROPLESS_WORKER_ENGINE_ENGINE_MODULE_H_
