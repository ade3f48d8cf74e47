// Engine: one rank's share of a MoE training job. Backends: cpu/ (float32 reference, OpenBLAS) and
// cuda/ (GPU). The rank process builds one, calls Step() `steps` times, and reports StepStats.
#ifndef DROPLESS_WORKER_ENGINE_ENGINE_H_
#define DROPLESS_WORKER_ENGINE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine_config.h"
#include "worker/transport/communicator.h"

namespace dropless {

struct StepStats {
  int64_t step = 0;             // 1-based
  double loss = 0;              // task loss, averaged over every rank of the job
  double aux_loss = 0;          // load-balancing loss (before its coefficient)
  double step_seconds = 0;
  double dispatch_seconds = 0;  // token dispatch all-to-all(s), fwd + bwd
  double combine_seconds = 0;   // token combine all-to-all(s), fwd + bwd
  // Expert GEMMs (grouped over the rank's experts, shared experts included) by phase: forward,
  // backward-data (dgrad) and backward-weight (wgrad); gemm_seconds is their sum.
  double gemm_forward_seconds = 0;
  double gemm_dgrad_seconds = 0;
  double gemm_wgrad_seconds = 0;
  double gemm_seconds = 0;
  double flops = 0;             // model FLOPs of this step on this rank (18*T*k*H*F per layer + router + shared)
  int64_t tokens = 0;           // tokens processed by this rank this step
  double load_imbalance = 1;    // max/mean tokens per expert over the EP group
  int64_t device_memory_bytes = 0;
};

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
