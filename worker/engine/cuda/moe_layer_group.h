// One MoE layer across the EP ranks this process drives: each rank's stages (moe_layer_gpu.h)
// around the dispatcher's collective calls (ep/expert_dispatcher.h). With no dispatcher (EP = 1)
// the single rank runs its layer straight through.
#ifndef DROPLESS_WORKER_ENGINE_CUDA_MOE_LAYER_GROUP_H_
#define DROPLESS_WORKER_ENGINE_CUDA_MOE_LAYER_GROUP_H_

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/engine/cuda/ep/expert_dispatcher.h"
#include "worker/engine/cuda/moe_layer_gpu.h"

namespace dropless::cuda_engine {

// One local rank's side of one layer.
struct RankLayer {
  MoeLayerGpu* layer = nullptr;
  LayerWeights weights;
  LayerStreams streams;
  // Forward: x -> x_next; aux_loss may be null (no aux loss: the teacher).
  const Bf16* x = nullptr;
  Bf16* x_next = nullptr;
  float* aux_loss = nullptr;
  // Backward: d_x_next -> d_x and the gradients.
  const Bf16* d_x_next = nullptr;
  Bf16* d_x = nullptr;
  LayerGrads grads;
  LayerOptimizerHooks hooks;
};

absl::Status ForwardLayerGroup(ExpertDispatcher* dispatcher, absl::Span<const RankLayer> ranks);
absl::Status BackwardLayerGroup(ExpertDispatcher* dispatcher, absl::Span<const RankLayer> ranks,
                                float aux_coef);

}  // namespace dropless::cuda_engine

#endif  // DROPLESS_WORKER_ENGINE_CUDA_MOE_LAYER_GROUP_H_
