// The C entry dropless-bench's same-process comparison uses (bench/peers/step_peer.py loads this
// library with ctypes and times the engine's training step next to torch and JAX, alternating
// rounds): build a one-rank CUDA engine from a job spec's YAML, run steps, read their figures.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "common/engine_config.h"
#include "common/job_spec.h"
#include "worker/engine/cuda/cuda_engine.h"

namespace {

struct StepHandle {
  std::unique_ptr<dropless::cuda_engine::CudaEngine> engine;
  dropless::StepStats last;
  double gemm_seconds[3] = {0, 0, 0};
};

void SetError(char* err, int err_len, const absl::Status& status) {
  if (err == nullptr || err_len <= 0) return;
  std::snprintf(err, static_cast<size_t>(err_len), "%s", std::string(status.message()).c_str());
}

}  // namespace

extern "C" {

// NULL on error (the message in err).
__attribute__((visibility("default"))) void* dl_step_create(const char* spec_yaml, char* err,
                                                            int err_len) {
  absl::StatusOr<dropless::JobSpec> spec = dropless::ParseJobSpec(spec_yaml);
  if (!spec.ok()) {
    SetError(err, err_len, spec.status());
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<dropless::cuda_engine::CudaEngine>> engine =
      dropless::cuda_engine::CreateCudaEngine(dropless::EngineConfigFromSpec(*spec), 0, 1, nullptr);
  if (!engine.ok()) {
    SetError(err, err_len, engine.status());
    return nullptr;
  }
  auto* handle = new StepHandle();
  handle->engine = *std::move(engine);
  return handle;
}

// Runs `steps` training steps; *ms_per_step is the mean of their training-step times (forward,
// backward, optimizer; the synthetic batch excluded). 0 = ok.
__attribute__((visibility("default"))) int dl_step_run(void* h, int steps, double* ms_per_step,
                                                       char* err, int err_len) {
  auto* handle = static_cast<StepHandle*>(h);
  double total = 0;
  for (int i = 0; i < steps; ++i) {
    absl::StatusOr<dropless::StepStats> stats = handle->engine->Step();
    if (!stats.ok()) {
      SetError(err, err_len, stats.status());
      return 1;
    }
    handle->last = *stats;
    total += stats->step_seconds;
  }
  if (ms_per_step != nullptr) *ms_per_step = steps > 0 ? total * 1e3 / steps : 0;
  return 0;
}

// Times the step's own expert GEMMs alone (fills the figures dl_step_stats reports). 0 = ok.
__attribute__((visibility("default"))) int dl_step_time_gemms(void* h, int iterations, char* err,
                                                              int err_len) {
  auto* handle = static_cast<StepHandle*>(h);
  absl::StatusOr<dropless::cuda_engine::CudaEngine::GemmSeconds> g =
      handle->engine->TimeExpertGemms(iterations);
  if (!g.ok()) {
    SetError(err, err_len, g.status());
    return 1;
  }
  handle->gemm_seconds[0] = g->forward;
  handle->gemm_seconds[1] = g->dgrad;
  handle->gemm_seconds[2] = g->wgrad;
  return 0;
}

// Up to n doubles: peak_mem_bytes (what the engine allocated), loss, fwd_gemm_ms, dgrad_gemm_ms, wgrad_gemm_ms, dispatch_ms,
// combine_ms, data_ms, forward_ms, backward_ms, optimizer_ms, flops. Returns the count written.
__attribute__((visibility("default"))) int dl_step_stats(void* h, double* out, int n) {
  auto* handle = static_cast<StepHandle*>(h);
  const dropless::cuda_engine::CudaStepDetails d = handle->engine->LastStepDetails();
  // The engine's own allocations: the process may hold other frameworks' memory (the peers).
  const double values[] = {static_cast<double>(d.engine_bytes),
                           handle->last.loss,
                           handle->gemm_seconds[0] * 1e3,
                           handle->gemm_seconds[1] * 1e3,
                           handle->gemm_seconds[2] * 1e3,
                           handle->last.dispatch_seconds * 1e3,
                           handle->last.combine_seconds * 1e3,
                           d.data_seconds * 1e3,
                           d.forward_seconds * 1e3,
                           d.backward_seconds * 1e3,
                           d.optimizer_seconds * 1e3,
                           handle->last.flops};
  const int count = std::min<int>(n, static_cast<int>(sizeof(values) / sizeof(values[0])));
  for (int i = 0; i < count; ++i) out[i] = values[i];
  return count;
}

__attribute__((visibility("default"))) void dl_step_destroy(void* h) {
  delete static_cast<StepHandle*>(h);
}

}  // extern "C"
