#include "worker/engine/cuda/cuda_checkpoint.h"

#include <cuda_runtime.h>

#include <vector>

#include "absl/strings/str_format.h"
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

absl::Status Copy(HostBuffers& host, const DeviceOptimizerBuffers& device, cudaMemcpyKind kind) {
  const size_t bytes = static_cast<size_t>(device.size) * sizeof(float);
  const bool to_host = kind == cudaMemcpyDeviceToHost;
  std::pair<float*, float*> pairs[3] = {{host.value.data(), device.value},
                                        {host.m.data(), device.m},
                                        {host.v.data(), device.v}};
  for (auto [h, d] : pairs) {
    DROPLESS_CUDA_RETURN_IF_ERROR(to_host ? cudaMemcpy(h, d, bytes, kind) : cudaMemcpy(d, h, bytes, kind));
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
                                           const DeviceOptimizerBuffers& replicated,
                                           const DeviceOptimizerBuffers& experts) {
  HostBuffers rep(replicated.size), exp(experts.size);
  absl::StatusOr<int64_t> step = engine::ReadMoeCheckpoint(
      dir, engine::MoeCheckpointIdentityOf(config, rank), layout, rep.Spans(), exp.Spans());
  if (!step.ok()) return step.status();
  if (absl::Status s = Copy(rep, replicated, cudaMemcpyHostToDevice); !s.ok()) return s;
  if (absl::Status s = Copy(exp, experts, cudaMemcpyHostToDevice); !s.ok()) return s;
  return *step;
}

}  // namespace dropless::cuda_engine
