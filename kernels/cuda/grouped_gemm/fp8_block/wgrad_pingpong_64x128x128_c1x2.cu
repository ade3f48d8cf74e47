// The k-grouped fp8-block kernel (see fp8_block_cutlass.cuh) with the pingpong schedule: the
// weight gradient with 64 x 128 x 128 tiles, one per consumer warp group (two fp32 accumulator
// sets of a 128 x 128 tile would not fit a warp group's registers), so that one tile's fp32 store
// overlaps the next tile's K loop. 1 x 2 clusters as the cooperative kernel.
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_cutlass.cuh"

DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeBackwardWeightPingpong64x128x128C1x2, kBackwardWeight,
                                 kPingpong, 64, 128, 128, 1, 2)
