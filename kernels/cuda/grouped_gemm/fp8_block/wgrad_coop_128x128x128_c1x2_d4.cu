// The k-grouped fp8-block kernel (see fp8_block_cutlass.cuh): the weight gradient, per-column
// 1 x 128 scales on both operands (granularity 1 along M and N), fp32 out. 128 x 128 x 128
// cooperative tiles, 1 x 2 clusters (X's tile multicast to two N tiles of dY), and four epilogue
// store buffers (d4: one per 128 x 32 fp32 subtile, WithStoreStages) so that a tile's 64 KB of
// gradient drains under the next tile's mainloop instead of the consumers waiting on it.
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_cutlass.cuh"

DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeBackwardWeightCoop128x128x128C1x2D4, kBackwardWeight,
                                 kCooperative, 128, 128, 128, 1, 2, 1, 4)
