// The parameters of one rank's share of a MoE layer stack, as two flat buffers so that each is
// reduced and updated in one call:
//   replicated: per layer router (H x E), shared w1 ([S] x H x 2F), shared w2 ([S] x F x H);
//               identical on every rank, gradients summed over the world group.
//   experts:    per layer this rank's E / ep experts' w1 ([E/ep] x H x 2F) then w2 ([E/ep] x F x H);
//               gradients summed over the dp group (the replicas of the same experts).
// Initialization draws every value from (seed, layer, tensor, expert id, index), so an expert's
// weights depend only on (seed, layer, expert) wherever it lives.
#ifndef DROPLESS_WORKER_ENGINE_CPU_MOE_MODEL_H_
#define DROPLESS_WORKER_ENGINE_CPU_MOE_MODEL_H_

#include <cstdint>
#include <vector>

#include "common/job_spec.h"
#include "worker/engine/cpu/moe_layer.h"

namespace dropless::cpu {

class MoeParameterLayout {
 public:
  // ep_rank's share of spec.model split over `ep` ranks, for `tokens` tokens per rank.
  MoeParameterLayout(const ModelSpec& model, int64_t ep, int64_t ep_rank, int64_t tokens);

  const MoeLayerShape& layer_shape() const { return shape_; }
  int64_t layers() const { return layers_; }
  int64_t local_experts() const { return local_experts_; }
  int64_t first_expert() const { return first_expert_; }
  int64_t replicated_size() const { return replicated_per_layer_ * layers_; }
  int64_t experts_size() const { return experts_per_layer_ * layers_; }

  // Views of layer `layer` inside the flat buffers; router_bias may be null.
  template <typename T>
  MoeLayerWeights<T> Weights(const T* replicated, const T* experts, int64_t layer,
                             const T* router_bias) const;
  template <typename T>
  MoeLayerGrads<T> Grads(T* replicated, T* experts, int64_t layer) const;

  // Standard-normal draws scaled by 1/sqrt(fan-in): router and w1 by 1/sqrt(H), w2 by
  // 1/sqrt(F * layers * (1 + shared_experts)) (residual-stream scaling).
  template <typename T>
  void Initialize(uint64_t seed, T* replicated, T* experts) const;

  // The draws behind Initialize, one run of consecutive values each: values [offset, offset +
  // count) of the replicated (buffer 0) or experts (buffer 1) buffer are scale * NormalAt(stream,
  // i) for i < count. The CUDA engine fills its device buffers from this list.
  struct NormalFill {
    int buffer = 0;
    int64_t offset = 0;
    uint64_t stream = 0;
    int64_t count = 0;
    double scale = 0;
  };
  std::vector<NormalFill> InitialFills(uint64_t seed) const;

  // The runs of the experts buffer that hold one layer's w1, or w2, of the local experts (per
  // layer, w1 then w2), each with the index its first value has in the single-rank (ep 1) experts
  // buffer: bf16 AdamW moments draw their rounding from that index (kernels/adamw.h), so that
  // every EP layout rounds each expert's moments alike.
  struct ExpertRun {
    int64_t offset = 0;
    int64_t count = 0;
    int64_t global_index = 0;
  };
  std::vector<ExpertRun> ExpertRuns() const;

 private:
  MoeLayerShape shape_;
  int64_t layers_ = 1;
  int64_t local_experts_ = 0;
  int64_t first_expert_ = 0;
  int64_t w1_size_ = 0;  // H x 2F
  int64_t w2_size_ = 0;  // F x H
  int64_t replicated_per_layer_ = 0;
  int64_t experts_per_layer_ = 0;
};

}  // namespace dropless::cpu

#endif  // DROPLESS_WORKER_ENGINE_CPU_MOE_MODEL_H_
