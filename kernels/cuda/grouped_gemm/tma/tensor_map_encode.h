// The tensor maps of the bf16 fixed-map kernels (tma/): defined in tma_grouped_gemm.cu, used by its
// launchers and by wgrad_adamw.cu.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_TENSOR_MAP_ENCODE_H_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_TENSOR_MAP_ENCODE_H_

#include <cuda.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dropless::kernels::tmagemm {

// A bf16 (or fp32) tensor of `rank` dims (innermost first, row-major strides) read in
// 128-byte-swizzled boxes; elements outside read as zero. `what` names it in errors.
absl::Status Encode(CUtensorMap* map, const void* data, int rank, const uint64_t* dims,
                    const uint32_t* box, const char* what, bool fp32 = false);

}  // namespace dropless::kernels::tmagemm

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_TMA_TENSOR_MAP_ENCODE_H_
