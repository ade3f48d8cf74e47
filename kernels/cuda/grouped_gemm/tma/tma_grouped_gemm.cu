// The launchers of the bf16 grouped GEMM kernels with fixed tensor maps (sm_90a, own wgmma kernels,
// no CUTLASS): the tensor maps (encoded on the host from pointers alone, so a call is one launch
// and graph-capturable), the int32 range checks, the cluster occupancy, and the factories that
// grouped_gemm.cc lists. The kernels: the cooperative m-grouped kernel for the forward and the data
// gradient (m_grouped_kernel.cuh, also as a 2 x 1 cluster), its ping-pong variant
// (pingpong_kernel.cuh) and the weight gradient (wgrad_kernel.cuh).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/grouped_gemm/grouped_gemm_runner.h"
#include "kernels/cuda/grouped_gemm/tma/m_grouped_kernel.cuh"
#include "kernels/cuda/grouped_gemm/tma/pingpong_kernel.cuh"
#include "kernels/cuda/grouped_gemm/tma/tensor_map_encode.h"
#include "kernels/cuda/grouped_gemm/tma/wgrad_kernel.cuh"
#include "kernels/cuda/hopper/tma.cuh"

// The runners live beside their kernels (tmagemm); the factories below hand them to
// grouped_gemm.cc.
namespace dropless::kernels::tmagemm {

absl::Status Encode(CUtensorMap* map, const void* data, int rank, const uint64_t* dims,
                    const uint32_t* box, const char* what, bool fp32) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = hopper::TensorMapEncoder();
  if (encode == nullptr) {
    return absl::InternalError(
        "grouped gemm (tma): cuTensorMapEncodeTiled not found in the driver");
  }
  cuuint64_t d[3], strides[2];
  cuuint32_t b[3], element_strides[3] = {1, 1, 1};
  uint64_t stride = fp32 ? 4 : 2;
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    if (i > 0) strides[i - 1] = stride;
    stride *= dims[i];
  }
  const CUresult r =
      encode(map, fp32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank,
             const_cast<void*>(data), d, strides, b, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat(
        "grouped gemm (tma): cuTensorMapEncodeTiled failed for ", what, " (CUresult ", r, ")"));
  }
  return absl::OkStatus();
}

namespace {

using grouped_gemm_internal::GroupedGemmRunner;
using grouped_gemm_internal::RunnerCall;
using grouped_gemm_internal::RunnerShape;
using grouped_gemm_internal::ZeroEmptyGroups;

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("grouped gemm (tma): ", what, ": ", cudaGetErrorString(e)));
}

// kForward: a = X [max_rows][k], b = W [E][k][n], d = Y [rows][n].
// kBackwardData: a = dY [max_rows][n], b = W [E][k][n] (reduction over n), d = dX [rows][k].
// kPingpong: TmaPingpongKernel (128 x 128 tiles per warpgroup), else TmaGroupedGemmKernel.
template <bool kNMajorB, int kCluster, bool kPingpong = false>
class TmaRunner final : public GroupedGemmRunner {
 public:
  explicit TmaRunner(const RunnerShape& shape) : shape_(shape) {}

  static constexpr auto Kernel() {
    if constexpr (kPingpong) {
      return TmaPingpongKernel<kNMajorB>;
    } else {
      return TmaGroupedGemmKernel<kNMajorB, kCluster>;
    }
  }
  static constexpr int kSmem = kPingpong ? kPSmemBytes : kSmemBytes;
  static constexpr int kTileN = kPingpong ? kPBN : kBN;

