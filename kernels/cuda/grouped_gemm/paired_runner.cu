// Two compiled kernels of one product, the 2x1- and 1x2-cluster tiles, chosen on the device per
// call (kernel_choice.h has the rule and the measurements behind it). Each call launches a
// one-block kernel that sums the groups' tiles and padding from the device offsets and writes the
// choice, then both runners: the one not chosen gives every group M = 0 in its fill kernel, so its
// CUTLASS kernel finds no tile and exits (a few microseconds). No host synchronization; a captured
// graph re-decides on every replay.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/grouped_gemm/kernel_choice.h"
#include "kernels/cuda/grouped_gemm/grouped_gemm_runner.h"

namespace dropless::kernels::grouped_gemm_internal {
namespace {

constexpr int kChooseThreads = 256;

__global__ void __launch_bounds__(kChooseThreads)
    ChooseClusterKernel(const int32_t* __restrict__ offsets, int num_groups, int64_t max_rows,
                        int32_t* __restrict__ choice) {
  __shared__ long long tiles[kChooseThreads], padding[kChooseThreads];
  long long t = 0, p = 0;
  for (int e = threadIdx.x; e < num_groups; e += kChooseThreads) {
    const int64_t begin = min(max(static_cast<int64_t>(offsets[e]), int64_t{0}), max_rows);
    const int64_t end = min(max(static_cast<int64_t>(offsets[e + 1]), begin), max_rows);
    t += GroupTilesM(end - begin);
    p += ClusterPaddingTiles(end - begin);
  }
  tiles[threadIdx.x] = t;
  padding[threadIdx.x] = p;
  __syncthreads();
  for (int s = kChooseThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      tiles[threadIdx.x] += tiles[threadIdx.x + s];
      padding[threadIdx.x] += padding[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *choice = PreferClusterAlongM(tiles[0], padding[0]) ? 1 : 0;
}

class PairedRunner final : public GroupedGemmRunner {
 public:
  PairedRunner(const RunnerShape& shape, std::unique_ptr<GroupedGemmRunner> along_m,
               std::unique_ptr<GroupedGemmRunner> along_n, int32_t* choice)
      : shape_(shape), along_m_(std::move(along_m)), along_n_(std::move(along_n)),
        choice_(choice) {}
  ~PairedRunner() override { cudaFree(choice_); }

  absl::Status Run(const RunnerCall& call, cudaStream_t stream) override {
    if (absl::Status s = LaunchClusterChoice(call.offsets, shape_.num_groups, shape_.max_rows,
                                             choice_, stream);
        !s.ok()) {
      return s;
    }
    RunnerCall gated = call;
    gated.gate = choice_;
    gated.gate_value = 1;
    if (absl::Status s = along_m_->Run(gated, stream); !s.ok()) return s;
    gated.gate_value = 0;
    return along_n_->Run(gated, stream);
  }

 private:
  RunnerShape shape_;
  std::unique_ptr<GroupedGemmRunner> along_m_, along_n_;
  int32_t* choice_;
};

}  // namespace

absl::Status LaunchClusterChoice(const int32_t* offsets, int num_groups, int64_t max_rows,
                                 int32_t* choice, cudaStream_t stream) {
  ChooseClusterKernel<<<1, kChooseThreads, 0, stream>>>(offsets, num_groups, max_rows, choice);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("grouped gemm: cluster-choice launch: ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakePairedRunner(const RunnerShape& shape,
                                                                    RunnerFactory cluster_2x1,
                                                                    RunnerFactory cluster_1x2) {
  auto along_m = cluster_2x1(shape);
  if (!along_m.ok()) return along_m.status();
  auto along_n = cluster_1x2(shape);
  if (!along_n.ok()) return along_n.status();
  void* choice = nullptr;
  cudaError_t err = cudaMalloc(&choice, sizeof(int32_t));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // reported here, not by the next launch check
    return absl::ResourceExhaustedError(
        absl::StrCat("grouped gemm: cudaMalloc: ", cudaGetErrorString(err)));
  }
  return std::unique_ptr<GroupedGemmRunner>(new PairedRunner(
      shape, *std::move(along_m), *std::move(along_n), static_cast<int32_t*>(choice)));
}

}  // namespace dropless::kernels::grouped_gemm_internal
