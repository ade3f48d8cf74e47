// The m-grouped fp8-block kernel of m_grouped_coop_128x128x128_c1x2.cu (activations 1 x 128,
// weights 128 x 128 block scales, bf16 out, 128 x 128 x 128 cooperative tiles, 1 x 2 clusters)
// with the overlapped-promotion consumer (overlapped_promotion_mainloop.cuh), for both products.
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_cutlass.cuh"

DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeForwardOverlap128x128x128C1x2, kForward,
                                 kCooperativeOverlappedPromotion, 128, 128, 128, 1, 2)
DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeBackwardDataOverlap128x128x128C1x2, kBackwardData,
                                 kCooperativeOverlappedPromotion, 128, 128, 128, 1, 2)
