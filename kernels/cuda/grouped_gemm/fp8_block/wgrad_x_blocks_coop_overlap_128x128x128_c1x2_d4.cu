// wgrad_x_blocks_coop_128x128x128_c1x2_d4.cu with our consumer mainloop
// (overlapped_promotion_mainloop.cuh): each warp group promotes one K block while the tensor
// cores work on its next.
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_cutlass.cuh"

DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeBackwardWeightXBlocksCoopOverlap128x128x128C1x2D4,
                                 kBackwardWeight, kCooperativeOverlapped, 128, 128, 128, 1, 2, 1, 4,
                                 128)
