// One compiled grouped-GEMM kernel (see ../cutlass_grouped_gemm.cuh).
#include "kernels/cuda/grouped_gemm/cutlass_grouped_gemm.cuh"

DROPLESS_GROUPED_GEMM_INSTANCE(MakeFwdPingpong128x128, kForward, cutlass::bfloat16_t, Pingpong, 128, 128, 64, 1, 2)
