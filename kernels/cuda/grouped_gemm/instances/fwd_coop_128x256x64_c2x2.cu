// One compiled grouped-GEMM kernel (see ../cutlass_grouped_gemm.cuh).
#include "kernels/cuda/grouped_gemm/cutlass_grouped_gemm.cuh"

DROPLESS_GROUPED_GEMM_INSTANCE(MakeFwdCoop128x256C2x2, kForward, cutlass::bfloat16_t, Cooperative, 128, 256, 64, 2, 2)
