// Engine: one rank's share of a MoE training job. Backends: cpu/ (float32 reference, OpenBLAS) and
// cuda/ (GPU). The rank process builds one, calls Step() `steps` times, and reports StepStats
// (common/step_stats.h).
#ifndef DROPLESS_WORKER_ENGINE_ENGINE_H_
#define DROPLESS_WORKER_ENGINE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine_config.h"
#include "common/step_stats.h"
#include "worker/transport/communicator.h"

namespace dropless {

struct EngineContext {
  EngineConfig config;
  int rank = 0;
  int world_size = 1;
  RankGroups* groups = nullptr;  // owned by the caller, outlives the engine
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual absl::StatusOr<StepStats> Step() = 0;
  // Peak FLOP/s of the device this rank runs on (denominator of MFU).
  virtual double PeakFlops() const = 0;
  virtual absl::Status SaveCheckpoint(const std::string& dir) = 0;
  // Steps completed, counting those restored from a checkpoint: a resumed rank runs
  // spec.steps - StepsDone() more. Engines without checkpoints may keep the default.
  virtual int64_t StepsDone() const { return 0; }
};

absl::StatusOr<std::unique_ptr<Engine>> CreateCpuEngine(const EngineContext& ctx);

}  // namespace dropless

#endif  // DROPLESS_WORKER_ENGINE_ENGINE_H_
