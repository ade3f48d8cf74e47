// A consumer mainloop (consumer_mainloop.cuh) that covers a warp group's 128 rows in two 64-row
// waves sharing one partial sum, so that a 256-row CTA tile fits the registers.
//
// CUTLASS's consumer keeps a partial sum as large as the running sum: a 256 x 128 cooperative
// tile would need 2 x 128 fp32 registers a thread, past the consumers' 232. Here, per 128-wide K
// block, each warp group issues the wgmmas of its first 64 rows into a 64-register partial sum,
// waits, promotes them into their running sums with their scales, then does the same for its next
// 64 rows: 128 + 64 registers. The CTA tile reads a 256 x 128 activation block and a 128 x 128
// weight block per K block, a ninth less shared-memory traffic per FLOP than a 128 x 192 tile.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_WAVE_PROMOTION_MAINLOOP_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_WAVE_PROMOTION_MAINLOOP_CUH_

#include "kernels/cuda/grouped_gemm/fp8_block/consumer_mainloop.cuh"

namespace dropless::kernels::fp8_block_gemm {

template <class Base>
struct WavePromotion {
  template <class Pipeline, class State, class Accum, class Stage>
  CUTLASS_DEVICE static void Run(Pipeline pipeline, State read, Accum& accum, int k_tile_count,
                                 const Stage& tensors) {
    using namespace cute;
    typename Base::TiledMma tiled_mma;
    // One wgmma atom spans the tile's N (a 64 x N atom), and the waves are the atoms along M.
    static_assert(decltype(size<2>(accum))::value == 1, "one atom along N");
    constexpr int kWaves = decltype(size<1>(accum))::value;

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
        for (int k_block = 0; k_block < size<2>(tensors.a); ++k_block) {
          cute::gemm(tiled_mma, tensors.a(_, wave, k_block, stage), tensors.b(_, 0, k_block, stage),
                     partial);
          tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        }
        warpgroup_commit_batch();
        warpgroup_wait<0>();
        warpgroup_fence_operand(partial);
        Tensor sfa = tensors.scales_a(_, wave, 0, make_coord(_0{}, stage));
        Tensor sfb = tensors.scales_b(_, wave, 0, make_coord(_0{}, stage));
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

template <class CutlassMainloop>
using WavePromotionMainloop = ConsumerMainloop<CutlassMainloop, WavePromotion>;

}  // namespace dropless::kernels::fp8_block_gemm

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_WAVE_PROMOTION_MAINLOOP_CUH_
