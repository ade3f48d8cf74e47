// The bf16-core MXFP8 m-grouped GEMM's launcher (mx_core.h): checks, tensor maps (encoded on the
// host from pointers alone; a call is one launch and graph-capturable), the launch.
#include "kernels/cuda/grouped_gemm/mxfp8/mx_core.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/grouped_gemm/mxfp8/mx_core_kernel.cuh"
#include "kernels/cuda/grouped_gemm/tma/tensor_map_encode.h"
#include "kernels/cuda/hopper/tma.cuh"

namespace dropless::kernels::mxgemm {
namespace {

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("mx core gemm: ", what, ": ", cudaGetErrorString(e)));
}

// A: E4M3 [rows][k] read in [128 rows][64 bytes] boxes, no swizzle (the consumers read it with
// plain 16-byte shared loads); rows past the buffer read as zero.
absl::Status EncodeActivations(CUtensorMap* map, const uint8_t* data, uint64_t k, uint64_t rows,
                               const char* field) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = hopper::TensorMapEncoder();
  if (encode == nullptr) {
    return absl::InternalError("mx core gemm: cuTensorMapEncodeTiled not found in the driver");
  }
  const cuuint64_t dims[2] = {k, rows};
  const cuuint64_t strides[1] = {k};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(core::kBK), static_cast<cuuint32_t>(core::kBM)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(data), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(
        absl::StrCat(field, ": cuTensorMapEncodeTiled failed (CUresult ", r, ")"));
  }
  return absl::OkStatus();
}

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

namespace {

template <int kCluster>
cudaLaunchConfig_t CoreConfig(int grid, cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(core::kThreads);
  config.dynamicSmemBytes = core::kSmemBytes;
  config.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = kCluster;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  return config;
}

}  // namespace

absl::StatusOr<int> PrepareCore(int cluster, int sms) {
  if (cluster != 1 && cluster != 2) return absl::InvalidArgumentError("cluster: 1 or 2");
  auto kernel = cluster == 1 ? core::MxCoreGemmKernel<1> : core::MxCoreGemmKernel<2>;
  if (absl::Status s = CudaStatus(cudaFuncSetAttribute(kernel,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       core::kSmemBytes),
                                  "cudaFuncSetAttribute(max dynamic shared memory)");
      !s.ok()) {
    return s;
  }
  if (cluster == 1) return sms;
  // As many clusters as can be resident at once (a GPC's SM count need not be even).
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t config = CoreConfig<2>(sms, nullptr, &attr);
  int clusters = 0;
  if (absl::Status s = CudaStatus(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config),
                                  "cudaOccupancyMaxActiveClusters");
      !s.ok()) {
    return s;
  }
  if (clusters <= 0) return absl::InternalError("mx core gemm: no 2x1 cluster fits");
  return std::min(clusters, sms / 2) * 2;
}

absl::Status LaunchCore(const CoreCall& call, int cluster, int grid, const char* a_field,
                        const char* c_field, cudaStream_t stream) {
  if (call.k_red % core::kBK != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        a_field, ": the bf16-core kernel needs a reduction length that is a multiple of 64, not ",
        call.k_red));
  }
  if (call.a.data == nullptr || call.a.scales == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(a_field, ": data and scales must be set"));
  }
  if (!Aligned(call.a.data, 16)) {
    return absl::InvalidArgumentError(absl::StrCat(a_field, ".data must be 16-byte aligned"));
  }
  if (call.image == nullptr || !Aligned(call.image, 16)) {
    return absl::InvalidArgumentError("image: must be set and 16-byte aligned");
  }
  if (call.c == nullptr || !Aligned(call.c, 16)) {
    return absl::InvalidArgumentError(absl::StrCat(c_field, ": must be set and 16-byte aligned"));
  }
  if (call.offsets == nullptr) return absl::InvalidArgumentError("offsets: must be set");
  const int64_t m_tiles = call.max_rows / core::kBM + call.num_groups;
  if (m_tiles * ((call.n_out + core::kBN - 1) / core::kBN) >= (int64_t{1} << 31) - (1 << 20) ||
      call.max_rows >= (int64_t{1} << 31) - 2 * core::kBM) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_rows ", call.max_rows, ": tile or row indices past the int32 range"));
  }
  CUtensorMap map_a, map_b, map_c;
  if (absl::Status s = EncodeActivations(&map_a, call.a.data, call.k_red, call.max_rows, a_field);
      !s.ok()) {
    return s;
  }
  const uint64_t b_dims[3] = {static_cast<uint64_t>(call.k_red), static_cast<uint64_t>(call.n_out),
                              static_cast<uint64_t>(call.num_groups)};
  const uint32_t b_box[3] = {core::kBK, static_cast<uint32_t>(core::kBN / cluster), 1};
  if (absl::Status s = tmagemm::Encode(&map_b, call.image, 3, b_dims, b_box, "image"); !s.ok()) {
    return s;
  }
  const uint64_t c_dims[2] = {static_cast<uint64_t>(call.n_out),
                              static_cast<uint64_t>(call.max_rows)};
  const uint32_t c_box[2] = {64, 64};
  if (absl::Status s = tmagemm::Encode(&map_c, call.c, 2, c_dims, c_box, c_field); !s.ok()) {
    return s;
  }
  core::Params p{};
  p.base.offsets = call.offsets;
  p.base.num_groups = call.num_groups;
  p.base.n_out = call.n_out;
  p.base.k_red = call.k_red;
  p.base.offset_limit = call.max_rows;
  p.base.out = reinterpret_cast<__nv_bfloat16*>(call.c);
  p.a_scales = call.a.scales;
  if (cluster == 2) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config = CoreConfig<2>(grid, stream, &attr);
    return CudaStatus(cudaLaunchKernelEx(&config, core::MxCoreGemmKernel<2>, map_a, map_b, map_c, p),
                      "MxCoreGemmKernel launch");
  }
  core::MxCoreGemmKernel<1><<<grid, core::kThreads, core::kSmemBytes, stream>>>(map_a, map_b,
                                                                                map_c, p);
  return CudaStatus(cudaGetLastError(), "MxCoreGemmKernel launch");
}

}  // namespace dropless::kernels::mxgemm
