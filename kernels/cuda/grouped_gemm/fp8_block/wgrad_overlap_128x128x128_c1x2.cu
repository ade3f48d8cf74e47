// The k-grouped fp8-block kernel of wgrad_coop_128x128x128_c1x2.cu (per-column 1 x 128 scales on
// both operands, fp32 out, 128 x 128 x 128 cooperative tiles, 1 x 2 clusters) with the
// overlapped-promotion consumer (overlapped_promotion_mainloop.cuh).
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_cutlass.cuh"

DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeBackwardWeightOverlap128x128x128C1x2, kBackwardWeight,
                                 kCooperativeOverlappedPromotion, 128, 128, 128, 1, 2)
