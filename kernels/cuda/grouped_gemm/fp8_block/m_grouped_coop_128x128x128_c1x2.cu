// The m-grouped fp8-block kernel (see fp8_block_cutlass.cuh), bound to the forward and the data
// gradient. Both products give CUTLASS the same kernel type (K-major E4M3 operands, 1 x 128 scales
// on A, 128 x 128 scales on B, bf16 out), so it is compiled once; only the argument fill differs.
//
// 128 x 128 x 128 cooperative tiles (one 128-wide K block per stage: the scales are applied once
// per stage), 1 x 2 clusters: A's tile (the tokens) is multicast to the two CTAs of a cluster,
// which compute neighbouring N tiles of the same group. A 2 x 1 cluster would share the weight tile
// instead, but CUTLASS's grouped scheduler rounds each group's M tiles up to the cluster's M, so
// groups with an odd tile count would compute a tile of padding; along N nothing is wasted while
// n / 128 is even (every shape of bench/gemm_bench_common.h).
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_cutlass.cuh"

DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeForwardCoop128x128x128C1x2, kForward, kCooperative, 128, 128,
                                 128, 1, 2)
DROPLESS_FP8_BLOCK_GEMM_INSTANCE(MakeBackwardDataCoop128x128x128C1x2, kBackwardData, kCooperative,
                                 128, 128, 128, 1, 2)
