// wgrad_coop_128x128x128_c1x2.cu with four epilogue store buffers (d4): one per 128 x 32 fp32
// subtile of the 128 x 128 tile, so that the 64 KB of a tile's gradient drain under the next
// tile's mainloop (fp8_block_cutlass.cuh, WithStoreStages).
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_cutlass.cuh"

DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeBackwardWeightCoop128x128x128C1x2D4, kBackwardWeight,
                                 kCooperative, 128, 128, 128, 1, 2, 1, 4)
