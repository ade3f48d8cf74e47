// m_grouped_coop_128x192x128_c1x2.cu with six epilogue store buffers (d6): one per 128 x 32 bf16
// subtile of the 128 x 192 tile, so that a tile's output drains under the next tile's mainloop
// (fp8_block_cutlass.cuh, WithStoreStages).
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_cutlass.cuh"

DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeForwardCoop128x192x128C1x2D6, kForward, kCooperative, 128,
                                 192, 128, 1, 2, 2, 6)
DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeBackwardDataCoop128x192x128C1x2D6, kBackwardData,
                                 kCooperative, 128, 192, 128, 1, 2, 2, 6)
