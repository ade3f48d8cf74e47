// Device allocations of the CUDA engine: one arena that owns every buffer of an engine and counts
// its bytes (the engine's device memory), and the streams/events it forks work onto.
#ifndef DROPLESS_WORKER_ENGINE_CUDA_DEVICE_MEMORY_H_
#define DROPLESS_WORKER_ENGINE_CUDA_DEVICE_MEMORY_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dropless::cuda_engine {

// Owns device allocations until destroyed; Allocate() never returns memory shared with another
// call. Not thread-safe (one per engine).
class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena();

  // count elements of T (at least one byte is allocated; 256-byte aligned by cudaMalloc).
  template <typename T>
  absl::StatusOr<T*> Allocate(int64_t count, const char* what) {
    absl::StatusOr<void*> p = AllocateBytes(static_cast<size_t>(count) * sizeof(T), what);
    if (!p.ok()) return p.status();
    return static_cast<T*>(*p);
  }

  // The same into *out: `DROPLESS_RETURN_IF_ERROR(arena.Allocate(n, "what", &ptr))`.
  template <typename T>
  absl::Status Allocate(int64_t count, const char* what, T** out) {
    absl::StatusOr<T*> p = Allocate<T>(count, what);
    if (!p.ok()) return p.status();
    *out = *p;
    return absl::OkStatus();
  }

  // Pinned host memory; counted separately.
  absl::StatusOr<void*> AllocatePinnedHost(size_t bytes, const char* what);

  // Device memory the engine holds outside the arena (NCCL's symmetric windows): counted in
  // device_bytes(), and so in whether a later failed allocation asked for more than the device.
  void CountHeldElsewhere(int64_t bytes) { device_bytes_ += bytes; }

  // The error of a failed device allocation of `bytes` for `what` (`cause`: the library's
  // message), for the arena's allocations and those made elsewhere (NCCL's symmetric windows).
  // Where it may have failed for want of memory (`out_of_memory`) and the bytes already held plus
  // `bytes` exceed the whole device, the error is marked MarkDeviceTooSmall (common/job_error.h):
  // the job cannot run on a GPU of this size, and the coordinator moves it to larger ones.
  absl::Status AllocationFailure(size_t bytes, const char* what, absl::string_view cause,
                                 bool out_of_memory) const;

  // Every byte of device memory the engine holds, the arena's and what CountHeldElsewhere named.
  int64_t device_bytes() const { return device_bytes_; }
  int64_t pinned_host_bytes() const { return pinned_bytes_; }

 private:
  absl::StatusOr<void*> AllocateBytes(size_t bytes, const char* what);

  std::vector<void*> device_;
  std::vector<void*> pinned_;
  int64_t device_bytes_ = 0;
  int64_t pinned_bytes_ = 0;
};

// Events that order work across the engine's streams, reused capture after capture: Link(from, to)
// makes `to` wait for everything queued on `from` so far (a fork or a join).
class StreamLinks {
 public:
  StreamLinks() = default;
  StreamLinks(const StreamLinks&) = delete;
  StreamLinks& operator=(const StreamLinks&) = delete;
  ~StreamLinks();

  // Starts a new step: events are handed out again from the first.
  void Reset() { next_ = 0; }
  absl::Status Link(cudaStream_t from, cudaStream_t to);

 private:
  std::vector<cudaEvent_t> events_;
  size_t next_ = 0;
};

// Times phases of a step with event pairs (inside a captured graph too); Collect() after the step
// has finished sums each phase's elapsed time. Phases on concurrent streams overlap in wall time.
class PhaseTimer {
 public:
  enum Phase { kData, kForward, kBackward, kOptimizer, kDispatch, kCombine, kGemmForward,
               kGemmDgrad, kGemmWgrad, kNumPhases };

  PhaseTimer() = default;
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;
  ~PhaseTimer();

  void Reset() { next_ = 0; marks_.clear(); }
  // Records the start of a span of `phase` on `stream`; End() its end on the same stream.
  absl::Status Begin(Phase phase, cudaStream_t stream);
  absl::Status End(Phase phase, cudaStream_t stream);
  // Seconds per phase of the last run of the recorded work.
  absl::StatusOr<std::vector<double>> Collect() const;

 private:
  struct Mark {
    Phase phase;
    cudaEvent_t begin = nullptr;
    cudaEvent_t end = nullptr;
  };
  absl::StatusOr<cudaEvent_t> NextEvent();
  static cudaError_t Record(cudaEvent_t event, cudaStream_t stream);

  std::vector<cudaEvent_t> events_;
  size_t next_ = 0;
  std::vector<Mark> marks_;
};

}  // namespace dropless::cuda_engine

#endif  // DROPLESS_WORKER_ENGINE_CUDA_DEVICE_MEMORY_H_
