// A consumer mainloop for CUTLASS's blockwise-scaled sm90 ptr-array mainloop that covers a warp
// group's 128 rows in two 64-row waves sharing one partial sum, so that a 256-row CTA tile fits
// the registers.
//
// CUTLASS 4.2's consumer (sm90_mma_array_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp)
// keeps a partial sum as large as the running sum: a 256 x 128 cooperative tile would need
// 2 x 128 fp32 registers a thread, past the consumers' 232. Here, per 128-wide K block, each warp
// group issues the wgmmas of its first 64 rows into a 64-register partial sum, waits, promotes
// them into their running sums with their scales, then does the same for its next 64 rows: 128 +
// 64 registers. The CTA tile reads a 256 x 128 activation block and a 128 x 128 weight block per K
// block, a ninth less shared-memory traffic per FLOP than a 128 x 192 tile.
//
// Everything else (the producer's TMA and scale loads, the shared storage, the pipeline, the
// parameters, mma_tail's release of the last stage) is CUTLASS's: this derives from its
// collective and hides only mma(). The pipeline contract is the same: mma() releases every stage
// of the tile but the last, which mma_tail releases.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_WAVE_PROMOTION_MAINLOOP_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_WAVE_PROMOTION_MAINLOOP_CUH_

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

namespace dropless::kernels::fp8_block_gemm {

template <class CutlassMainloop>
struct WavePromotionMainloop : CutlassMainloop {
  using Base = CutlassMainloop;
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::SmemLayoutSFA;
  using typename Base::SmemLayoutSFB;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  using typename Base::TiledMma;

  static_assert(Base::ScaleGranularityK == cute::size<2>(TileShape{}),
                "one promotion per K tile: the scale blocks are as deep as the tile");

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors,
                          Params const& /*params*/) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "the running sums live in registers");

    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});
    // The scales as (BLK_M, BLK_N, (BLK_K, PIPE)) tensors, broadcast (stride 0) along the other
    // operand's mode, so that partitioning them like the accumulator gives each accumulator
    // element its row's and its column's scale.
    Tensor sSFA = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFA.data()),
        make_layout(make_shape(shape<0>(SmemLayoutSFA{}), get<1>(TileShape{}),
                               make_shape(shape<1>(SmemLayoutSFA{}), shape<2>(SmemLayoutSFA{}))),
                    make_stride(stride<0>(SmemLayoutSFA{}), _0{},
                                make_stride(stride<1>(SmemLayoutSFA{}),
                                            stride<2>(SmemLayoutSFA{})))));
    Tensor sSFB = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFB.data()),
        make_layout(make_shape(get<0>(TileShape{}), shape<0>(SmemLayoutSFB{}),
                               make_shape(shape<1>(SmemLayoutSFB{}), shape<2>(SmemLayoutSFB{}))),
                    make_stride(_0{}, stride<0>(SmemLayoutSFB{}),
                                make_stride(stride<1>(SmemLayoutSFB{}),
                                            stride<2>(SmemLayoutSFB{})))));

    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    const Layout warp_group_threads =
        make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    const int warp_group =
        __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto warp_group_mma = tiled_mma.get_slice(warp_group_threads(warp_group));
    Tensor tCrA = warp_group_mma.make_fragment_A(warp_group_mma.partition_A(sA));  // (V,M,K,P)
    Tensor tCrB = warp_group_mma.make_fragment_B(warp_group_mma.partition_B(sB));  // (V,N,K,P)
    Tensor tCsSFA = tiled_mma.get_slice(thread_idx).partition_C(sSFA);  // (V,M,N,(K,P))
    Tensor tCsSFB = tiled_mma.get_slice(thread_idx).partition_C(sSFB);
    // One wgmma atom spans the tile's N (a 64 x N atom), and the waves are the atoms along M.
    static_assert(decltype(size<2>(accum))::value == 1, "one atom along N");
    constexpr int kWaves = decltype(size<1>(accum))::value;
    CUTE_STATIC_ASSERT_V(size<1>(tCrA) == size<1>(accum));
    CUTE_STATIC_ASSERT_V(size<1>(tCrB) == size<2>(accum));

    Tensor partial = make_fragment_like(accum(_, 0, 0));  // (V): one wave's 64 rows
    clear(accum);
    if (k_tile_count <= 0) return;

    CUTLASS_PRAGMA_NO_UNROLL
    for (int k = 0; k < k_tile_count; ++k) {
      pipeline.consumer_wait(read, pipeline.consumer_try_wait(read));
      const int stage = read.index();
      CUTLASS_PRAGMA_UNROLL
      for (int wave = 0; wave < kWaves; ++wave) {
        warpgroup_fence_operand(partial);
        warpgroup_arrive();
        tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
        CUTLASS_PRAGMA_UNROLL
        for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
          cute::gemm(tiled_mma, tCrA(_, wave, k_block, stage), tCrB(_, 0, k_block, stage),
                     partial);
          tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        }
        warpgroup_commit_batch();
        warpgroup_wait<0>();
        warpgroup_fence_operand(partial);
        Tensor sfa = tCsSFA(_, wave, 0, make_coord(_0{}, stage));
        Tensor sfb = tCsSFB(_, wave, 0, make_coord(_0{}, stage));
        Tensor sum = accum(_, wave, 0);
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(partial); ++i) sum(i) += partial(i) * (sfa(i) * sfb(i));
      }
      // The last K tile's stage stays held: mma_tail releases it.
      if (k + 1 < k_tile_count) pipeline.consumer_release(read);
      ++read;
    }
  }
};

}  // namespace dropless::kernels::fp8_block_gemm

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_WAVE_PROMOTION_MAINLOOP_CUH_
