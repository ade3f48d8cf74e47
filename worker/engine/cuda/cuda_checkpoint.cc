#include "worker/engine/cuda/cuda_checkpoint.h"

#include <cuda_runtime.h>

#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "dropless/kernels/adamw.h"
#include "dropless/kernels/types.h"
#include "kernels/cuda/cuda_check.h"
#include "worker/engine/checkpoint/moe_checkpoint.h"

namespace dropless::cuda_engine {
namespace {

// Host copies of one device buffer with its moments.
struct HostBuffers {
  std::vector<float> value, m, v;
  explicit HostBuffers(int64_t n) : value(n), m(n), v(n) {}
  engine::MoeOptimizerBuffers Spans() {
    return engine::MoeOptimizerBuffers{absl::MakeSpan(value), absl::MakeSpan(m), absl::MakeSpan(v)};
  }
};

// `bytes` from device to host (to_host) or back on `stream`, finished when this returns (the host
// memory is pageable and may be freed right after).
absl::Status CopyOnStream(void* host, void* device, size_t bytes, bool to_host,
                          cudaStream_t stream) {
  DROPLESS_CUDA_RETURN_IF_ERROR(
      to_host ? cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream)
              : cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream));
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

// One buffer of n moment elements between the device (fp32 or bf16) and the host (fp32).
absl::Status CopyMoments(float* host, void* device, bool bf16, int64_t n, bool to_host,
                         cudaStream_t stream) {
  if (!bf16) {
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    return CopyOnStream(host, device, bytes, to_host, stream);
  }
  std::vector<kernels::Bf16> staging(static_cast<size_t>(n));
  const size_t bytes = staging.size() * sizeof(kernels::Bf16);
  if (to_host) {
    DROPLESS_RETURN_IF_ERROR(CopyOnStream(staging.data(), device, bytes, /*to_host=*/true, stream));
    for (int64_t i = 0; i < n; ++i) host[i] = kernels::Bf16ToFloat(staging[i]);
    return absl::OkStatus();
  }
  for (int64_t i = 0; i < n; ++i) {
    staging[i] = kernels::FloatToBf16(kernels::NearestBf16Moment(host[i]));
  }
  return CopyOnStream(staging.data(), device, bytes, /*to_host=*/false, stream);
}

absl::Status Copy(HostBuffers& host, const DeviceOptimizerBuffers& device, bool to_host,
                  cudaStream_t stream) {
  const size_t bytes = static_cast<size_t>(device.size) * sizeof(float);
  DROPLESS_RETURN_IF_ERROR(CopyOnStream(host.value.data(), device.value, bytes, to_host, stream));
  for (auto [h, d] :
       {std::pair{host.m.data(), device.moments.m}, std::pair{host.v.data(), device.moments.v}}) {
    DROPLESS_RETURN_IF_ERROR(CopyMoments(h, d, device.moments.bf16, device.size, to_host, stream));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteCudaCheckpoint(const std::string& dir, const EngineConfig& config, int rank,
                                 const cpu::MoeParameterLayout& layout, int64_t step,
                                 const DeviceOptimizerBuffers& replicated,
                                 const DeviceOptimizerBuffers& experts, cudaStream_t stream) {
  HostBuffers rep(replicated.size), exp(experts.size);
  DROPLESS_RETURN_IF_ERROR(Copy(rep, replicated, /*to_host=*/true, stream));
  DROPLESS_RETURN_IF_ERROR(Copy(exp, experts, /*to_host=*/true, stream));
  return engine::WriteMoeCheckpoint(dir, engine::MoeCheckpointIdentityOf(config, rank), step, layout,
                                    rep.Spans(), exp.Spans());
}

absl::StatusOr<int64_t> ReadCudaCheckpoint(const std::string& dir, const EngineConfig& config,
                                           int rank, const cpu::MoeParameterLayout& layout,
                                           int64_t step, const DeviceOptimizerBuffers& replicated,
                                           const DeviceOptimizerBuffers& experts,
                                           cudaStream_t stream) {
  HostBuffers rep(replicated.size), exp(experts.size);
  absl::StatusOr<int64_t> read = engine::ReadMoeCheckpoint(
      dir, engine::MoeCheckpointIdentityOf(config, rank), layout, rep.Spans(), exp.Spans(), step);
  if (!read.ok()) return read.status();
  DROPLESS_RETURN_IF_ERROR(Copy(rep, replicated, /*to_host=*/false, stream));
  DROPLESS_RETURN_IF_ERROR(Copy(exp, experts, /*to_host=*/false, stream));
  return *read;
}

}  // namespace dropless::cuda_engine
