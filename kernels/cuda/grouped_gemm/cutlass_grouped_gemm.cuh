// The CUTLASS sm90 ptr-array grouped GEMM (TMA loads, warp-specialized persistent kernel, TMA
// descriptors rewritten on the device per group) bound to one of the three products of
// grouped_gemm.h. Included only by the instance translation units in instances/: each one compiles
// a single tile configuration, so that a change of one tile shape rebuilds one file.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_CUTLASS_GROUPED_GEMM_CUH_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_CUTLASS_GROUPED_GEMM_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "kernels/cuda/grouped_gemm/grouped_gemm_runner.h"

namespace dropless::kernels::grouped_gemm_internal {

struct Cooperative {
  static constexpr const char* kName = "coop";
  using Mainloop = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};

struct Pingpong {
  static constexpr const char* kName = "pingpong";
  using Mainloop = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};

// GEMM operand roles per product (CUTLASS computes D[M,N] = A[M,K] . B[K,N] per group):
//   kForward        A = X_e  [m_e, k] row-major    B = W[e]   [k, n] row-major (N-major)
//   kBackwardData   A = dY_e [m_e, n] row-major    B = W[e]^T [n, k] read K-major from W[e]
//   kBackwardWeight A = X_e^T [k, m_e] M-major     B = dY_e   [m_e, n] N-major
template <GroupedGemmOp Op, class ElementD_, class Schedule, int TileM, int TileN, int TileK,
          int ClusterM, int ClusterN>
struct KernelDef {
  using ElementAB = cutlass::bfloat16_t;
  using ElementD = ElementD_;
  using ElementAccumulator = float;
  using LayoutA = std::conditional_t<Op == GroupedGemmOp::kBackwardWeight,
                                     cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutB = std::conditional_t<Op == GroupedGemmOp::kBackwardData,
                                     cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 16 / sizeof(ElementAB);
  static constexpr int kAlignD = 16 / sizeof(ElementD);
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;

  // No source operand C: the epilogue only converts and stores the accumulators.
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator,
      void, LayoutD*, kAlignD, ElementD, LayoutD*, kAlignD, typename Schedule::Epilogue,
      cutlass::epilogue::fusion::LinearCombination<ElementD, ElementAccumulator,
                                                   void>>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA*, kAlignAB,
      ElementAB, LayoutB*, kAlignAB, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      typename Schedule::Mainloop>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Shape = typename ProblemShape::UnderlyingProblemShape;
};

// Each layout's stride holds one run-time value, the leading dimension; the other modes are static.
template <class Stride>
__device__ inline Stride LeadingDimStride(int64_t ld) {
  Stride stride{};
  if constexpr (cute::is_static<std::remove_reference_t<decltype(cute::get<0>(stride))>>::value) {
    cute::get<1>(stride) = ld;
  } else {
    cute::get<0>(stride) = ld;
  }
  return stride;
}

template <class Def>
struct GroupArrays {
  typename Def::Shape* shapes;
  const typename Def::ElementAB** a;
  const typename Def::ElementAB** b;
  typename Def::ElementD** d;
  typename Def::StrideA* stride_a;
  typename Def::StrideB* stride_b;
  typename Def::StrideD* stride_d;
};

// One thread per group: problem shape, operand pointers and strides from the group's row range.
template <GroupedGemmOp Op, class Def>
__global__ void FillGroupArrays(GroupArrays<Def> arrays, const int32_t* __restrict__ offsets,
                                int num_groups, int k, int n, int64_t max_rows,
                                const typename Def::ElementAB* a, const typename Def::ElementAB* b,
                                typename Def::ElementD* d, const int32_t* __restrict__ gate,
                                int32_t gate_value) {
  // Not chosen (RunnerCall::gate): every group gets M = 0, so the GEMM finds no tile.
  const bool off = gate != nullptr && *gate != gate_value;
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < num_groups;
       e += blockDim.x * gridDim.x) {
    const int64_t begin = min(max(static_cast<int64_t>(offsets[e]), int64_t{0}), max_rows);
    const int64_t end = off ? begin : min(max(static_cast<int64_t>(offsets[e + 1]), begin), max_rows);
    const int m = static_cast<int>(end - begin);
    const int64_t weight = static_cast<int64_t>(e) * k * n;
    if constexpr (Op == GroupedGemmOp::kForward) {
      arrays.shapes[e] = {m, n, k};
      arrays.a[e] = a + begin * k;
      arrays.b[e] = b + weight;
      arrays.d[e] = d + begin * n;
      arrays.stride_a[e] = LeadingDimStride<typename Def::StrideA>(k);
      arrays.stride_b[e] = LeadingDimStride<typename Def::StrideB>(n);
      arrays.stride_d[e] = LeadingDimStride<typename Def::StrideD>(n);
    } else if constexpr (Op == GroupedGemmOp::kBackwardData) {
      arrays.shapes[e] = {m, k, n};
      arrays.a[e] = a + begin * n;
      arrays.b[e] = b + weight;
      arrays.d[e] = d + begin * k;
      arrays.stride_a[e] = LeadingDimStride<typename Def::StrideA>(n);
      arrays.stride_b[e] = LeadingDimStride<typename Def::StrideB>(n);
      arrays.stride_d[e] = LeadingDimStride<typename Def::StrideD>(k);
    } else {
      // An empty group gets no tile (M = 0); ZeroEmptyGroups writes its zero gradient. K = 0 with
      // tiles would store uninitialized accumulators.
      arrays.shapes[e] = {m == 0 ? 0 : k, n, m};
      arrays.a[e] = a + begin * k;
      arrays.b[e] = b + begin * n;
      arrays.d[e] = d + weight;
      arrays.stride_a[e] = LeadingDimStride<typename Def::StrideA>(k);
      arrays.stride_b[e] = LeadingDimStride<typename Def::StrideB>(n);
      arrays.stride_d[e] = LeadingDimStride<typename Def::StrideD>(n);
    }
  }
}

