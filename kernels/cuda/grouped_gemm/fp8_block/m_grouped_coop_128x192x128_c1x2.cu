// The m-grouped fp8-block kernel with 192-wide N tiles (see fp8_block_cutlass.cuh), bound to the
// forward and the data gradient, like m_grouped_coop_128x128x128_c1x2.cu otherwise.
//
// A 128 x 192 tile does 1.5x the tensor-core work of a 128 x 128 one per 128-wide K block for the
// same A tile, scale loads, pipeline waits and barrier traffic; each consumer warp group holds
// 64 x 192 fp32 accumulators plus as many for the per-block partial product (192 registers). 192
// spans one and a half of the weights' 128-wide scale blocks, so the kernel reads the weight scales
// at a granularity of 64 along N (kWeightScaleSplit = 2: each block's scale repeated twice).
// A shape whose N is not a multiple of 192 ends in a partial tile (n = 4096: 21 whole tiles and one
// third of one).
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_cutlass.cuh"

DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeForwardCoop128x192x128C1x2, kForward, kCooperative, 128, 192,
                                 128, 1, 2, 2)
DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeBackwardDataCoop128x192x128C1x2, kBackwardData, kCooperative,
                                 128, 192, 128, 1, 2, 2)
