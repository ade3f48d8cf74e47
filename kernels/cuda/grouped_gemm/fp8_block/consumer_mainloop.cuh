// The frame of this folder's consumer mainloops (wave_promotion_mainloop.cuh,
// overlapped_promotion_mainloop.cuh): CUTLASS's blockwise-scaled sm90 ptr-array collective with
// its consumer loop, mma(), replaced by one of ours.
//
// Everything else (the producer's TMA and scale loads, the shared storage, the pipeline, the
// parameters, mma_tail's release of the last stage) stays CUTLASS's, and so does the pipeline
// contract: the consumer releases every stage of the tile but the last, which mma_tail releases.
// CUTLASS 4.2's own consumer (sm90_mma_array_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp)
// keeps one partial sum as large as the running sum: per 128-wide K block it issues the wgmmas
// into it, waits for all of them, and only then scales it into the running sum.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_CONSUMER_MAINLOOP_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_CONSUMER_MAINLOOP_CUH_

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

namespace dropless::kernels::fp8_block_gemm {

// The stage tensors in shared memory for one thread of the consumer warp groups: its warp
// group's operand fragments (descriptors into the stages), a (V, M, K, PIPE) and b (V, N, K,
// PIPE), and its scales partitioned like its accumulator, scales_a and scales_b (V, M, N, (K,
// PIPE)): the scales as (BLK_M, BLK_N, (BLK_K, PIPE)) tensors broadcast (stride 0) along the
// other operand's mode, so that each accumulator element gets its row's and its column's scale.
template <class A, class B, class ScalesA, class ScalesB>
struct ConsumerStage {
  A a;
  B b;
  ScalesA scales_a;
  ScalesB scales_b;
};

template <class Base, class TensorStorage>
CUTLASS_DEVICE auto ConsumerStageTensors(TensorStorage& shared_tensors, int thread_idx) {
  using namespace cute;
  using TileShape = typename Base::TileShape;
  using SmemLayoutSFA = typename Base::SmemLayoutSFA;
  using SmemLayoutSFB = typename Base::SmemLayoutSFB;
  using TiledMma = typename Base::TiledMma;
  Tensor sA =
      make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), typename Base::SmemLayoutA{});
  Tensor sB =
      make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), typename Base::SmemLayoutB{});
  Tensor sSFA = make_tensor(
      make_smem_ptr(shared_tensors.smem_SFA.data()),
      make_layout(
          make_shape(shape<0>(SmemLayoutSFA{}), get<1>(TileShape{}),
                     make_shape(shape<1>(SmemLayoutSFA{}), shape<2>(SmemLayoutSFA{}))),
          make_stride(stride<0>(SmemLayoutSFA{}), _0{},
                      make_stride(stride<1>(SmemLayoutSFA{}), stride<2>(SmemLayoutSFA{})))));
  Tensor sSFB = make_tensor(
      make_smem_ptr(shared_tensors.smem_SFB.data()),
      make_layout(
          make_shape(get<0>(TileShape{}), shape<0>(SmemLayoutSFB{}),
                     make_shape(shape<1>(SmemLayoutSFB{}), shape<2>(SmemLayoutSFB{}))),
          make_stride(_0{}, stride<0>(SmemLayoutSFB{}),
                      make_stride(stride<1>(SmemLayoutSFB{}), stride<2>(SmemLayoutSFB{})))));
  constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
  const Layout warp_group_threads =
      make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
  const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
  TiledMma tiled_mma;
  auto warp_group_mma = tiled_mma.get_slice(warp_group_threads(warp_group));
  auto a = warp_group_mma.make_fragment_A(warp_group_mma.partition_A(sA));
  auto b = warp_group_mma.make_fragment_B(warp_group_mma.partition_B(sB));
  auto scales_a = tiled_mma.get_slice(thread_idx).partition_C(sSFA);
  auto scales_b = tiled_mma.get_slice(thread_idx).partition_C(sSFB);
  return ConsumerStage<decltype(a), decltype(b), decltype(scales_a), decltype(scales_b)>{
      a, b, scales_a, scales_b};
}

// CUTLASS's collective `CutlassMainloop` whose mma() runs Consumer<CutlassMainloop>::Run(pipeline,
// read, accum, k_tile_count, stage): the running sum `accum` over the tile's k_tile_count K
// blocks, starting at stage `read`, with the ConsumerStage tensors `stage`.
template <class CutlassMainloop, template <class> class Consumer>
struct ConsumerMainloop : CutlassMainloop {
  using Base = CutlassMainloop;
  static_assert(Base::ScaleGranularityK == cute::size<2>(typename Base::TileShape{}),
                "one promotion per K tile: the scale blocks are as deep as the tile");

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(typename Base::MainloopPipeline pipeline,
                          typename Base::PipelineState read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, typename Base::TensorStorage& shared_tensors,
                          typename Base::Params const& /*params*/) {
    static_assert(cute::is_rmem<FrgTensorC>::value, "the running sums live in registers");
    const auto stage = ConsumerStageTensors<Base>(shared_tensors, thread_idx);
    CUTE_STATIC_ASSERT_V(cute::size<1>(stage.a) == cute::size<1>(accum));  // M
    CUTE_STATIC_ASSERT_V(cute::size<1>(stage.b) == cute::size<2>(accum));  // N
    Consumer<Base>::Run(pipeline, read, accum, k_tile_count, stage);
  }
};

}  // namespace dropless::kernels::fp8_block_gemm

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_CONSUMER_MAINLOOP_CUH_
