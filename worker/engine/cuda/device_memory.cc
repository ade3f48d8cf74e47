#include "worker/engine/cuda/device_memory.h"

#include <string>

#include "absl/strings/str_format.h"
#include "common/job_error.h"
#include "kernels/cuda/cuda_check.h"

namespace dropless::cuda_engine {

using kernels::cuda::CudaStatus;

// The destructors release without checking: they have no caller to report a failure to.
DeviceArena::~DeviceArena() {
  for (void* p : device_) (void)cudaFree(p);
  for (void* p : pinned_) (void)cudaFreeHost(p);
}

absl::StatusOr<void*> DeviceArena::AllocateBytes(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t error = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: cleared for the next launch check
    return AllocationFailure(bytes, what, cudaGetErrorString(error),
                             error == cudaErrorMemoryAllocation);
  }
  device_.push_back(p);
  device_bytes_ += static_cast<int64_t>(bytes);
  return p;
}

absl::Status DeviceArena::AllocationFailure(size_t bytes, const char* what, absl::string_view cause,
                                            bool out_of_memory) const {
  // More than the whole device holds is a property of the job (its model and tokens_per_rank)
  // on a GPU of this size: the coordinator places it on larger GPUs only, or fails it when there
  // are none. Less than that may be memory another process holds: a node problem.
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  const bool beyond_device = out_of_memory &&
                             cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess &&
                             static_cast<size_t>(device_bytes_) + bytes > total_bytes;
  (void)cudaGetLastError();
  const std::string message =
      absl::StrFormat("cuda engine: allocating %s (%.2f GiB; %.2f GiB allocated before): %s", what,
                      static_cast<double>(bytes) / (1 << 30),
                      static_cast<double>(device_bytes_) / (1 << 30), cause);
  if (!beyond_device) return absl::ResourceExhaustedError(message);
  return MarkDeviceTooSmall(absl::ResourceExhaustedError(absl::StrFormat(
      "%s; the job needs more than the device's %.2f GiB: fewer tokens_per_rank, a larger "
      "parallel.ep or activation_offload needs less",
      message, static_cast<double>(total_bytes) / (1 << 30))));
}

absl::StatusOr<void*> DeviceArena::AllocatePinnedHost(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t error = cudaMallocHost(&p, bytes == 0 ? 1 : bytes);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrFormat("cuda engine: allocating pinned host memory for %s (%.2f GiB): %s", what,
                        static_cast<double>(bytes) / (1 << 30), cudaGetErrorString(error)));
  }
  pinned_.push_back(p);
  pinned_bytes_ += static_cast<int64_t>(bytes);
  return p;
}

StreamLinks::~StreamLinks() {
  for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
}

absl::Status StreamLinks::Link(cudaStream_t from, cudaStream_t to) {
  if (from == to) return absl::OkStatus();
  if (next_ == events_.size()) {
    cudaEvent_t e = nullptr;
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_.push_back(e);
  }
  cudaEvent_t e = events_[next_++];
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaEventRecord(e, from));
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(to, e, 0));
  return absl::OkStatus();
}

PhaseTimer::~PhaseTimer() {
  for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
}

absl::StatusOr<cudaEvent_t> PhaseTimer::NextEvent() {
  if (next_ == events_.size()) {
    cudaEvent_t e = nullptr;
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    events_.push_back(e);
  }
  return events_[next_++];
}

cudaError_t PhaseTimer::Record(cudaEvent_t event, cudaStream_t stream) {
  // Inside a stream capture the record must be external to become a node that records the event
  // when the graph runs (a plain record only orders the capture); outside one, a plain record.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaError_t e = cudaStreamIsCapturing(stream, &capture); e != cudaSuccess) return e;
  return capture == cudaStreamCaptureStatusActive
             ? cudaEventRecordWithFlags(event, stream, cudaEventRecordExternal)
             : cudaEventRecord(event, stream);
}

absl::Status PhaseTimer::Begin(Phase phase, cudaStream_t stream) {
  absl::StatusOr<cudaEvent_t> e = NextEvent();
  if (!e.ok()) return e.status();
  DROPLESS_CUDA_RETURN_IF_ERROR(Record(*e, stream));
  marks_.push_back(Mark{phase, *e, nullptr});
  return absl::OkStatus();
}

absl::Status PhaseTimer::End(Phase phase, cudaStream_t stream) {
  for (auto it = marks_.rbegin(); it != marks_.rend(); ++it) {
    if (it->phase == phase && it->end == nullptr) {
      absl::StatusOr<cudaEvent_t> e = NextEvent();
      if (!e.ok()) return e.status();
      DROPLESS_CUDA_RETURN_IF_ERROR(Record(*e, stream));
      it->end = *e;
      return absl::OkStatus();
    }
  }
  return absl::InternalError(absl::StrFormat("PhaseTimer: End(%d) without Begin", phase));
}

absl::StatusOr<std::vector<double>> PhaseTimer::Collect() const {
  std::vector<double> seconds(kNumPhases, 0.0);
  for (const Mark& m : marks_) {
    if (m.end == nullptr) continue;
    float ms = 0;
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, m.begin, m.end));
    seconds[m.phase] += ms * 1e-3;
  }
  return seconds;
}

}  // namespace dropless::cuda_engine