  absl::Status Init() {
    static_assert(!kPingpong || kCluster == 1, "the ping-pong kernel has no cluster variant");
    // The tile walk counts tiles in int32: at most (max_rows / 128 + one partial tile per group)
    // M tiles times the N tiles.
    const int64_t out = kNMajorB ? shape_.n : shape_.k;
    // Row coordinates (up to max_rows plus a cluster's padding tile) are int32 too.
    const int64_t m_tiles = shape_.max_rows / kBM + shape_.num_groups;
    if (m_tiles * ((out + kTileN - 1) / kTileN) >= (int64_t{1} << 31) - (int64_t{1} << 20) ||
        shape_.max_rows >= (int64_t{1} << 31) - 2 * kBM) {
      return absl::InvalidArgumentError(
          absl::StrCat("grouped gemm (tma): max_rows ", shape_.max_rows, " with ", out,
                       " output columns: tile or row indices past the int32 range"));
    }
    auto kernel = Kernel();
    absl::Status s =
        CudaStatus(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                   "cudaFuncSetAttribute");
    if (!s.ok()) return s;
    grid_ = shape_.sm_count;
    if constexpr (kCluster > 1) {
      // As many clusters as can be resident at once (a GPC's SM count need not be even): a
      // persistent cluster that had to wait for another to exit would run its tiles last.
      cudaLaunchConfig_t config = Config(nullptr);
      cudaLaunchAttribute attr = ClusterAttr();
      config.attrs = &attr;
      config.numAttrs = 1;
      int clusters = 0;
      if (absl::Status st = CudaStatus(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config),
                                       "cudaOccupancyMaxActiveClusters");
          !st.ok()) {
        return st;
      }
      if (clusters <= 0) return absl::InternalError("grouped gemm (tma): no 2x1 cluster fits");
      grid_ = std::min(clusters, shape_.sm_count / kCluster) * kCluster;
    }
    return absl::OkStatus();
  }

  absl::Status Run(const RunnerCall& call, cudaStream_t stream) override {
    if (shape_.max_rows == 0) return absl::OkStatus();
    const uint64_t k = shape_.k, n = shape_.n, e = shape_.num_groups;
    const uint64_t rows = shape_.max_rows;
    const uint64_t red = kNMajorB ? k : n, out = kNMajorB ? n : k;
    CUtensorMap map_a, map_b, map_c;
    const uint64_t a_dims[2] = {red, rows};
    const uint32_t a_box[2] = {kBK, kBM};
    // B = W [E][k][n]: the forward reads [64 k][64 n] boxes of it, the data gradient [256 or 128
    // k][64 n] (the 2 x 1 cluster's CTAs load half each).
    const uint64_t b_dims[3] = {n, k, e};
    const uint32_t b_box[3] = {64, kNMajorB ? static_cast<uint32_t>(kBK) : kTileN / kCluster, 1};
    const uint64_t c_dims[2] = {out, rows};
    const uint32_t c_box[2] = {64, 64};
    if (absl::Status s = Encode(&map_a, call.a, 2, a_dims, a_box, "A"); !s.ok()) return s;
    if (absl::Status s = Encode(&map_b, call.b, 3, b_dims, b_box, "B"); !s.ok()) return s;
    if (absl::Status s = Encode(&map_c, call.d, 2, c_dims, c_box, "D"); !s.ok()) return s;
    Params p{call.offsets,
             shape_.num_groups,
             static_cast<int>(out),
             static_cast<int>(red),
             shape_.max_rows,
             static_cast<__nv_bfloat16*>(call.d),
             call.gate,
             call.gate_value};
    cudaLaunchConfig_t config = Config(stream);
    cudaLaunchAttribute attr = ClusterAttr();
    if (kCluster > 1) {
      config.attrs = &attr;
      config.numAttrs = 1;
    }
    return CudaStatus(cudaLaunchKernelEx(&config, Kernel(), map_a, map_b, map_c, p), "launch");
  }

 private:
  cudaLaunchConfig_t Config(cudaStream_t stream) const {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(grid_ > 0 ? grid_ : shape_.sm_count);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kSmem;
    config.stream = stream;
    return config;
  }
  static cudaLaunchAttribute ClusterAttr() {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = kCluster;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    return attr;
  }

  RunnerShape shape_;
  int grid_ = 0;
};

template <bool kNMajorB, int kCluster, bool kPingpong = false>
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeTma(const RunnerShape& shape) {
  auto runner = std::make_unique<TmaRunner<kNMajorB, kCluster, kPingpong>>(shape);
  absl::Status s = runner->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<GroupedGemmRunner>(std::move(runner));
}

// kBackwardWeight: a = X [max_rows][k], b = dY [max_rows][n], d = dW [E][k][n] (OutT).
template <typename OutT>
class TmaWgradRunner final : public GroupedGemmRunner {
 public:
  explicit TmaWgradRunner(const RunnerShape& shape) : shape_(shape) {}

