// The k-grouped fp8-block kernel of wgrad_coop_128x128x128_c1x2_d4.cu reading X per 128 x 128
// block (Fp8ColwiseScaling::kPerBlock, precision fp8-block-wgrad128), as the transposed product
// dW^T = dY^T X (fp8_block_cutlass.cuh): the N tile has one X scale per K block, which CUTLASS's
// promotion folds into dY's per-column scales, adding each partial sum with one FMA an
// accumulator instead of a multiply and an FMA.
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_cutlass.cuh"

DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeBackwardWeightXBlocksCoop128x128x128C1x2D4, kBackwardWeight,
                                 kCooperative, 128, 128, 128, 1, 2, 1, 4, 128)
