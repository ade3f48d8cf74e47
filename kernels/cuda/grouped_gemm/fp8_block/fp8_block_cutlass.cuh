// The CUTLASS sm90 ptr-array grouped GEMM with FP8 blockwise scaling (mainloop
// sm90_mma_array_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp: TMA loads of the E4M3
// tiles, cp.async loads of the fp32 scales by a fourth producer warp, the accumulator promoted and
// scaled after every 128-wide K block) bound to one product of fp8_block_grouped_gemm.h. Included
// only by the instance translation units of this folder, one kernel each.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_FP8_BLOCK_CUTLASS_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_FP8_BLOCK_CUTLASS_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "kernels/cuda/grouped_gemm/cutlass_grouped_gemm.cuh"
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_runner.h"
#include "kernels/cuda/grouped_gemm/fp8_block/overlapped_promotion_mainloop.cuh"
#include "kernels/cuda/grouped_gemm/fp8_block/wave_promotion_mainloop.cuh"
#include "kernels/cuda/grouped_gemm/fp8_block/wide_tile_accumulation.cuh"
#include "kernels/cuda/grouped_gemm/grouped_gemm_runner.h"

namespace dropless::kernels::fp8_block_gemm {

inline constexpr int kBlock = 128;

using grouped_gemm_internal::AllocateDevice;
using grouped_gemm_internal::DeviceArray;
using grouped_gemm_internal::LeadingDimStride;

// CUTLASS computes D[M,N] = A[M,K] . B[N,K]^T per group; both operands are K-major here, so the
// tensor cores read E4M3 from shared memory as they require (8-bit wgmma takes K-major only):
//   m-grouped (forward, data gradient)  A = activations [M = group rows][K] row-wise,
//                                       B = the expert's weight [N][K]
//                                       scales: A per (row, K block) [M][K/128] (K-major),
//                                               B per 128 x 128 block [N/128][K/128] (K-major)
//   k-grouped (weight gradient)         A = X column-wise [M = k][K = group's padded tokens],
//                                       B = dY column-wise [N = n][K]
//                                       scales: per (column, K block) [K/128][M] and [K/128][N]
//                                               (MN-major)
//   k-grouped, X per 128 x 128 block    the transposed product dW^T = dY^T X, so that X's one
//   (XScale = 128)                      scale per tile is B's: A = dY column-wise [M = n][K],
//                                       B = X column-wise [N = k][K], scales [K/128][M] and
//                                       [K/128][N/128]; D column-major [M = n][N = k], i.e. dW
//                                       [k][n] row-major. CUTLASS then folds B's scalar into A's
//                                       two row scales a thread and promotes with one FMA an
//                                       accumulator (with X's block on M, each thread would load
//                                       and multiply its 32 column scales every K block: measured
//                                       4-18% slower, docs/fp8_block_gemm.md).
// Both operands' scales have the same major order in each kernel: CUTLASS 4.2's
// Sm1xxBlockwiseScaleConfig::smem_atom_layoutSFB tests majorSFA, not majorSFB.
//
// The m-grouped kernels may tile N wider than the weights' 128-wide scale blocks (192: one and a
// half blocks). CUTLASS needs the scale granularity to divide the tile, so such a kernel reads the
// weight scales at a granularity of 128 / kWeightScaleSplit along N, from a copy in which each
// 128 x 128 block's scale is repeated kWeightScaleSplit times (ExpandWeightScales, per call: the
// same values, so the same products).
template <Product P, int WeightScaleSplit, int XScale>
struct ProductTraits {
  static_assert(XScale == 1, "X's scale granularity is the weight gradient's");
  static constexpr bool kTransposed = false;
  using LayoutD = cutlass::layout::RowMajor;
  static_assert(kBlock % WeightScaleSplit == 0);
  using ElementD = cutlass::bfloat16_t;
  using ScaleConfig =
      cutlass::detail::Sm90BlockwiseScaleConfig<1, kBlock / WeightScaleSplit, kBlock,
                                                cute::GMMA::Major::K, cute::GMMA::Major::K>;
};
template <int WeightScaleSplit, int XScale>
struct ProductTraits<Product::kBackwardWeight, WeightScaleSplit, XScale> {
  static_assert(WeightScaleSplit == 1, "the weight gradient has no weight operand");
  static_assert(XScale == 1 || XScale == kBlock, "X per column or per 128 x 128 block");
  // X per block: dW^T = dY^T X with X as B (above).
  static constexpr bool kTransposed = XScale == kBlock;
  using LayoutD =
      std::conditional_t<kTransposed, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using ElementD = float;
  using ScaleConfig =
      cutlass::detail::Sm90BlockwiseScaleConfig<1, XScale, kBlock, cute::GMMA::Major::MN,
                                                cute::GMMA::Major::MN>;
};

// Cooperative: the two consumer warp groups split one tile's rows and store it together.
// Pingpong: each consumer warp group owns a whole tile and the two alternate, so one group's
// epilogue (the tile's store) runs while the other's mainloop computes; suited to tiles whose K
// loop is short (the weight gradient of small groups), where the store is most of a tile's time.
// (Measured with 64 x 128 x 128 tiles on an H200: the m-grouped products slower than the
// cooperative kernels on every benchmark shape; the weight gradient 7-11% faster at 1024 rows a
// group and 18-21% slower at 2048, hence WeightGradientKernelFor, docs/fp8_block_gemm.md.)
// Cooperative in waves: the cooperative kernel with our consumer mainloop
// (wave_promotion_mainloop.cuh), each warp group's rows in 64-row waves sharing one partial sum,
// for 256-row tiles. Cooperative overlapped: our consumer mainloop
// (overlapped_promotion_mainloop.cuh) keeping two partial sums a warp group, promoting one K
// block while the tensor cores work on the next; only where B has one scale a K block (the
// weight gradient reading X per 128 x 128 block). With a scale per column of B the same consumer
// was slower, and in the pingpong schedule (each warp group a 64 x 128 tile) level at 1024 rows a
// group: both removed (docs/fp8_block_gemm.md).
enum class Schedule { kCooperative, kPingpong, kCooperativeWaves, kCooperativeOverlapped };
template <Schedule S>
struct SchedulePolicies {
  using Mainloop = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8BlockScaledAccum;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};
template <>
struct SchedulePolicies<Schedule::kPingpong> {
  using Mainloop = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8BlockScaledAccum;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};
// The consumer mainloop a schedule runs: CUTLASS's, or one of ours deriving from it.
template <Schedule S, class CutlassMainloop>
struct ScheduleMainloop {
  using type = CutlassMainloop;
};
template <class CutlassMainloop>
struct ScheduleMainloop<Schedule::kCooperativeWaves, CutlassMainloop> {
  using type = WavePromotionMainloop<CutlassMainloop>;
};
template <class CutlassMainloop>
struct ScheduleMainloop<Schedule::kCooperativeOverlapped, CutlassMainloop> {
  using type = OverlappedPromotionMainloop<CutlassMainloop>;
};

// The builder's epilogue with `StoreStages` shared-memory buffers for the output subtiles
// instead of its two (0: unchanged). With one buffer per subtile of the tile, a tile's epilogue
// writes all its subtiles without waiting for an earlier subtile's TMA store to drain, so the
// stores run under the next tile's mainloop; the mainloop's stage count shrinks to make room.
template <class Epilogue, int StoreStages>
struct WithStoreStages {
  using type = Epilogue;
};
template <int StagesC, int StagesD, int FragmentSize, bool ReuseSmemC, bool DelayTmaStore,
          int EpilogueWarpGroups, class... Args, int StoreStages>
struct WithStoreStages<
    cutlass::epilogue::collective::CollectiveEpilogue<
        cutlass::epilogue::Sm90PtrArrayTmaWarpSpecialized<StagesC, StagesD, FragmentSize,
                                                          ReuseSmemC, DelayTmaStore,
                                                          EpilogueWarpGroups>,
        Args...>,
    StoreStages> {
  static_assert(!ReuseSmemC, "no source operand: the store buffers are the output's own");
  using type = cutlass::epilogue::collective::CollectiveEpilogue<
      cutlass::epilogue::Sm90PtrArrayTmaWarpSpecialized<
          StagesC, StoreStages == 0 ? StagesD : StoreStages, FragmentSize, ReuseSmemC,
          DelayTmaStore, EpilogueWarpGroups>,
      Args...>;
};

template <Product P, Schedule S, int TileM, int TileN, int TileK, int ClusterM, int ClusterN,
          int WeightScaleSplit = 1, int StoreStages = 0, int XScale = 1>
struct KernelDef {
  static constexpr int kWeightScaleSplit = WeightScaleSplit;
  static constexpr int kXScale = XScale;
  using Traits = ProductTraits<P, WeightScaleSplit, XScale>;
  static constexpr bool kTransposed = Traits::kTransposed;
  using ElementAB = cutlass::float_e4m3_t;
  using ElementD = typename Traits::ElementD;
  using ElementAccumulator = float;
  using ScaleConfig = typename Traits::ScaleConfig;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using LayoutA = cutlass::layout::RowMajor;     // [M][K]
  using LayoutB = cutlass::layout::ColumnMajor;  // [N][K]
  using LayoutD = typename Traits::LayoutD;
  static constexpr int kAlignAB = 16;
  static constexpr int kAlignD = 16 / sizeof(ElementD);
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;

