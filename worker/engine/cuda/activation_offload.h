// Activation offload (job spec `activation_offload: true`): the layers' large saved activations
// (permuted rows, w1 output, SwiGLU output, expert outputs at their tokens' rank, the shared
// experts' intermediates) live in a ring of two device slots instead of one set per layer. Layer l
// uses slot l % 2; when layer l + 2's forward is about to overwrite it, layer l's contents have
// been copied to pinned host memory on a copy stream; the backward prefetches them back into the
// slot as soon as layer l + 2's backward is done with it, beside layer l + 1's backward. The last
// two layers never leave the device. Device memory for saved activations: 2 layers' worth instead
// of L. Buffers that EP peers write (the dispatcher's shared memory) stay per layer on the device.
// Every copy is enqueued in stream order with events: capturable, no host synchronization.
#ifndef DROPLESS_WORKER_ENGINE_CUDA_ACTIVATION_OFFLOAD_H_
#define DROPLESS_WORKER_ENGINE_CUDA_ACTIVATION_OFFLOAD_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/cuda/device_memory.h"

namespace dropless::cuda_engine {

// Where a layer's saved activations come from: one device allocation per buffer and layer, or
// the offload ring. Layers must ask for the same buffers in the same order.
class SavedActivations {
 public:
  virtual ~SavedActivations() = default;
  virtual absl::Status Allocate(int64_t layer, size_t bytes, const char* what, void** out) = 0;
  template <typename T>
  absl::Status Allocate(int64_t layer, int64_t count, const char* what, T** out) {
    void* p = nullptr;
    absl::Status s = Allocate(layer, static_cast<size_t>(count) * sizeof(T), what, &p);
    *out = static_cast<T*>(p);
    return s;
  }
};

// Every buffer its own device memory (no offload).
std::unique_ptr<SavedActivations> NewDeviceActivations(DeviceArena* arena);

class ActivationRing final : public SavedActivations {
 public:
  // layers: the model's layer count; the copies run on a stream the ring creates.
  static absl::StatusOr<std::unique_ptr<ActivationRing>> Create(int64_t layers, DeviceArena* arena);
  ~ActivationRing() override;

  absl::Status Allocate(int64_t layer, size_t bytes, const char* what, void** out) override;

  // Step recording, on the rank's main stream. Forward: BeforeForward(l) before layer l's forward
  // (waits for layer l - 2's copy-out), AfterForward(l) after it (copies layer l out when a later
  // layer reuses its slot). Backward: BeforeBackward(l) before layer l's backward (waits for its
  // prefetch), AfterBackward(l) after it (prefetches layer l - 2 into the slot it freed).
  absl::Status BeforeForward(int64_t layer, cudaStream_t main);
  absl::Status AfterForward(int64_t layer, cudaStream_t main);
  absl::Status BeforeBackward(int64_t layer, cudaStream_t main);
  absl::Status AfterBackward(int64_t layer, cudaStream_t main);

  // Device bytes of one slot, and what the ring saves against one set per layer.
  int64_t slot_bytes() const { return slot_bytes_; }
  int64_t device_bytes_saved() const { return slot_bytes_ * std::max<int64_t>(0, layers_ - 2); }

 private:
  explicit ActivationRing(int64_t layers, DeviceArena* arena) : layers_(layers), arena_(arena) {}
  bool Offloaded(int64_t layer) const { return layer + 2 < layers_; }
  absl::Status Copy(int64_t layer, bool to_host);

  struct Buffer {
    void* device = nullptr;
    size_t bytes = 0;
  };
  const int64_t layers_;
  DeviceArena* const arena_;
  cudaStream_t copy_ = nullptr;
  std::vector<std::vector<Buffer>> slots_{2};   // the device buffers of slot 0 and 1
  std::vector<std::vector<void*>> host_;        // [layer][buffer] pinned copies (offloaded layers)
  std::vector<size_t> next_;                    // [layer] buffers handed out so far
  std::vector<cudaEvent_t> forward_done_, copied_out_, backward_done_, copied_in_;  // [layer]
  int64_t slot_bytes_ = 0;
};

}  // namespace dropless::cuda_engine

#endif  // DROPLESS_WORKER_ENGINE_CUDA_ACTIVATION_OFFLOAD_H_
