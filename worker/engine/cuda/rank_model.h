// RankModel: one EP rank's share of the CUDA engine's model, on the device: its fp32 master
// weights, gradients and AdamW moments in the CPU engine's flat layout (MoeParameterLayout for
// this rank's experts), the bf16 (and quantized) working copies, the fixed teacher (bf16, with a
// forward-only layer of its own in the quantized precisions), the layers and their activations, and
// the streams its work runs on. The engine (cuda_engine.cc) drives one RankModel per EP rank of
// this process through the step.
#ifndef DROPLESS_WORKER_ENGINE_CUDA_RANK_MODEL_H_
#define DROPLESS_WORKER_ENGINE_CUDA_RANK_MODEL_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine_config.h"
#include "worker/engine/cpu/moe_model.h"
#include "worker/engine/cpu/synthetic_task.h"
#include "worker/engine/cuda/activation_offload.h"
#include "worker/engine/cuda/cuda_checkpoint.h"
#include "worker/engine/cuda/device_memory.h"
#include "worker/engine/cuda/engine_kernels.h"
#include "worker/engine/cuda/moe_layer_gpu.h"

namespace dropless::cuda_engine {

// How a TrainableBuffer keeps its gradient: none (the update fused into the weight-gradient
// GEMM), fp32, or bf16 (the routed experts' with LayerDims::bf16_expert_grad).
enum class GradStorage { kNone, kFp32, kBf16 };

// A trainable flat buffer (MoeParameterLayout's replicated or experts buffer) with its gradient
// (`grad` or `grad_bf16`, as GradStorage says; at most one set), AdamW moments (fp32 or bf16, the
// optimizer's moment_dtype) and bf16 working copy.
struct TrainableBuffer {
  float* value = nullptr;
  float* grad = nullptr;
  Bf16* grad_bf16 = nullptr;
  kernels::AdamWMoments moments;
  Bf16* bf16 = nullptr;
  int64_t size = 0;

  // moment_stream: the buffer's rounding stream for bf16 moments (cpu::kReplicatedMoments or
  // cpu::kExpertMoments, as the CPU engine draws them).
  absl::Status Allocate(DeviceArena* arena, int64_t n, MomentDtype moment_dtype,
                        uint32_t moment_stream, GradStorage grad_storage = GradStorage::kFp32);
  DeviceOptimizerBuffers Optimizer() const { return DeviceOptimizerBuffers{value, moments, size}; }
  // The AdamW tensor of elements [offset, offset + n): their masters, gradient and moments (no
  // working copy).
  AdamWTensor Tensor(int64_t offset, int64_t n) const;
};

// The bf16 (and quantized) weights of a model: the student's working copies or the fixed teacher
// (bf16 only: q_w1 and q_w2 empty).
struct ModelWeights {
  Bf16* router = nullptr;      // [L][E][H]
  Bf16* replicated = nullptr;  // the replicated buffer's layout (router region unused)
  Bf16* experts = nullptr;     // the experts buffer's layout
  float* router_bias = nullptr;
  std::vector<QuantizedWeight> q_w1, q_w2;  // per layer, precisions mxfp8 and fp8-block
};

// The AdamW tensors of one layer (FusedAdamW's list indices).
struct OptimizerGroups {
  int router_first = 0, router_count = 0;  // the router and, when there are any, shared experts
  int w1 = -1, w2 = -1;  // -1: updated by the fused weight-gradient GEMM
};

class RankModel {
 public:
  // rank: this rank's index in the job (its tokens and its experts, rank % ep).
  RankModel(const EngineConfig& config, int rank, const LayerDims& dims);
  ~RankModel();

  // Streams, layers, buffers; the teacher and the student initialized from the task's seeds (or
  // the student restored from config.checkpoint.dir at `restore_step`, the step the job's ranks
  // agreed on; 0: none). `timer` may be null (only one rank of a process times its phases);
  // `dispatcher` is null at EP = 1 without an exchange. A restore that fails does not fail
  // Initialize: restore_status() says why, for the engine to agree on with the other ranks.
  absl::Status Initialize(DeviceArena* arena, StreamLinks* links, PhaseTimer* timer,
                          const cpu::TaskSeeds& seeds, ExpertDispatcher* dispatcher,
                          int64_t restore_step);
  const absl::Status& restore_status() const { return restore_status_; }
  // The student restored from `step` instead (an older step every rank holds, when some rank's
  // files of the agreed one are damaged), its working copies rebuilt; restore_status() says how
  // that went (every failure is kept there, for the ranks' next agreement).
  void RestoreAgain(int64_t step);

  int rank() const { return rank_; }
  int64_t layers() const { return layout_.layers(); }
  const LayerDims& dims() const { return dims_; }
  const cpu::MoeParameterLayout& layout() const { return layout_; }
  const LayerStreams& streams() const { return streams_; }
  int64_t steps_restored() const { return steps_restored_; }

