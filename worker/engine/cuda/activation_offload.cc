// ActivationRing and the plain device SavedActivations (activation_offload.h).
#include "worker/engine/cuda/activation_offload.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"

namespace dropless::cuda_engine {
namespace {

class DeviceActivations final : public SavedActivations {
 public:
  explicit DeviceActivations(DeviceArena* arena) : arena_(arena) {}
  absl::Status Allocate(int64_t, size_t bytes, const char* what, void** out) override {
    uint8_t* p = nullptr;
    DROPLESS_RETURN_IF_ERROR(arena_->Allocate(static_cast<int64_t>(bytes), what, &p));
    *out = p;
    return absl::OkStatus();
  }

 private:
  DeviceArena* const arena_;
};

}  // namespace

std::unique_ptr<SavedActivations> NewDeviceActivations(DeviceArena* arena) {
  return std::make_unique<DeviceActivations>(arena);
}

absl::StatusOr<std::unique_ptr<ActivationRing>> ActivationRing::Create(int64_t layers,
                                                                       DeviceArena* arena) {
  if (layers < 1 || arena == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("activation ring: %d layers", layers));
  }
  auto ring = std::unique_ptr<ActivationRing>(new ActivationRing(layers, arena));
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&ring->copy_, cudaStreamNonBlocking));
  ring->host_.resize(layers);
  ring->next_.assign(layers, 0);
  for (auto* events : {&ring->forward_done_, &ring->copied_out_, &ring->backward_done_,
                       &ring->copied_in_}) {
    events->resize(layers, nullptr);
    for (cudaEvent_t& e : *events) {
      DROPLESS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
  }
  return ring;
}

ActivationRing::~ActivationRing() {
  // Teardown: a destructor has no caller to report a failed release to.
  for (auto* events : {&forward_done_, &copied_out_, &backward_done_, &copied_in_}) {
    for (cudaEvent_t e : *events) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
  }
  if (copy_ != nullptr) (void)cudaStreamDestroy(copy_);
}

absl::Status ActivationRing::Allocate(int64_t layer, size_t bytes, const char* what, void** out) {
  if (layer < 0 || layer >= layers_) {
    return absl::InvalidArgumentError(absl::StrFormat("activation ring: layer %d of %d", layer, layers_));
  }
  std::vector<Buffer>& slot = slots_[layer % 2];
  const size_t index = next_[layer]++;
  if (layer < 2) {
    // The slot's buffers are made by its first layer.
    uint8_t* p = nullptr;
    DROPLESS_RETURN_IF_ERROR(arena_->Allocate(static_cast<int64_t>(bytes), what, &p));
    slot.push_back(Buffer{p, bytes});
    if (layer == 0) slot_bytes_ += static_cast<int64_t>(bytes);  // both slots are alike
  } else if (index >= slot.size() || slot[index].bytes != bytes) {
    return absl::InternalError(absl::StrFormat(
        "activation ring: layer %d asks for %s (%d bytes) unlike layer %d", layer, what, bytes,
        layer - 2));
  }
  if (Offloaded(layer)) {
    absl::StatusOr<void*> host = arena_->AllocatePinnedHost(bytes, what);
    if (!host.ok()) return host.status();
    host_[layer].push_back(*host);
  }
  *out = slot[index].device;
  return absl::OkStatus();
}

absl::Status ActivationRing::Copy(int64_t layer, bool to_host) {
  const std::vector<Buffer>& slot = slots_[layer % 2];
  for (size_t i = 0; i < host_[layer].size(); ++i) {
    void* host = host_[layer][i];
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        to_host ? host : slot[i].device, to_host ? slot[i].device : host, slot[i].bytes,
        to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, copy_));
  }
  return absl::OkStatus();
}

absl::Status ActivationRing::BeforeForward(int64_t layer, cudaStream_t main) {
  if (layer < 2) return absl::OkStatus();
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(main, copied_out_[layer - 2], 0));
  return absl::OkStatus();
}

absl::Status ActivationRing::AfterForward(int64_t layer, cudaStream_t main) {
  if (!Offloaded(layer)) return absl::OkStatus();
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaEventRecord(forward_done_[layer], main));
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_, forward_done_[layer], 0));
  DROPLESS_RETURN_IF_ERROR(Copy(layer, /*to_host=*/true));
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaEventRecord(copied_out_[layer], copy_));
  return absl::OkStatus();
}

absl::Status ActivationRing::BeforeBackward(int64_t layer, cudaStream_t main) {
  if (!Offloaded(layer)) return absl::OkStatus();
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(main, copied_in_[layer], 0));
  return absl::OkStatus();
}

absl::Status ActivationRing::AfterBackward(int64_t layer, cudaStream_t main) {
  if (layer < 2 || !Offloaded(layer - 2)) return absl::OkStatus();
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaEventRecord(backward_done_[layer], main));
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_, backward_done_[layer], 0));
  DROPLESS_RETURN_IF_ERROR(Copy(layer - 2, /*to_host=*/false));
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaEventRecord(copied_in_[layer - 2], copy_));
  return absl::OkStatus();
}

}  // namespace dropless::cuda_engine
