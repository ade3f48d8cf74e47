// The m-grouped fp8-block kernel (see fp8_block_cutlass.cuh) with 256 x 128 x 128 cooperative
// tiles, each warp group's 128 rows in two 64-row waves sharing one partial sum
// (wave_promotion_mainloop.cuh), 1 x 2 clusters; for the forward and the data gradient.
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_cutlass.cuh"

DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeForwardWave256x128x128C1x2, kForward, kCooperativeWaves, 256,
                                 128, 128, 1, 2)
DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeBackwardDataWave256x128x128C1x2, kBackwardData,
                                 kCooperativeWaves, 256, 128, 128, 1, 2)
