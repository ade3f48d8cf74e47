// The 192-wide m-grouped fp8-block kernel (m_grouped_coop_128x192x128_c1x2.cu) without clusters:
// no multicast of A, but a group's N tiles are not rounded up to an even count, so widths whose
// 192-wide tile count is odd (2048: 11 tiles, 2112 columns) are covered within 3%.
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_cutlass.cuh"

DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeForwardCoop128x192x128C1x1, kForward, kCooperative, 128, 192,
                                 128, 1, 1, 2)
DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeBackwardDataCoop128x192x128C1x1, kBackwardData, kCooperative,
                                 128, 192, 128, 1, 1, 2)
