// wgrad_overlap_128x128x128_c1x2.cu with four epilogue store buffers (d4), as
// wgrad_coop_128x128x128_c1x2_d4.cu.
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_cutlass.cuh"

DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeBackwardWeightOverlap128x128x128C1x2D4, kBackwardWeight,
                                 kCooperativeOverlappedPromotion, 128, 128, 128, 1, 2, 1, 4)