  absl::Status Init() {
    const int64_t tiles =
        int64_t{shape_.num_groups} * ((shape_.k + kBM - 1) / kBM) * ((shape_.n + kBN - 1) / kBN);
    if (tiles >= (int64_t{1} << 31) - (int64_t{1} << 20) ||
        int64_t{shape_.num_groups} * shape_.k >= (int64_t{1} << 31)) {
      return absl::InvalidArgumentError(
          absl::StrCat("grouped gemm (tma): ", shape_.num_groups, " groups of ", shape_.k, " x ",
                       shape_.n, " weight gradients: tile or row indices past the int32 range"));
    }
    return CudaStatus(cudaFuncSetAttribute(TmaWgradKernel<OutT>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
                      "cudaFuncSetAttribute");
  }

  absl::Status Run(const RunnerCall& call, cudaStream_t stream) override {
    const uint64_t k = shape_.k, n = shape_.n, e = shape_.num_groups;
    // Every group is empty when there are no rows: only the zeroing runs.
    if (absl::Status s = ZeroEmptyGroups(call.offsets, shape_.num_groups, shape_.max_rows,
                                         static_cast<int64_t>(k * n), sizeof(OutT), call.d, stream);
        !s.ok()) {
      return s;
    }
    if (shape_.max_rows == 0) return absl::OkStatus();
    const uint64_t rows = shape_.max_rows;
    CUtensorMap map_x, map_dy, map_c;
    const uint64_t x_dims[2] = {k, rows}, dy_dims[2] = {n, rows}, c_dims[2] = {n, e * k};
    const uint32_t box[2] = {64, kBK};
    const uint32_t c_box[2] = {static_cast<uint32_t>(128 / sizeof(OutT)), 64};
    constexpr bool kF32 = sizeof(OutT) == 4;
    if (absl::Status s = Encode(&map_x, call.a, 2, x_dims, box, "X"); !s.ok()) return s;
    if (absl::Status s = Encode(&map_dy, call.b, 2, dy_dims, box, "dY"); !s.ok()) return s;
    if (absl::Status s = Encode(&map_c, call.d, 2, c_dims, c_box, "dW", kF32); !s.ok()) return s;
    WParams p{call.offsets, shape_.num_groups, shape_.k, shape_.n, shape_.max_rows, call.d};
    TmaWgradKernel<OutT>
        <<<shape_.sm_count, kThreads, kSmemBytes, stream>>>(map_x, map_dy, map_c, p);
    return CudaStatus(cudaGetLastError(), "launch");
  }

 private:
  RunnerShape shape_;
};

template <typename OutT>
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeTmaWgrad(const RunnerShape& shape) {
  auto runner = std::make_unique<TmaWgradRunner<OutT>>(shape);
  absl::Status s = runner->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<GroupedGemmRunner>(std::move(runner));
}

}  // namespace
}  // namespace dropless::kernels::tmagemm

namespace dropless::kernels::grouped_gemm_internal {

absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeFwdTma128x256(const RunnerShape& shape) {
  return tmagemm::MakeTma<true, 1>(shape);
}
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeDgradTma128x256(const RunnerShape& shape) {
  return tmagemm::MakeTma<false, 1>(shape);
}
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeFwdTmaPingpong128x128(
    const RunnerShape& shape) {
  return tmagemm::MakeTma<true, 1, true>(shape);
}
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeDgradTmaPingpong128x128(
    const RunnerShape& shape) {
  return tmagemm::MakeTma<false, 1, true>(shape);
}
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeFwdTma128x256C2x1(const RunnerShape& shape) {
  return tmagemm::MakeTma<true, 2>(shape);
}
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeDgradTma128x256C2x1(
    const RunnerShape& shape) {
  return tmagemm::MakeTma<false, 2>(shape);
}

absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeWgradF32Tma128x256(
    const RunnerShape& shape) {
  return tmagemm::MakeTmaWgrad<float>(shape);
}
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeWgradBf16Tma128x256(
    const RunnerShape& shape) {
  return tmagemm::MakeTmaWgrad<__nv_bfloat16>(shape);
}

}  // namespace dropless::kernels::grouped_gemm_internal
