// The tensor map of a K-major E4M3 GEMM operand, shared by the MXFP8 and fp8-block grouped GEMMs'
// launchers (host code): dims {k_extent, rows, batches}, boxes of 128 bytes (k) x box_rows, 128-byte
// swizzle (the layout wgmma's K-major descriptors read); elements outside read as zero. A operands
// are 2-D maps (batches = 0), B operands 3-D (the kernels issue 3-D copies for B).
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_E4M3_OPERAND_MAP_H_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_E4M3_OPERAND_MAP_H_

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/hopper/tma.cuh"

namespace dropless::kernels::grouped_gemm_internal {

inline absl::Status EncodeE4m3Operand(CUtensorMap* map, const uint8_t* data, uint64_t k_extent,
                                      uint64_t rows, uint64_t batches, uint32_t box_rows,
                                      const char* field) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = hopper::TensorMapEncoder();
  if (encode == nullptr)
    return absl::InternalError("cuTensorMapEncodeTiled not found in the driver");
  const cuuint64_t dims[3] = {k_extent, rows, batches > 0 ? batches : 1};
  const cuuint64_t strides[2] = {k_extent, k_extent * rows};
  const cuuint32_t box[3] = {128, box_rows, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, batches > 0 ? 3 : 2,
                            const_cast<uint8_t*>(data), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(
        absl::StrCat(field, ": cuTensorMapEncodeTiled failed (CUresult ", r, ")"));
  }
  return absl::OkStatus();
}

}  // namespace dropless::kernels::grouped_gemm_internal

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_E4M3_OPERAND_MAP_H_