template <class T>
struct CudaFree {
  void operator()(T* p) const { cudaFree(p); }
};
template <class T>
using DeviceArray = std::unique_ptr<T, CudaFree<T>>;

template <class T>
absl::StatusOr<DeviceArray<T>> AllocateDevice(size_t count) {
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, count * sizeof(T) > 0 ? count * sizeof(T) : 16);
  if (err != cudaSuccess) {
    return absl::ResourceExhaustedError(
        absl::StrCat("grouped gemm: cudaMalloc: ", cudaGetErrorString(err)));
  }
  return DeviceArray<T>(static_cast<T*>(p));
}

// Shared by the CUTLASS grouped runners (this one, fp8_block/fp8_block_cutlass.cuh); `what` starts
// each error. The launch status of the per-call kernel that fills the group arrays.
inline absl::Status FillLaunchStatus(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": fill launch: ", cudaGetErrorString(err)));
}

// Once per runner: `args` point at the device arrays the fill kernel rewrites before each launch
// (the host never sees the problem shapes), so the kernel parameters are built here, once: D =
// the accumulators (alpha 1, beta 0) on the current device, checked, with its workspace.
template <class Gemm>
absl::Status InitializeGrouped(Gemm& gemm, typename Gemm::Arguments& args,
                               DeviceArray<uint8_t>* workspace, const char* what) {
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  int device = 0;
  if (cudaGetDevice(&device) == cudaSuccess) args.hw_info.device_id = device;
  cutlass::Status status = gemm.can_implement(args);
  if (status != cutlass::Status::kSuccess) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": CUTLASS cannot implement: ", cutlassGetStatusString(status)));
  }
  auto allocated = AllocateDevice<uint8_t>(Gemm::get_workspace_size(args));
  if (!allocated.ok()) return allocated.status();
  *workspace = *std::move(allocated);
  status = gemm.initialize(args, workspace->get());
  if (status != cutlass::Status::kSuccess) {
    return absl::InternalError(
        absl::StrCat(what, ": CUTLASS initialize: ", cutlassGetStatusString(status)));
  }
  return absl::OkStatus();
}

template <class Gemm>
absl::Status RunGrouped(Gemm& gemm, const char* what, cudaStream_t stream) {
  const cutlass::Status status = gemm.run(stream);
  if (status == cutlass::Status::kSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": CUTLASS run: ", cutlassGetStatusString(status),
                                          " (", cudaGetErrorString(cudaGetLastError()), ")"));
}

template <GroupedGemmOp Op, class Def>
class CutlassRunner final : public GroupedGemmRunner {
 public:
  static absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> Create(const RunnerShape& shape) {
    auto runner = std::unique_ptr<CutlassRunner>(new CutlassRunner(shape));
    absl::Status status = runner->Init();
    if (!status.ok()) return status;
    return std::unique_ptr<GroupedGemmRunner>(std::move(runner));
  }