  LayerWeights Weights(const ModelWeights& m, int64_t layer) const;
  LayerGrads Grads(int64_t layer) const;
  absl::Status QuantizeExperts(ModelWeights* weights, cudaStream_t stream);
  // AdamW of layer `layer`'s routed-expert w1 (or w2) and the student's quantized copy of it for
  // the next step: fp8-block in one fused pass (FusedAdamW::UpdateFp8Block), mxfp8 as the update
  // then QuantizeWeight of the bf16 copy, bf16 the update alone. After PrepareStep.
  absl::Status UpdateExpertWeight(int64_t layer, bool w1, cudaStream_t stream);

  absl::Status SaveCheckpoint(const std::string& dir, int64_t step);

  // Owned by the engine's step recording.
  LayerKernels* kernels() { return kernels_.get(); }
  // The offload ring of the layers' saved activations (activation_offload), else null.
  ActivationRing* activation_ring() { return ring_; }
  std::vector<std::unique_ptr<MoeLayerGpu>>& layer_list() { return layers_; }
  // The layer the teacher's forward runs through, for every layer of the teacher in turn: the
  // teacher computes in bf16 whatever the precision, so that every precision learns the same
  // task (the CPU engine's teacher is float32). bf16: the student's layer 0 (its buffers are free
  // until the student's forward); quantized precisions: a bf16 forward-only layer, over the
  // student's layer 0's buffers with an exchange (MoeLayerGpu::CreateOver), else of its own.
  MoeLayerGpu* teacher_layer() {
    return teacher_layer_ != nullptr ? teacher_layer_.get() : layers_[0].get();
  }
  FusedAdamW* adamw() { return adamw_.get(); }
  const OptimizerGroups& optimizer_groups(int64_t layer) const { return optimizer_groups_[layer]; }
  TrainableBuffer& replicated() { return replicated_; }
  ModelWeights& student() { return student_; }
  ModelWeights& teacher() { return teacher_; }
  std::vector<Bf16*>& activations() { return activations_; }
  Bf16* target() const { return target_; }
  Bf16* grad_a() const { return grad_a_; }
  Bf16* grad_b() const { return grad_b_; }
  int64_t* step_counter() const { return step_counter_; }
  // The step's statistics gathered on the device (the engine reads rank 0's):
  // [squared error (double)] [aux loss per layer (float)] [tokens per expert per layer (int32)].
  uint8_t* stats() const { return stats_; }
  size_t StatsBytes() const { return CountsOffset() + CountsBytes(); }
  size_t CountsOffset() const { return sizeof(double) + layers() * sizeof(float); }
  size_t CountsBytes() const {
    return static_cast<size_t>(layers() * dims_.experts) * sizeof(int32_t);
  }

 private:
  int64_t RepPerLayer() const { return layout_.replicated_size() / layers(); }
  int64_t ExpPerLayer() const { return layout_.experts_size() / layers(); }
  absl::Status InitializeWeights(uint64_t seed, float* replicated, float* experts);
  absl::Status RefreshWorkingCopies(const float* replicated, const float* experts,
                                    ModelWeights* weights, cudaStream_t stream);
  absl::Status Restore(const std::string& dir, int64_t step);
  // The step counter and the student's working copies (bf16, quantized) from its masters.
  absl::Status LoadWorkingState();
  absl::Status CreateOptimizer();

  const EngineConfig& config_;
  const int rank_;
  const LayerDims dims_;
  const cpu::MoeParameterLayout layout_;
  // layout_'s routed-expert runs (w1, w2 per layer) with their single-rank indices.
  const std::vector<cpu::MoeParameterLayout::ExpertRun> expert_runs_;
  DeviceArena* arena_ = nullptr;
  LayerStreams streams_;
  std::unique_ptr<LayerKernels> kernels_;
  std::unique_ptr<SavedActivations> saved_;
  ActivationRing* ring_ = nullptr;  // saved_, when it is the offload ring
  std::vector<std::unique_ptr<MoeLayerGpu>> layers_;
  // The quantized precisions' bf16 teacher (teacher_layer()); null in bf16.
  std::unique_ptr<LayerKernels> teacher_kernels_;
  std::unique_ptr<SavedActivations> teacher_saved_;
  std::unique_ptr<MoeLayerGpu> teacher_layer_;
  std::unique_ptr<FusedAdamW> adamw_;
  std::vector<OptimizerGroups> optimizer_groups_;
  TrainableBuffer replicated_, experts_;
  ModelWeights student_, teacher_;
  std::vector<Bf16*> activations_;  // x_0 .. x_L
  Bf16* target_ = nullptr;
  Bf16* grad_a_ = nullptr;
  Bf16* grad_b_ = nullptr;
  int64_t* step_counter_ = nullptr;
  uint8_t* stats_ = nullptr;
  int64_t steps_restored_ = 0;
  absl::Status restore_status_;
};

}  // namespace dropless::cuda_engine

#endif  // DROPLESS_WORKER_ENGINE_CUDA_RANK_MODEL_H_
