// A consumer mainloop for CUTLASS's blockwise-scaled sm90 ptr-array mainloop in which the
// promotion of one 128-wide K block overlaps the tensor cores' work on the next.
//
// CUTLASS 4.2's consumer (sm90_mma_array_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp)
// keeps one partial sum: per K block it issues the wgmmas, waits for all of them, and only then
// scales the partial sum into the running sum. Both consumer warp groups of the cooperative
// kernel do that at the same time, so the tensor cores idle through every promotion: for the
// weight gradient that is two operations per accumulator (a row scale and a column scale) and 34
// scale loads a thread, per 128 of K.
//
// Here each warp group keeps two partial sums. K block k is issued into one while the other,
// holding block k - 1, waits only for block k - 1 (`warpgroup_wait<1>`), is promoted with block
// k - 1's scales read from that stage's shared memory, and then its stage is released. The
// tensor cores work on block k meanwhile. Three fp32 fragments a thread (the running sum and two
// partial sums): 3 x 64 registers at 128 x 128 tiles, inside the consumer warp groups' 232.
//
// Everything else (the producer's TMA and scale loads, the shared storage, the pipeline, the
// parameters, mma_tail's release of the last stage) is CUTLASS's: this derives from its
// collective and hides only mma(). The pipeline contract is the same: mma() releases every stage
// of the tile but the last, which mma_tail releases.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_OVERLAPPED_PROMOTION_MAINLOOP_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_OVERLAPPED_PROMOTION_MAINLOOP_CUH_

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

namespace dropless::kernels::fp8_block_gemm {

template <class CutlassMainloop>
struct OverlappedPromotionMainloop : CutlassMainloop {
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
  using ElementScale = typename Base::ElementBlockScale;

  static_assert(Base::ScaleGranularityK == cute::size<2>(TileShape{}),
                "one promotion per K tile: the scale blocks are as deep as the tile");

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors,
                          Params const& /*params*/) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "the running sum lives in registers");

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
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto warp_group_mma = tiled_mma.get_slice(warp_group_threads(warp_group));
    Tensor tCrA = warp_group_mma.make_fragment_A(warp_group_mma.partition_A(sA));
    Tensor tCrB = warp_group_mma.make_fragment_B(warp_group_mma.partition_B(sB));
    Tensor tCsSFA = tiled_mma.get_slice(thread_idx).partition_C(sSFA);
    Tensor tCsSFB = tiled_mma.get_slice(thread_idx).partition_C(sSFB);
    CUTE_STATIC_ASSERT_V(size<1>(tCrA) == size<1>(accum));
    CUTE_STATIC_ASSERT_V(size<1>(tCrB) == size<2>(accum));

    Tensor partial_even = make_fragment_like(accum);
    Tensor partial_odd = make_fragment_like(accum);
    clear(accum);
    if (k_tile_count <= 0) return;

    // Issues K tile `read` into `partial` (starting it from zero).
    auto issue = [&](PipelineState stage, auto& partial) {
      pipeline.consumer_wait(stage, pipeline.consumer_try_wait(stage));
      warpgroup_fence_operand(partial);
      warpgroup_arrive();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        cute::gemm(tiled_mma, tCrA(_, _, k_block, stage.index()),
                   tCrB(_, _, k_block, stage.index()), partial);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(partial);
    };
    // Block `stage`'s scales for this thread's accumulators, from shared memory into registers
    // (2 row scales and 32 column scales a thread; broadcast layouts, so each is read once).
    Tensor row_scales = make_tensor_like<ElementScale>(tCsSFA(_, _, _, _0{}));
    Tensor column_scales = make_tensor_like<ElementScale>(tCsSFB(_, _, _, _0{}));
    auto load_scales = [&](PipelineState stage) {
      copy(tCsSFA(_, _, _, make_coord(_0{}, stage.index())), row_scales);
      copy(tCsSFB(_, _, _, make_coord(_0{}, stage.index())), column_scales);
    };
    // Scales `from` (a K tile whose wgmmas have completed) into the running sum.
    auto promote = [&](auto& from) {
      warpgroup_fence_operand(from);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) {
        accum(i) += from(i) * (row_scales(i) * column_scales(i));
      }
      warpgroup_fence_operand(from);
    };
    // Issue K tile `next` into `into`, then finish K tile `previous` (held by `from`) while the
    // tensor cores work on `next`: its scales are read before waiting for its wgmmas, so the
    // shared-memory latency hides under them.
    auto step = [&](PipelineState previous, PipelineState next, auto& into, auto& from) {
      issue(next, into);
      load_scales(previous);
      warpgroup_wait<1>();
      promote(from);
      pipeline.consumer_release(previous);
    };
    // The last K tile: nothing left to issue.
    auto finish = [&](PipelineState last, auto& from) {
      load_scales(last);
      warpgroup_wait<0>();
      promote(from);
    };

    PipelineState previous = read;
    issue(read, partial_even);
    ++read;
    int k = 1;
    // Two K tiles an iteration, so that each partial sum keeps its registers.
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k + 1 < k_tile_count; k += 2) {
      step(previous, read, partial_odd, partial_even);
      previous = read;
      ++read;
      step(previous, read, partial_even, partial_odd);
      previous = read;
      ++read;
    }
    if (k < k_tile_count) {
      step(previous, read, partial_odd, partial_even);
      finish(read, partial_odd);
    } else {
      finish(previous, partial_even);
    }
    // The last K tile's stage stays held: mma_tail releases it.
  }
};

}  // namespace dropless::kernels::fp8_block_gemm

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_OVERLAPPED_PROMOTION_MAINLOOP_CUH_
