// The m-grouped fp8-block kernel (see fp8_block_cutlass.cuh) with the pingpong schedule, bound to
// the forward and the data gradient: 64 x 128 x 128 tiles, one per consumer warp group, the two
// groups alternating so that one tile's epilogue overlaps the other's K loop. 1 x 2 clusters as
// the cooperative kernel (m_grouped_coop_128x128x128_c1x2.cu says why).
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_cutlass.cuh"

DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeForwardPingpong64x128x128C1x2, kForward, kPingpong, 64, 128,
                                 128, 1, 2)
DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeBackwardDataPingpong64x128x128C1x2, kBackwardData, kPingpong,
                                 64, 128, 128, 1, 2)
