// The CUDA engine: the CPU engine's model, synthetic task, optimizer and checkpoints on Hopper
// GPUs, one EP rank per process or (the `local` dispatcher) every rank of an EP group in one.
// bf16 operands with fp32 accumulation and fp32 master weights (AdamW in one fused multi-tensor
// kernel that also refreshes the bf16 working copies); precision mxfp8 runs the
// routed experts' GEMMs in MXFP8. The whole step (batch, teacher targets, forward, loss, backward,
// optimizer) is captured once as a CUDA graph and replayed; no host synchronization inside a step
// (the host waits once at its end to read the loss).
//
// Built into libdropless_engine_cuda.so, which the rank process loads only for cuda jobs
// (engine_registry.h); the bench links the same library through its C entry (step_capi.cc).
#ifndef DROPLESS_WORKER_ENGINE_CUDA_CUDA_ENGINE_H_
#define DROPLESS_WORKER_ENGINE_CUDA_CUDA_ENGINE_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/engine.h"
#include "common/engine_config.h"

namespace dropless::cuda_engine {

// Dense bf16 peak of an H100/H200 SXM (datasheet), the MFU denominator on Hopper.
inline constexpr double kHopperDenseBf16PeakFlops = 989.5e12;

// Why the CUDA engine cannot run `config` (one message naming the field), or OK. Needs no GPU.
absl::Status CheckCudaEngineConfig(const EngineConfig& config, int world_size);

// Whether the engine runs the routed experts' AdamW in the epilogue of their weight-gradient GEMM
// for `config` on a device that is H200-class by memory bandwidth or not (bf16, fp32 moments, at
// most 1024 rows expected per local expert, H200-class; DROPLESS_FUSED_EXPERT_ADAMW=1 or 0 forces
// it on or off with either moment width and on any device), as the engine decides it at
// creation. Needs no GPU.
bool FusesExpertUpdate(const EngineConfig& config, bool high_memory_bandwidth = true);
// Whether the engine stores the routed experts' weight gradient in bf16 for `config` (LayerDims::
// bf16_expert_grad: DROPLESS_BF16_EXPERT_GRAD=1, precision bf16 and the two passes, i.e. not
// FusesExpertUpdate on the same class of device), as the engine decides it at creation. Needs no
// GPU.
bool StoresBf16ExpertGradient(const EngineConfig& config, bool high_memory_bandwidth = true);
// Whether mxfp8's expert GEMMs run on the bf16 tensor cores over exact bf16 images of their
// MXFP8 operands for `config` (LayerDims::mx_core: hidden and ffn multiples of 64;
// DROPLESS_MX_CORE=0 keeps the per-32 promotion kernels).
bool UsesMxCore(const EngineConfig& config);
// Whether the backward's expert GEMMs run one at a time for `config` (LayerDims::
// serial_expert_backward: without overlap's chunks, so also with overlap and one local expert;
// DROPLESS_SERIAL_EXPERT_BACKWARD=0 puts them side by side), as the engine decides it at
// creation. Needs no GPU.
bool RunsExpertBackwardOneGemmAtATime(const EngineConfig& config);
// Whether the fp8-block activations are quantized by the passes that produce them for `config`
// (LayerDims::fp8_block_fused_quantizers: the fp8-block precisions, unless
// DROPLESS_FP8_BLOCK_FUSED_QUANTIZERS=0), as the engine decides it at creation. Needs no GPU.
bool FusesFp8BlockQuantizers(const EngineConfig& config);

// Measurements beyond StepStats, for dropless-bench.
struct CudaStepDetails {
  double data_seconds = 0;        // the synthetic batch: tokens and the teacher's targets
  double forward_seconds = 0;
  double backward_seconds = 0;
  double optimizer_seconds = 0;   // AdamW (+ the quantized weights of mxfp8 / fp8-block)
  int64_t engine_bytes = 0;       // device memory the engine allocated itself
};

class CudaEngine : public Engine {
 public:
  // The step's own expert GEMMs timed alone (forward w1+w2, dgrad w2+w1, wgrad w2+w1 of every
  // layer, on the last step's routing), `iterations` times each; seconds per step's worth.
  struct GemmSeconds {
    double forward = 0, dgrad = 0, wgrad = 0;
  };
  virtual absl::StatusOr<GemmSeconds> TimeExpertGemms(int iterations) = 0;
  virtual CudaStepDetails LastStepDetails() const = 0;
  // The synthetic task's targets of the last step (the teacher's output) of every EP rank this
  // process drives, in rank order, [ranks][tokens][hidden] as floats: for tests that every
  // precision fits the same task.
  virtual absl::StatusOr<std::vector<float>> LastTargets() = 0;
};

absl::StatusOr<std::unique_ptr<CudaEngine>> CreateCudaEngine(const EngineConfig& config, int rank,
                                                             int world_size, RankGroups* groups);

// Every rank of an EP group (config.parallel.ep of them, dp 1) in this process on one GPU, each
// with its own model share, buffers and streams, tokens exchanged by the `local` dispatcher
// (ep/expert_dispatcher.h); one step graph for all. Step() reports the group's step (loss over
// the group's tokens, flops of all ranks). For tests and benchmarks of EP on one GPU.
absl::StatusOr<std::unique_ptr<CudaEngine>> CreateLocalEpCudaEngine(const EngineConfig& config);

}  // namespace dropless::cuda_engine

#endif  // DROPLESS_WORKER_ENGINE_CUDA_CUDA_ENGINE_H_