  // No source operand C: the epilogue only converts and stores the accumulators.
  using BuilderEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator,
      void, LayoutD*, kAlignD, ElementD, LayoutD*, kAlignD,
      typename SchedulePolicies<S>::Epilogue,
      cutlass::epilogue::fusion::LinearCombination<ElementD, ElementAccumulator,
                                                   void>>::CollectiveOp;
  using Epilogue = typename WithStoreStages<BuilderEpilogue, StoreStages>::type;

  using CutlassMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB,
      cute::tuple<LayoutA*, LayoutSFA*>, kAlignAB, ElementAB, cute::tuple<LayoutB*, LayoutSFB*>,
      kAlignAB, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      typename SchedulePolicies<S>::Mainloop>::CollectiveOp;
  using Mainloop = typename ScheduleMainloop<S, CutlassMainloop>::type;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Shape = typename ProblemShape::UnderlyingProblemShape;

  // The scale granularities the mainloop derived from the layouts are the ones of fp8_block.h.
  static_assert(Mainloop::ScaleGranularityK == kBlock);
  static_assert(Mainloop::ScaleGranularityM == 1);
  static_assert(Mainloop::ScaleGranularityN ==
                (P == Product::kBackwardWeight ? XScale : kBlock / WeightScaleSplit));
  static_assert(XScale == 1 || XScale == TileN, "one X scale per N tile and K block");
};

template <class Def>
struct GroupArrays {
  typename Def::Shape* shapes;
  const typename Def::ElementAB** a;
  const typename Def::ElementAB** b;
  const float** sfa;
  const float** sfb;
  typename Def::ElementD** d;
  typename Def::StrideA* stride_a;
  typename Def::StrideB* stride_b;
  typename Def::StrideD* stride_d;
  typename Def::LayoutSFA* layout_sfa;
  typename Def::LayoutSFB* layout_sfb;
};

// One thread per group: problem shape, operand and scale pointers, strides and scale layouts from
// the group's row range (padded row range for the weight gradient).
template <Product P, class Def>
__global__ void FillGroupArrays(GroupArrays<Def> arrays, const int32_t* __restrict__ offsets,
                                int num_groups, int k, int n, int64_t limit, const uint8_t* a,
                                const float* sa, const uint8_t* b, const float* sb, void* d_void) {
  using ElementAB = typename Def::ElementAB;
  using ElementD = typename Def::ElementD;
  const ElementAB* a_el = reinterpret_cast<const ElementAB*>(a);
  const ElementAB* b_el = reinterpret_cast<const ElementAB*>(b);
  ElementD* d = static_cast<ElementD*>(d_void);
  const int64_t kb = k / kBlock, nb = n / kBlock;
  // Weight scale rows per 128 of the weight's N (ExpandWeightScales; 1 when not expanded).
  [[maybe_unused]] constexpr int64_t split = Def::kWeightScaleSplit;
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < num_groups;
       e += blockDim.x * gridDim.x) {
    int64_t begin = min(max(static_cast<int64_t>(offsets[e]), int64_t{0}), limit);
    int64_t end = min(max(static_cast<int64_t>(offsets[e + 1]), begin), limit);
    if constexpr (P == Product::kBackwardWeight) {
      // limit (padded_rows) is a multiple of 128: the widened range stays inside the buffers, and
      // every K tile is whole, with its data and scale pointers aligned.
      begin = begin / kBlock * kBlock;
      end = (end + kBlock - 1) / kBlock * kBlock;
    }
    const int rows = static_cast<int>(end - begin);
    int m, nn, kk;
    if constexpr (P == Product::kForward) {
      m = rows, nn = n, kk = k;
      arrays.a[e] = a_el + begin * k;
      arrays.sfa[e] = sa + begin * kb;
      arrays.b[e] = b_el + static_cast<int64_t>(e) * n * k;
      arrays.sfb[e] = sb + e * nb * split * kb;
      arrays.d[e] = d + begin * n;
      arrays.stride_a[e] = LeadingDimStride<typename Def::StrideA>(k);
      arrays.stride_b[e] = LeadingDimStride<typename Def::StrideB>(k);
      arrays.stride_d[e] = LeadingDimStride<typename Def::StrideD>(n);
    } else if constexpr (P == Product::kBackwardData) {
      m = rows, nn = k, kk = n;
      arrays.a[e] = a_el + begin * n;
      arrays.sfa[e] = sa + begin * nb;
      arrays.b[e] = b_el + static_cast<int64_t>(e) * k * n;
      arrays.sfb[e] = sb + e * kb * split * nb;
      arrays.d[e] = d + begin * k;
      arrays.stride_a[e] = LeadingDimStride<typename Def::StrideA>(n);
      arrays.stride_b[e] = LeadingDimStride<typename Def::StrideB>(n);
      arrays.stride_d[e] = LeadingDimStride<typename Def::StrideD>(k);
    } else {
      // An empty group gets no tile (M = 0); ZeroEmptyGroups writes its zero gradient (K = 0 with
      // tiles would store unscaled, never-promoted accumulators).
      const int64_t padded = limit;
      arrays.d[e] = d + static_cast<int64_t>(e) * k * n;
      if constexpr (Def::kTransposed) {  // dW^T = dY^T X, D column-major [n][k] = dW [k][n]
        m = rows == 0 ? 0 : n, nn = k, kk = rows;
        arrays.a[e] = b_el + begin;
        arrays.sfa[e] = sb + begin / kBlock * n;
        arrays.b[e] = a_el + begin;
        arrays.sfb[e] = sa + begin / kBlock * (k / kBlock);
      } else {
        m = rows == 0 ? 0 : k, nn = n, kk = rows;
        arrays.a[e] = a_el + begin;
        arrays.sfa[e] = sa + begin / kBlock * k;
        arrays.b[e] = b_el + begin;
        arrays.sfb[e] = sb + begin / kBlock * n;
      }
      arrays.stride_a[e] = LeadingDimStride<typename Def::StrideA>(padded);
      arrays.stride_b[e] = LeadingDimStride<typename Def::StrideB>(padded);
      arrays.stride_d[e] = LeadingDimStride<typename Def::StrideD>(n);
    }
    arrays.shapes[e] = {m, nn, kk};
    arrays.layout_sfa[e] = Def::ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(m, nn, kk, 1));
    arrays.layout_sfb[e] = Def::ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(m, nn, kk, 1));
  }
}

