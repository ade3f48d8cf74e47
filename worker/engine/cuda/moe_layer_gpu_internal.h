// Helpers shared by the two halves of MoeLayerGpu (moe_layer_gpu.cc: creation and forward;
// moe_layer_gpu_backward.cc: backward). Not for other users.
#ifndef DROPLESS_WORKER_ENGINE_CUDA_MOE_LAYER_GPU_INTERNAL_H_
#define DROPLESS_WORKER_ENGINE_CUDA_MOE_LAYER_GPU_INTERNAL_H_

#include <cuda_bf16.h>

#include "absl/status/status.h"
#include "worker/engine/cuda/moe_layer_gpu.h"

namespace dropless::cuda_engine::layer_internal {

inline const __nv_bfloat16* Nv(const Bf16* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }
inline __nv_bfloat16* Nv(Bf16* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

// Phase spans are optional (the timer may be null).
inline absl::Status Begin(const LayerStreams& s, PhaseTimer::Phase phase, cudaStream_t stream) {
  return s.timer == nullptr ? absl::OkStatus() : s.timer->Begin(phase, stream);
}
inline absl::Status End(const LayerStreams& s, PhaseTimer::Phase phase, cudaStream_t stream) {
  return s.timer == nullptr ? absl::OkStatus() : s.timer->End(phase, stream);
}

}  // namespace dropless::cuda_engine::layer_internal

#endif  // DROPLESS_WORKER_ENGINE_CUDA_MOE_LAYER_GPU_INTERNAL_H_
