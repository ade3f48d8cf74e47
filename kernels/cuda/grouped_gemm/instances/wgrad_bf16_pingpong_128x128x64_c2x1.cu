// One compiled grouped-GEMM kernel (see ../cutlass_grouped_gemm.cuh).
#include "kernels/cuda/grouped_gemm/cutlass_grouped_gemm.cuh"

DROPLESS_GROUPED_GEMM_INSTANCE(MakeWgradBf16Pingpong128x128, kBackwardWeight, cutlass::bfloat16_t, Pingpong, 128, 128, 64, 2, 1)
