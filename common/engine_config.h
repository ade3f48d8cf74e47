// EngineConfig: what an engine needs of a job (model, layout, precision, optimizer, task,
// checkpoint, transport and memory options), cut from the JobSpec by the rank process so that
// engines never see scheduling fields (name, priority, attempts, resources).
#ifndef DROPLESS_COMMON_ENGINE_CONFIG_H_
#define DROPLESS_COMMON_ENGINE_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/job_spec.h"

namespace dropless {

struct EngineConfig {
  ModelSpec model;
  ParallelSpec parallel;
  Precision precision = Precision::kBf16;
  int64_t tokens_per_rank = 0;
  int64_t steps = 0;
  OptimizerSpec optimizer;
  DataSpec data;  // the synthetic task
  CheckpointSpec checkpoint;
  Dispatcher dispatcher = Dispatcher::kAuto;
  bool overlap = false;
  bool activation_offload = false;

  int64_t world_size() const { return parallel.ep * parallel.dp; }
};

// What each engine can run, in one place: the job-spec validator refuses at submit what the
// chosen backend's engine cannot honour (one InvalidArgument naming the field), and the engines
// check again at start. cpu: float32 reference arithmetic (precision bf16 means "not mxfp8"), Gloo
// exchange, no overlap or offload. cuda: one EP group of up to 8 GPUs; bf16, mxfp8 or fp8-block
// experts; overlap at EP > 1 with 2+ experts per rank over nccl-lsa or auto; shapes the kernels
// take.
absl::Status CheckEngineSupport(Backend backend, const EngineConfig& config);

inline EngineConfig EngineConfigFromSpec(const JobSpec& spec) {
  EngineConfig c;
  c.model = spec.model;
  c.parallel = spec.parallel;
  c.precision = spec.precision;
  c.tokens_per_rank = spec.tokens_per_rank;
  c.steps = spec.steps;
  c.optimizer = spec.optimizer;
  c.data = spec.data;
  c.checkpoint = spec.checkpoint;
  c.dispatcher = spec.dispatcher;
  c.overlap = spec.overlap;
  c.activation_offload = spec.activation_offload;
  return c;
}

}  // namespace dropless

#endif  // DROPLESS_COMMON_ENGINE_CONFIG_H_