// dst[g][r][c] = src[g][r / split][c]: each weight's K-major 128 x 128 block scales [N/128][K/128]
// with every row repeated `split` times, for a kernel that reads them at 128 / split along N.
template <int split>
__global__ void ExpandWeightScales(const float* __restrict__ src, float* __restrict__ dst,
                                   int64_t groups_times_rows, int64_t cols) {
  const int64_t total = groups_times_rows * split * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t c = i % cols, expanded_row = i / cols;
    dst[i] = src[expanded_row / split * cols + c];
  }
}

template <Product P, class Def>
class CutlassRunner final : public Runner {
 public:
  static absl::StatusOr<std::unique_ptr<Runner>> Create(const RunnerShape& shape) {
    auto runner = std::unique_ptr<CutlassRunner>(new CutlassRunner(shape));
    absl::Status status = runner->Init();
    if (!status.ok()) return status;
    return std::unique_ptr<Runner>(std::move(runner));
  }

  absl::Status Run(const RunnerCall& call, cudaStream_t stream) override {
    constexpr bool kGroupedK = P == Product::kBackwardWeight;
    const int64_t limit = kGroupedK ? shape_.padded_rows : shape_.max_rows;
    const int threads = 128;
    const int blocks = (shape_.num_groups + threads - 1) / threads;
    const float* b_scales = call.b_scales;
    if constexpr (Def::kWeightScaleSplit > 1) {
      // Forward: W^T's scales [N = n][K = k]; data gradient: W's [N = k][K = n] (in 128s).
      const int64_t rows = (P == Product::kForward ? shape_.n : shape_.k) / kBlock;
      const int64_t cols = (P == Product::kForward ? shape_.k : shape_.n) / kBlock;
      const int64_t total = shape_.num_groups * rows * Def::kWeightScaleSplit * cols;
      const int expand_blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, 1024));
      ExpandWeightScales<Def::kWeightScaleSplit><<<expand_blocks, 256, 0, stream>>>(
          call.b_scales, expanded_b_scales_.get(), shape_.num_groups * rows, cols);
      b_scales = expanded_b_scales_.get();
    }
    FillGroupArrays<P, Def><<<blocks, threads, 0, stream>>>(
        arrays_, call.offsets, shape_.num_groups, shape_.k, shape_.n, limit, call.a, call.a_scales,
        call.b, b_scales, call.d);
    if (absl::Status s = grouped_gemm_internal::FillLaunchStatus("fp8-block grouped gemm");
        !s.ok()) {
      return s;
    }
    if constexpr (kGroupedK) {
      absl::Status zeroed = grouped_gemm_internal::ZeroEmptyGroups(
          call.offsets, shape_.num_groups, limit, static_cast<int64_t>(shape_.k) * shape_.n,
          sizeof(typename Def::ElementD), call.d, stream);
      if (!zeroed.ok()) return zeroed;
    }
    return grouped_gemm_internal::RunGrouped(gemm_, "fp8-block grouped gemm", stream);
  }

 private:
  explicit CutlassRunner(const RunnerShape& shape) : shape_(shape) {}

  template <class T>
  absl::Status Allocate(DeviceArray<T>* out) {
    auto array = AllocateDevice<T>(static_cast<size_t>(shape_.num_groups));
    if (!array.ok()) return array.status();
    *out = *std::move(array);
    return absl::OkStatus();
  }

  absl::Status Init() {
    for (const absl::Status& s :
         {Allocate(&shapes_), Allocate(&a_), Allocate(&b_), Allocate(&sfa_), Allocate(&sfb_),
          Allocate(&d_), Allocate(&stride_a_), Allocate(&stride_b_), Allocate(&stride_d_),
          Allocate(&layout_sfa_), Allocate(&layout_sfb_)}) {
      if (!s.ok()) return s;
    }
    if constexpr (Def::kWeightScaleSplit > 1) {
      // Slack past the last weight: where a group's last N tile is partial, the mainloop's scale
      // loads are not all predicated off past N (compute-sanitizer saw the tile's third scale row
      // read past a 128-wide weight's two), so up to a tile's scale rows of every K block may be
      // read past the last group's scales. They only scale columns that are never stored.
      const size_t max_cols = static_cast<size_t>(std::max(shape_.n, shape_.k) / kBlock);
      constexpr int kTileN = cute::size<1>(typename Def::TileShape{});
      const size_t slack =
          static_cast<size_t>(kTileN / (kBlock / Def::kWeightScaleSplit)) * max_cols;
      const size_t count = static_cast<size_t>(shape_.num_groups) * (shape_.n / kBlock) *
                               (shape_.k / kBlock) * Def::kWeightScaleSplit +
                           slack;
      auto expanded = AllocateDevice<float>(count);
      if (!expanded.ok()) return expanded.status();
      expanded_b_scales_ = *std::move(expanded);
      if (cudaError_t err = cudaMemset(expanded_b_scales_.get(), 0, count * sizeof(float));
          err != cudaSuccess) {
        return absl::InternalError(
            absl::StrCat("fp8-block grouped gemm: cudaMemset: ", cudaGetErrorString(err)));
      }
    }
    arrays_ = {shapes_.get(),   a_.get(),        b_.get(),        sfa_.get(),
               sfb_.get(),      d_.get(),        stride_a_.get(), stride_b_.get(),
               stride_d_.get(), layout_sfa_.get(), layout_sfb_.get()};

    typename Def::Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {shape_.num_groups, shapes_.get(), nullptr},
        {a_.get(), stride_a_.get(), b_.get(), stride_b_.get(), sfa_.get(), layout_sfa_.get(),
         sfb_.get(), layout_sfb_.get()},
        {{}, nullptr, nullptr, d_.get(), stride_d_.get()},
        cutlass::KernelHardwareInfo{0, shape_.sm_count}};
    // Consecutive tiles move along M (they share one B tile, and the CTAs sweep A): every
    // product but the transposed weight gradient (X per 128 x 128 block, M = n, N = k), which
    // moves along N where M > N, so that the operand the CTAs sweep is the smaller one and stays
    // in L2 from one column of tiles to the next (an H100, same process: mixtral w13, M = 28672,
    // +16%; dsv3 EP-8 w2, M = 7168 and N = 2048, +2-3%; along N where M < N lost 4-11%;
    // docs/fp8_block_gemm.md). Group sizes stay on the device, so the order follows the weights'
    // fixed dimensions only.
    using RasterOrder = cutlass::gemm::kernel::detail::RasterOrderOptions;
    args.scheduler.raster_order = RasterOrder::AlongM;
    if constexpr (P == Product::kBackwardWeight && Def::kTransposed) {
      if (shape_.n > shape_.k) args.scheduler.raster_order = RasterOrder::AlongN;
    }
    args.scheduler.max_swizzle_size = 1;
    return grouped_gemm_internal::InitializeGrouped(gemm_, args, &workspace_,
                                                    "fp8-block grouped gemm");
  }

  RunnerShape shape_;
  DeviceArray<typename Def::Shape> shapes_;
  DeviceArray<const typename Def::ElementAB*> a_, b_;
  DeviceArray<const float*> sfa_, sfb_;
  DeviceArray<typename Def::ElementD*> d_;
  DeviceArray<typename Def::StrideA> stride_a_;
  DeviceArray<typename Def::StrideB> stride_b_;
  DeviceArray<typename Def::StrideD> stride_d_;
  DeviceArray<typename Def::LayoutSFA> layout_sfa_;
  DeviceArray<typename Def::LayoutSFB> layout_sfb_;
  DeviceArray<uint8_t> workspace_;
  DeviceArray<float> expanded_b_scales_;  // kWeightScaleSplit > 1 only
  GroupArrays<Def> arrays_{};
  typename Def::Gemm gemm_;
};

}  // namespace dropless::kernels::fp8_block_gemm

// Defines `Factory`, a RunnerFactory for one product, schedule and tile configuration (and, last,
// the weight-scale split of KernelDef, 1 unless the N tile is not a multiple of 128, its
// epilogue store stages, 0 for the builder's, and X's scale granularity, 1 unless the weight
// gradient reads X per 128 x 128 block).
#define DROPLESS_FP8_BLOCK_GEMM_INSTANCE(Factory, P, S, TM, TN, TK, CM, CN, ...)                \
  namespace dropless::kernels::fp8_block_gemm {                                                 \
  absl::StatusOr<std::unique_ptr<Runner>> Factory(const RunnerShape& shape) {                   \
    return CutlassRunner<Product::P, KernelDef<Product::P, Schedule::S, TM, TN, TK, CM, CN,     \
                                               ##__VA_ARGS__>>::Create(shape);                  \
  }                                                                                             \
  }

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_FP8_BLOCK_FP8_BLOCK_CUTLASS_CUH_
