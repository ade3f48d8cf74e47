// wgrad_pingpong_64x128x128_c1x2.cu's pingpong schedule reading X per 128 x 128 block
// (Fp8ColwiseScaling::kPerBlock, precision fp8-block-wgrad128), as the transposed product
// dW^T = dY^T X of wgrad_x_blocks_coop_128x128x128_c1x2_d4.cu.
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_cutlass.cuh"

DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeBackwardWeightXBlocksPingpong64x128x128C1x2, kBackwardWeight,
                                 kPingpong, 64, 128, 128, 1, 2, 1, 0, 128)
