// Checkpoints of the CUDA engine: its fp32 master weights and AdamW moments live on the device in
// the CPU engine's flat layout (MoeParameterLayout), so they are copied to the host and written,
// or read and copied back, through the one model checkpoint format both engines share
// (worker/engine/checkpoint/moe_checkpoint.h): a CPU checkpoint resumes a CUDA job and back.
#ifndef DROPLESS_WORKER_ENGINE_CUDA_CUDA_CHECKPOINT_H_
#define DROPLESS_WORKER_ENGINE_CUDA_CUDA_CHECKPOINT_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine_config.h"
#include "dropless/kernels/adamw.h"
#include "worker/engine/cpu/moe_model.h"

namespace dropless::cuda_engine {

// Device pointers of one flat parameter buffer (`size` fp32 masters) and its moments (`size` fp32
// or bf16 elements each). The files hold fp32 moments either way: bf16 ones are widened exactly
// when written, and rounded to nearest even when read (a checkpoint of fp32 moments resumes a job
// with bf16 moments, and back).
struct DeviceOptimizerBuffers {
  float* value = nullptr;
  kernels::AdamWMoments moments;
  int64_t size = 0;
};

// The copies run on `stream` (the engine's main stream, a non-blocking one that the legacy
// stream's cudaMemcpy would not wait for, nor be waited for by): after the work that wrote the
// buffers, and finished before these return.
absl::Status WriteCudaCheckpoint(const std::string& dir, const EngineConfig& config, int rank,
                                 const cpu::MoeParameterLayout& layout, int64_t step,
                                 const DeviceOptimizerBuffers& replicated,
                                 const DeviceOptimizerBuffers& experts, cudaStream_t stream);

// Restores this rank's checkpoint of `step` and returns it; NotFound when `dir` holds none of it.
absl::StatusOr<int64_t> ReadCudaCheckpoint(const std::string& dir, const EngineConfig& config,
                                           int rank, const cpu::MoeParameterLayout& layout,
                                           int64_t step, const DeviceOptimizerBuffers& replicated,
                                           const DeviceOptimizerBuffers& experts,
                                           cudaStream_t stream);

}  // namespace dropless::cuda_engine

#endif  // DROPLESS_WORKER_ENGINE_CUDA_CUDA_CHECKPOINT_H_
