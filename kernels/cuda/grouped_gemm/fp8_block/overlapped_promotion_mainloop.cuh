// A consumer mainloop (consumer_mainloop.cuh) in which the promotion of one 128-wide K block
// overlaps the tensor cores' work on the next, for tiles whose B operand has one scale per K block
// (the weight gradient of precision fp8-block-wgrad128: X per 128 x 128 block as B of the
// transposed product, fp8_block_cutlass.cuh).
//
// With CUTLASS's consumer (one partial sum, promoted after all of a K block's wgmmas have
// completed) the warp group's tensor-core work stops through every promotion, and the cooperative
// kernel's two warp groups, fed by the same stages, tend to promote at the same time.
//
// Here each warp group keeps two partial sums. K block k is issued into one while the other,
// holding block k - 1, waits only for block k - 1 (`warpgroup_wait<1>`), is promoted, and then
// its stage is released; the tensor cores work on block k meanwhile. With B's one scale a K block
// a thread needs three scales per block (its two rows' A scales and B's), read from the stage's
// shared memory before the wait, folded into two row factors, and one FMA an accumulator. Three
// fp32 fragments a thread (the running sum and two partial sums): 3 x 64 registers for a warp
// group's 64 x 128 accumulator, inside the consumers' 232.
//
// (The same overlap with a scale per column of B, fp8-block's per-column X, was built and
// measured 1-22% slower than CUTLASS's consumer: 32 column scales a thread per block do not fit
// beside the three fragments; the static_assert below keeps it out. In the pingpong schedule this
// consumer was level with CUTLASS's at 1024 rows a group: docs/fp8_block_gemm.md.)
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_OVERLAPPED_PROMOTION_MAINLOOP_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_OVERLAPPED_PROMOTION_MAINLOOP_CUH_

#include "kernels/cuda/grouped_gemm/fp8_block/consumer_mainloop.cuh"

namespace dropless::kernels::fp8_block_gemm {

template <class Base>
struct OverlappedPromotion {
  static_assert(Base::ScaleNsPerTile == 1 && Base::ScaleMsPerTile > 1,
                "B has one scale per K block, A one per row");

  template <class Pipeline, class State, class Accum, class Stage>
  CUTLASS_DEVICE static void Run(Pipeline pipeline, State read, Accum& accum, int k_tile_count,
                                 const Stage& tensors) {
    using namespace cute;
    typename Base::TiledMma tiled_mma;

    Tensor partial_even = make_fragment_like(accum);
    Tensor partial_odd = make_fragment_like(accum);
    clear(accum);
    if (k_tile_count <= 0) return;

    // Issues K tile `stage` into `partial` (starting it from zero).
    auto issue = [&](State stage, auto& partial) {
      pipeline.consumer_wait(stage, pipeline.consumer_try_wait(stage));
      warpgroup_fence_operand(partial);
      warpgroup_arrive();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tensors.a); ++k_block) {
        cute::gemm(tiled_mma, tensors.a(_, _, k_block, stage.index()),
                   tensors.b(_, _, k_block, stage.index()), partial);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(partial);
    };
    // A stage's scales in registers: make_tensor_like keeps the broadcast (stride-0) modes, so
    // the row scales are this thread's distinct rows only (two per 64-row atom) and B's is one.
    Tensor row_scales =
        make_tensor_like<typename Base::ElementBlockScale>(tensors.scales_a(_, _, _, _0{}));
    Tensor column_scales =
        make_tensor_like<typename Base::ElementBlockScale>(tensors.scales_b(_, _, _, _0{}));
    auto load_scales = [&](State stage) {
      copy(tensors.scales_a(_, _, _, make_coord(_0{}, stage.index())), row_scales);
      copy(tensors.scales_b(_, _, _, make_coord(_0{}, stage.index())), column_scales);
    };
    // Scales `from` (a K tile whose wgmmas have completed) into the running sum: B's scale folded
    // into the row scales first, then one FMA an accumulator.
    auto promote = [&](auto& from) {
      const auto b = column_scales(_0{});
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(filter_zeros(row_scales)); ++i) {
        filter_zeros(row_scales)(i) = filter_zeros(row_scales)(i) * b;
      }
      warpgroup_fence_operand(from);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) accum(i) += from(i) * row_scales(i);
      warpgroup_fence_operand(from);
    };
    // Issue K tile `next` into `into`, then finish K tile `previous` (held by `from`) while the
    // tensor cores work on `next`: its scales are read before waiting for its wgmmas, so the
    // shared-memory latency hides under them.
    auto step = [&](State previous, State next, auto& into, auto& from) {
      issue(next, into);
      load_scales(previous);
      warpgroup_wait<1>();
      promote(from);
      pipeline.consumer_release(previous);
    };
    // The last K tile: nothing left to issue.
    auto finish = [&](State last, auto& from) {
      load_scales(last);
      warpgroup_wait<0>();
      promote(from);
    };

    State previous = read;
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

template <class CutlassMainloop>
using OverlappedPromotionMainloop = ConsumerMainloop<CutlassMainloop, OverlappedPromotion>;

}  // namespace dropless::kernels::fp8_block_gemm

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_OVERLAPPED_PROMOTION_MAINLOOP_CUH_