  absl::Status Run(const RunnerCall& call, cudaStream_t stream) override {
    const int threads = 128;
    const int blocks = (shape_.num_groups + threads - 1) / threads;
    FillGroupArrays<Op, Def><<<blocks, threads, 0, stream>>>(
        arrays_, call.offsets, shape_.num_groups, shape_.k, shape_.n, shape_.max_rows,
        static_cast<const typename Def::ElementAB*>(call.a),
        static_cast<const typename Def::ElementAB*>(call.b),
        static_cast<typename Def::ElementD*>(call.d), call.gate, call.gate_value);
    if (absl::Status s = FillLaunchStatus("grouped gemm"); !s.ok()) return s;
    if constexpr (Op == GroupedGemmOp::kBackwardWeight) {
      absl::Status zeroed = ZeroEmptyGroups(call.offsets, shape_.num_groups, shape_.max_rows,
                                            static_cast<int64_t>(shape_.k) * shape_.n,
                                            sizeof(typename Def::ElementD), call.d, stream);
      if (!zeroed.ok()) return zeroed;
    }
    return RunGrouped(gemm_, "grouped gemm", stream);
  }

 private:
  explicit CutlassRunner(const RunnerShape& shape) : shape_(shape) {}

  absl::Status Init() {
    const size_t groups = static_cast<size_t>(shape_.num_groups);
    auto shapes = AllocateDevice<typename Def::Shape>(groups);
    auto a = AllocateDevice<const typename Def::ElementAB*>(groups);
    auto b = AllocateDevice<const typename Def::ElementAB*>(groups);
    auto d = AllocateDevice<typename Def::ElementD*>(groups);
    auto sa = AllocateDevice<typename Def::StrideA>(groups);
    auto sb = AllocateDevice<typename Def::StrideB>(groups);
    auto sd = AllocateDevice<typename Def::StrideD>(groups);
    for (const absl::Status& s : {shapes.status(), a.status(), b.status(), d.status(),
                                  sa.status(), sb.status(), sd.status()}) {
      if (!s.ok()) return s;
    }
    shapes_ = *std::move(shapes);
    a_ = *std::move(a);
    b_ = *std::move(b);
    d_ = *std::move(d);
    stride_a_ = *std::move(sa);
    stride_b_ = *std::move(sb);
    stride_d_ = *std::move(sd);
    arrays_ = {shapes_.get(), a_.get(), b_.get(), d_.get(),
               stride_a_.get(), stride_b_.get(), stride_d_.get()};

    typename Def::Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {shape_.num_groups, shapes_.get(), nullptr},
        {a_.get(), stride_a_.get(), b_.get(), stride_b_.get()},
        {{}, nullptr, nullptr, d_.get(), stride_d_.get()},
        cutlass::KernelHardwareInfo{0, shape_.sm_count}};
    args.scheduler.raster_order =
        shape_.raster_along_n
            ? cutlass::gemm::kernel::detail::RasterOrderOptions::AlongN
            : cutlass::gemm::kernel::detail::RasterOrderOptions::AlongM;
    args.scheduler.max_swizzle_size = shape_.swizzle;
    return InitializeGrouped(gemm_, args, &workspace_, "grouped gemm");
  }

  RunnerShape shape_;
  DeviceArray<typename Def::Shape> shapes_;
  DeviceArray<const typename Def::ElementAB*> a_;
  DeviceArray<const typename Def::ElementAB*> b_;
  DeviceArray<typename Def::ElementD*> d_;
  DeviceArray<typename Def::StrideA> stride_a_;
  DeviceArray<typename Def::StrideB> stride_b_;
  DeviceArray<typename Def::StrideD> stride_d_;
  DeviceArray<uint8_t> workspace_;
  GroupArrays<Def> arrays_{};
  typename Def::Gemm gemm_;
};

}  // namespace dropless::kernels::grouped_gemm_internal

// Defines `Factory`, a RunnerFactory for one product and tile configuration.
#define DROPLESS_GROUPED_GEMM_INSTANCE(Factory, Op, ElementD, Schedule, TM, TN, TK, CM, CN)     \
  namespace dropless::kernels::grouped_gemm_internal {                                          \
  absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> Factory(const RunnerShape& shape) {        \
    using Def = KernelDef<GroupedGemmOp::Op, ElementD, Schedule, TM, TN, TK, CM, CN>;           \
    return CutlassRunner<GroupedGemmOp::Op, Def>::Create(shape);                                 \
  }                                                                                             \
  }

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_CUTLASS_GROUPED_GEMM_CUH_
