// The CUDA engine's setup from its EngineConfig: the layers' dimensions (overlap's chunks and the
// expert GEMMs' multiprocessors included) and the EP group's dispatcher.
#ifndef DROPLESS_WORKER_ENGINE_CUDA_ENGINE_SETUP_H_
#define DROPLESS_WORKER_ENGINE_CUDA_ENGINE_SETUP_H_

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "common/engine_config.h"
#include "worker/engine/cuda/device_memory.h"
#include "worker/engine/cuda/ep/expert_dispatcher.h"
#include "worker/engine/cuda/moe_layer_gpu.h"
#include "worker/transport/communicator.h"

namespace dropless::cuda_engine {

// The layers' dimensions for the job. With overlap: up to 4 chunks of the local experts, and the
// expert GEMMs on all but 20 multiprocessors of device 0 (DROPLESS_EXCHANGE_SMS overrides the
// 20, for A/B runs of dropless-bench step). `high_memory_bandwidth`: whether device 0 is
// H200-class (DeviceHasHighMemoryBandwidth), asked of the device where the choice of the fused
// expert update depends on it and nothing is given.
absl::StatusOr<LayerDims> LayerDimsOf(const EngineConfig& config,
                                      std::optional<bool> high_memory_bandwidth = std::nullopt);

// The dispatcher of this process's EP ranks: `local` when it drives more than one (ep_local);
// across processes nccl-lsa (also what `auto` picks at EP > 1 when every rank is load/store
// reachable, else nccl-a2a) or nccl-a2a, their NCCL group joined through groups->store (the
// attempt's rendezvous store); null at EP 1 with `auto` (the permutation is the whole dispatch).
// `links` and `arena` serve `local` and must outlive the dispatcher. FailedPrecondition when the
// job asks for overlap and the dispatcher cannot exchange runs of the local experts.
absl::StatusOr<std::unique_ptr<ExpertDispatcher>> CreateEngineDispatcher(
    const EngineConfig& config, const LayerDims& dims, int rank, int ep_local, RankGroups* groups,
    StreamLinks* links, DeviceArena* arena);

}  // namespace dropless::cuda_engine

#endif  // DROPLESS_WORKER_ENGINE_CUDA_ENGINE_SETUP_H_
