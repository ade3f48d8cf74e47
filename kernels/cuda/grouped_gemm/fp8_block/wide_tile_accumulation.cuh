// The fp32 accumulator pair (the running sum and the tensor cores' partial sum of one scale block)
// of CUTLASS's blockwise-scaled sm90 mainloop, for the 64 x 192 warp-group tiles of the 192-wide
// m-grouped kernel (96 accumulators a thread). Included by fp8_block_cutlass.cuh, so every
// translation unit that instantiates an fp8-block kernel sees the same definition.
//
// Why our own: with per-row A scales and more than one B scale per tile (192 = 3 x 64 along N),
// CUTLASS 4.2's accumulator class asserts that each scale fragment's shape equals the accumulator
// fragment's, and the B scales' N mode comes out nested ((8, 3) against 24) though it indexes the
// same 96 elements in the same order; and it applies the two scales as two multiplications per
// element. Here the scales are indexed by the accumulator's linear index (a static_assert checks
// the sizes) and their product is formed first, which the compiler evaluates once per distinct
// (row, scale block) pair (2 x 3 a thread) instead of once per element.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_WIDE_TILE_ACCUMULATION_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_WIDE_TILE_ACCUMULATION_CUH_

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/gemm/collective/fp8_accumulation.hpp"

namespace dropless::kernels::fp8_block_gemm {
// 64 x 192 fp32 accumulators over the 128 threads of a warp group.
inline constexpr int kWideTileAccumulators = 96;
}  // namespace dropless::kernels::fp8_block_gemm

namespace cutlass::gemm::collective {

template <class LayoutAccum>
struct GmmaFP8Accumulation<
    cute::ArrayEngine<float, dropless::kernels::fp8_block_gemm::kWideTileAccumulators>,
    LayoutAccum> {
  using EngineAccum =
      cute::ArrayEngine<float, dropless::kernels::fp8_block_gemm::kWideTileAccumulators>;
  using TensorAccum = cute::Tensor<EngineAccum, LayoutAccum>;
  static_assert(cute::is_static<LayoutAccum>::value);

  // The mainloop also passes the promotion interval and the MMAs per K tile; with the scales'
  // K granularity of 128 it promotes after every K tile, so only the uncounted forms below are
  // called (a kernel that needed the counted ones would not compile).
  CUTLASS_DEVICE GmmaFP8Accumulation(TensorAccum& accum, uint32_t, uint32_t)
      : sum_(accum), partial_(cute::make_fragment_like(accum)) {}

  // The tensor cores accumulate into the partial sum.
  CUTLASS_DEVICE TensorAccum& operator()() { return partial_; }

  template <class Scale>
  CUTLASS_DEVICE void scale(const Scale& s) {
    CheckSize<Scale>();
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size(sum_); ++i) sum_(i) += partial_(i) * s(i);
  }
  template <class ScaleA, class ScaleB>
  CUTLASS_DEVICE void scale(const ScaleA& sa, const ScaleB& sb) {
    CheckSize<ScaleA>();
    CheckSize<ScaleB>();
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size(sum_); ++i) sum_(i) += partial_(i) * (sa(i) * sb(i));
  }
  CUTLASS_DEVICE void scale(float s) {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size(sum_); ++i) sum_(i) += partial_(i) * s;
  }

 private:
  template <class Scale>
  static constexpr void CheckSize() {
    static_assert(cute::size(typename Scale::layout_type{}) == cute::size(LayoutAccum{}),
                  "a scale fragment must cover the accumulator fragment element for element");
  }

  TensorAccum& sum_;
  TensorAccum partial_;
};

}  // namespace cutlass::gemm::collective

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_WIDE_TILE_ACCUMULATION_CUH_
