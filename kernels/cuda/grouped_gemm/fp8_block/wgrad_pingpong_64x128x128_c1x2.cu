// The k-grouped fp8-block weight gradient (per-column 1 x 128 scales on both operands, fp32 out)
// as a pingpong kernel: each consumer warp group owns a 64 x 128 tile and the two alternate, so
// that one group's epilogue (its tile's 32 KB of gradient) runs while the other's K loop keeps
// the tensor cores busy. For short groups (qwen3: 1024 rows an expert, 8 K blocks a tile).
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_cutlass.cuh"

DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeBackwardWeightPingpong64x128x128C1x2, kBackwardWeight,
                                 kPingpong, 64, 128, 128, 1, 2)
