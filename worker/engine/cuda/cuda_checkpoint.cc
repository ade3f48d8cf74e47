#include "worker/engine/cuda/cuda_checkpoint.h"

#include <cuda_runtime.h>

#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
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

// One buffer of n moment elements between the device (fp32 or bf16) and the host (fp32).
absl::Status CopyMoments(float* host, void* device, bool bf16, int64_t n, bool to_host) {
  if (!bf16) {
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    DROPLESS_CUDA_RETURN_IF_ERROR(to_host
                                      ? cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost)
                                      : cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
    return absl::OkStatus();
  }
  std::vector<kernels::Bf16> staging(static_cast<size_t>(n));
  const size_t bytes = staging.size() * sizeof(kernels::Bf16);
  if (to_host) {
    DROPLESS_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(staging.data(), device, bytes, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < n; ++i) host[i] = kernels::Bf16ToFloat(staging[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      staging[i] = kernels::FloatToBf16(kernels::NearestBf16Moment(host[i]));
    }
    DROPLESS_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(device, staging.data(), bytes, cudaMemcpyHostToDevice));
  }
  return absl::OkStatus();
}

absl::Status Copy(HostBuffers& host, const DeviceOptimizerBuffers& device, cudaMemcpyKind kind) {
  const size_t bytes = static_cast<size_t>(device.size) * sizeof(float);
  const bool to_host = kind == cudaMemcpyDeviceToHost;
  DROPLESS_CUDA_RETURN_IF_ERROR(to_host ? cudaMemcpy(host.value.data(), device.value, bytes, kind)
                                        : cudaMemcpy(device.value, host.value.data(), bytes, kind));
  for (auto [h, d] :
       {std::pair{host.m.data(), device.moments.m}, std::pair{host.v.data(), device.moments.v}}) {
    if (absl::Status s = CopyMoments(h, d, device.moments.bf16, device.size, to_host); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteCudaCheckpoint(const std::string& dir, const EngineConfig& config, int rank,
                                 const cpu::MoeParameterLayout& layout,
                                 int64_t step, const DeviceOptimizerBuffers& replicated,
                                 const DeviceOptimizerBuffers& experts) {
  HostBuffers rep(replicated.size), exp(experts.size);
  if (absl::Status s = Copy(rep, replicated, cudaMemcpyDeviceToHost); !s.ok()) return s;
  if (absl::Status s = Copy(exp, experts, cudaMemcpyDeviceToHost); !s.ok()) return s;
  return engine::WriteMoeCheckpoint(dir, engine::MoeCheckpointIdentityOf(config, rank), step, layout,
                                    rep.Spans(), exp.Spans());
}

absl::StatusOr<int64_t> ReadCudaCheckpoint(const std::string& dir, const EngineConfig& config,
                                           int rank, const cpu::MoeParameterLayout& layout,
                                           int64_t step, const DeviceOptimizerBuffers& replicated,
                                           const DeviceOptimizerBuffers& experts) {
  HostBuffers rep(replicated.size), exp(experts.size);
  absl::StatusOr<int64_t> read = engine::ReadMoeCheckpoint(
      dir, engine::MoeCheckpointIdentityOf(config, rank), layout, rep.Spans(), exp.Spans(), step);
  if (!read.ok()) return read.status();
  if (absl::Status s = Copy(rep, replicated, cudaMemcpyHostToDevice); !s.ok()) return s;
  if (absl::Status s = Copy(exp, experts, cudaMemcpyHostToDevice); !s.ok()) return s;
  return *read;
}

}  // namespace dropless::cuda_engine
