// MxGroupedGemm (kernels/include/dropless/kernels/mx_grouped_gemm.h): option and pointer checks,
// the kernel choice, tensor maps, launches of the kernels in mx_gemm_kernel.cuh (128 x 128 tiles)
// and mx_gemm_wide_kernel.cuh (256 x 128 tiles); the products on weight images go to the bf16-core
// kernel (mx_core.h).
//
// Tensor maps are encoded on the host at each call (pure host arithmetic on the pointers, no device
// work and no synchronization) and passed by value as kernel parameters, so a captured graph keeps
// the maps of its capture.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cuda_runtime.h>

#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "dropless/kernels/mx_grouped_gemm.h"
#include "kernels/cuda/grouped_gemm/grouped_gemm_runner.h"
#include "kernels/cuda/grouped_gemm/kernel_choice.h"
#include "kernels/cuda/grouped_gemm/mxfp8/mx_core.h"
#include "kernels/cuda/grouped_gemm/mxfp8/mx_gemm_kernel.cuh"
#include "kernels/cuda/grouped_gemm/mxfp8/mx_gemm_wide_kernel.cuh"
#include "kernels/cuda/hopper/tma.cuh"

namespace dropless::kernels {
namespace {

using mxgemm::kBlockK;
using mxgemm::kBlockM;
using mxgemm::kBlockN;
using mxgemm::kSmemBytes;
using mxgemm::kThreads;
using mxgemm::Params;

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

using hopper::TensorMapEncoder;

// E4M3 bytes, K-major: dims {k_extent, rows, batches}, boxes of 128 (k) x 128 (rows), 128-byte
// swizzle (the layout wgmma's K-major descriptors read); elements outside read as zero.
// A operands are 2-D maps (batches = 0), B operands 3-D (the kernel issues 3-D copies for B).
absl::Status EncodeOperand(CUtensorMap* map, const uint8_t* data, uint64_t k_extent, uint64_t rows,
                           uint64_t batches, uint32_t box_rows, const char* field) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr)
    return absl::InternalError("cuTensorMapEncodeTiled not found in the driver");
  const cuuint64_t dims[3] = {k_extent, rows, batches > 0 ? batches : 1};
  const cuuint64_t strides[2] = {k_extent, k_extent * rows};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(kBlockK), box_rows, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, batches > 0 ? 3 : 2,
                            const_cast<uint8_t*>(data), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(
        absl::StrCat(field, ": cuTensorMapEncodeTiled failed (CUresult ", r, ")"));
  }
  return absl::OkStatus();
}

// A block-major column-wise operand (mxfp8.h: [P / 32][rows][32] E4M3): dims {32, rows, P / 32},
// boxes of 32 bytes x box_rows x 4 K blocks (one stage; it lands as [4][box_rows][32]), 32-byte
// swizzle (hopper::SmemSwizzle::k32B, the layout OperandDescriptor reads); elements outside read
// as zero.
absl::Status EncodeBlockedOperand(CUtensorMap* map, const uint8_t* data, uint64_t padded,
                                  uint64_t rows, uint32_t box_rows, const char* field) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr)
    return absl::InternalError("cuTensorMapEncodeTiled not found in the driver");
  const cuuint64_t dims[3] = {32, rows, padded / 32};
  const cuuint64_t strides[2] = {32, 32 * rows};
  const cuuint32_t box[3] = {32, box_rows, static_cast<cuuint32_t>(kBlockK / 32)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<uint8_t*>(data), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_32B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(
        absl::StrCat(field, ": cuTensorMapEncodeTiled failed (CUresult ", r, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckOperand(const MxOperand& op, const char* field) {
  if (op.data == nullptr) return absl::InvalidArgumentError(absl::StrCat(field, ".data is null"));
  if (op.scales == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(field, ".scales is null"));
  if (reinterpret_cast<uintptr_t>(op.data) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".data must be 16-byte aligned"));
  }
  return absl::OkStatus();
}

absl::Status CheckOutput(const void* out, const int32_t* offsets, const char* out_field,
                         const char* offsets_field) {
  if (out == nullptr) return absl::InvalidArgumentError(absl::StrCat(out_field, " is null"));
  if (reinterpret_cast<uintptr_t>(out) % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(out_field, " must be 8-byte aligned"));
  }
  if (offsets == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(offsets_field, " is null"));
  return absl::OkStatus();
}

// Compiled configurations (KernelNames() order): tile shape and the variant bits of the kernel
// headers. _ps: m64 pieces past the group are skipped; _xs: two stages per straight-line wgmma
// pipeline; the last one is the kernel of 2026-11-30 (kept for comparison).
struct KernelConfig {
  const char* name;
  bool wide;  // 256 x 128 tiles (mx_gemm_wide_kernel.cuh), else 128 x 128 (mx_gemm_kernel.cuh)
  int variant;
};
constexpr KernelConfig kKernels[] = {
    {"mx_wide_256x128x128_s3_ps", true, mxgemm::wide::kWidePieceSkip},
    {"mx_wide_256x128x128_s3", true, 0},
    {"mx_ws_128x128x128_s6_sbf32_xs", false, mxgemm::kXStage},
    {"mx_ws_128x128x128_s6_sbf32", false, 0},
};
constexpr int kKernelCount = sizeof(kKernels) / sizeof(kKernels[0]);
constexpr int kWideKernel = 0;
constexpr int kNarrowKernel = 2;  // 128 x 128 tiles: operands with fewer than 256 rows
// The default weight gradient where both tile shapes fit (k >= 256): kWideKernel or kNarrowKernel
// chosen on the device per call from the padded group sizes (kernel_choice.h). Both launch; the
// one not chosen returns at once (Params::gate).
constexpr int kPairedWeightGradient = -1;

constexpr int kChooseThreads = 256;

__global__ void __launch_bounds__(kChooseThreads)
    ChooseWeightGradientKernel(const int32_t* __restrict__ padded_offsets, int num_groups,
                               int64_t limit, int32_t* __restrict__ choice) {
  __shared__ long long rows[kChooseThreads], long_rows[kChooseThreads];
  long long r = 0, l = 0;
  for (int e = threadIdx.x; e < num_groups; e += kChooseThreads) {
    const int64_t begin = min(max(static_cast<int64_t>(padded_offsets[e]), int64_t{0}), limit);
    const int64_t end = min(max(static_cast<int64_t>(padded_offsets[e + 1]), begin), limit);
    r += end - begin;
    l += end - begin >= grouped_gemm_internal::kWideWgradGroupRows ? end - begin : 0;
  }
  rows[threadIdx.x] = r;
  long_rows[threadIdx.x] = l;
  __syncthreads();
  for (int s = kChooseThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      rows[threadIdx.x] += rows[threadIdx.x + s];
      long_rows[threadIdx.x] += long_rows[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *choice = grouped_gemm_internal::PreferWideWeightGradient(long_rows[0], rows[0]) ? 1 : 0;
  }
}

template <typename OutT, bool kGroupedK, int kIndex = 0>
auto KernelAt(int index) {
  constexpr KernelConfig c = kKernels[kIndex];
  if constexpr (kIndex + 1 < kKernelCount) {
    if (index != kIndex) return KernelAt<OutT, kGroupedK, kIndex + 1>(index);
  }
  if constexpr (c.wide) {
    return &mxgemm::wide::MxGroupedGemmWideKernel<OutT, kGroupedK, c.variant>;
  } else {
    return &mxgemm::MxGroupedGemmKernel<OutT, kGroupedK, c.variant>;
  }
}

int SmemBytes(int kernel) { return kKernels[kernel].wide ? mxgemm::wide::kSmemBytes : kSmemBytes; }
uint32_t ARows(int kernel) { return kKernels[kernel].wide ? mxgemm::wide::kBM : kBlockM; }

template <typename OutT, bool kGroupedK>
absl::Status Launch(const CUtensorMap& map_a, const CUtensorMap& map_b, const Params& params,
                    int grid, int kernel, cudaStream_t stream) {
  KernelAt<OutT, kGroupedK>(kernel)<<<grid, kThreads, SmemBytes(kernel), stream>>>(map_a, map_b,
                                                                                   params);
  return CudaStatus(cudaGetLastError(), "MxGroupedGemmKernel launch");
}

template <typename OutT, bool kGroupedK>
absl::Status AllowSmem(int kernel) {
  return CudaStatus(
      cudaFuncSetAttribute(KernelAt<OutT, kGroupedK>(kernel),
                           cudaFuncAttributeMaxDynamicSharedMemorySize, SmemBytes(kernel)),
      "cudaFuncSetAttribute(max dynamic shared memory)");
}

class MxGroupedGemmImpl final : public MxGroupedGemm {
 public:
  // m_kernel runs Forward and BackwardData, k_kernel BackwardWeight (indices into kKernels).
  // choice: a device int32 for the paired weight gradient (k_kernel == kPairedWeightGradient),
  // owned from here on; null otherwise.
  MxGroupedGemmImpl(const MxGroupedGemmOptions& o, int sms, int m_kernel, int k_kernel,
                    int32_t* choice, int core_cluster, int core_grid)
      : o_(o),
        sms_(sms),
        m_kernel_(m_kernel),
        k_kernel_(k_kernel),
        choice_(choice),
        core_cluster_(core_cluster),
        core_grid_(core_grid) {}
  ~MxGroupedGemmImpl() override {
    if (choice_ != nullptr) cudaFree(choice_);
  }
  MxGroupedGemmImpl(const MxGroupedGemmImpl&) = delete;
  MxGroupedGemmImpl& operator=(const MxGroupedGemmImpl&) = delete;

  absl::Status Forward(const MxOperand& x, const MxOperand& w_t, const int32_t* offsets, Bf16* y,
                       Stream stream) override {
    return MGrouped(x, w_t, offsets, y, /*k=*/o_.k, /*n=*/o_.n, "x", "w_t", "y", stream);
  }

  absl::Status BackwardData(const MxOperand& dy, const MxOperand& w, const int32_t* offsets,
                            Bf16* dx, Stream stream) override {
    return MGrouped(dy, w, offsets, dx, /*k=*/o_.n, /*n=*/o_.k, "dy", "w", "dx", stream);
  }

  absl::Status Forward(const MxOperand& x, const Bf16* w_t_image, const int32_t* offsets, Bf16* y,
                       Stream stream) override {
    return mxgemm::LaunchCore({x, w_t_image, offsets, y, o_.num_groups, o_.k, o_.n, o_.max_rows},
                              core_cluster_, core_grid_, "x", "y", stream);
  }

  absl::Status BackwardData(const MxOperand& dy, const Bf16* w_image, const int32_t* offsets,
                            Bf16* dx, Stream stream) override {
    return mxgemm::LaunchCore({dy, w_image, offsets, dx, o_.num_groups, o_.n, o_.k, o_.max_rows},
                              core_cluster_, core_grid_, "dy", "dx", stream);
  }

  absl::Status BackwardWeight(const MxOperand& x_colwise, const MxOperand& dy_colwise,
                              const int32_t* padded_offsets, float* dw, Stream stream) override {
    return KGrouped<float>(x_colwise, dy_colwise, padded_offsets, dw, stream);
  }
  absl::Status BackwardWeight(const MxOperand& x_colwise, const MxOperand& dy_colwise,
                              const int32_t* padded_offsets, Bf16* dw, Stream stream) override {
    return KGrouped<__nv_bfloat16>(x_colwise, dy_colwise, padded_offsets, dw, stream);
  }

  std::string CoreKernelName() const override {
    return core_cluster_ == 2 ? kCoreClusterKernelName : kCoreKernelName;
  }

  // "<forward and data-gradient kernel>" or, where the weight gradient runs another one,
  // "<forward and data-gradient kernel>+<weight-gradient kernel>".
  // "<wide>|<narrow>" for the weight gradient chosen per call.
  std::string KernelName() const override {
    if (k_kernel_ == kPairedWeightGradient) {
      return absl::StrCat(kKernels[m_kernel_].name, "+", kKernels[kWideKernel].name, "|",
                          kKernels[kNarrowKernel].name);
    }
    if (m_kernel_ == k_kernel_) return kKernels[m_kernel_].name;
    return absl::StrCat(kKernels[m_kernel_].name, "+", kKernels[k_kernel_].name);
  }

 private:
  // C[rows][n] = A[rows][k] . B[e][n][k]^T per group (k the reduction here).
  absl::Status MGrouped(const MxOperand& a, const MxOperand& b, const int32_t* offsets, Bf16* c,
                        int k, int n, const char* a_field, const char* b_field, const char* c_field,
                        Stream stream) {
    if (absl::Status s = CheckOperand(a, a_field); !s.ok()) return s;
    if (absl::Status s = CheckOperand(b, b_field); !s.ok()) return s;
    if (absl::Status s = CheckOutput(c, offsets, c_field, "offsets"); !s.ok()) return s;
    CUtensorMap map_a, map_b;
    if (absl::Status s =
            EncodeOperand(&map_a, a.data, k, o_.max_rows, 0, ARows(m_kernel_), a_field);
        !s.ok())
      return s;
    if (absl::Status s = EncodeOperand(&map_b, b.data, k, n, o_.num_groups, kBlockN, b_field);
        !s.ok())
      return s;
    Params p{};
    p.a_scales = a.scales;
    p.b_scales = b.scales;
    p.a_scale_stride = k / 32;
    p.b_scale_stride = k / 32;
    p.a_scale_kb_stride = 1;
    p.b_scale_kb_stride = 1;
    p.b_scale_batch_stride = static_cast<int64_t>(n) * (k / 32);
    p.a_scales_end = a.scales + o_.max_rows * (k / 32);
    p.b_scales_end = b.scales + o_.num_groups * p.b_scale_batch_stride;
    p.a_rows = o_.max_rows;
    p.offsets = offsets;
    p.num_groups = o_.num_groups;
    p.m = 0;
    p.n = n;
    p.k = k;
    p.offset_limit = o_.max_rows;
    p.out = c;
    p.ldc = n;
    p.out_group_stride = 0;
    return Launch<__nv_bfloat16, false>(map_a, map_b, p, sms_, m_kernel_, stream);
  }

  // dW[e][k][n] = X_e^T . dY_e over the group's padded token range.
  template <typename OutT>
  absl::Status KGrouped(const MxOperand& x, const MxOperand& dy, const int32_t* padded_offsets,
                        void* dw, Stream stream) {
    if (absl::Status s = CheckOperand(x, "x_colwise"); !s.ok()) return s;
    if (absl::Status s = CheckOperand(dy, "dy_colwise"); !s.ok()) return s;
    if (absl::Status s = CheckOutput(dw, padded_offsets, "dw", "padded_offsets"); !s.ok()) return s;
    const int64_t padded = PaddedRows();
    // The kernels read a K block's scales 16 rows at a time.
    if (reinterpret_cast<uintptr_t>(x.scales) % 16 != 0) {
      return absl::InvalidArgumentError("x_colwise.scales must be 16-byte aligned");
    }
    if (reinterpret_cast<uintptr_t>(dy.scales) % 16 != 0) {
      return absl::InvalidArgumentError("dy_colwise.scales must be 16-byte aligned");
    }
    const bool paired = k_kernel_ == kPairedWeightGradient;
    const int first = paired ? kWideKernel : k_kernel_;
    CUtensorMap map_a, map_a_narrow, map_b;
    if (absl::Status s =
            EncodeBlockedOperand(&map_a, x.data, padded, o_.k, ARows(first), "x_colwise");
        !s.ok())
      return s;
    if (paired) {
      if (absl::Status s = EncodeBlockedOperand(&map_a_narrow, x.data, padded, o_.k,
                                                ARows(kNarrowKernel), "x_colwise");
          !s.ok())
        return s;
    }
    if (absl::Status s = EncodeBlockedOperand(&map_b, dy.data, padded, o_.n, kBlockN, "dy_colwise");
        !s.ok())
      return s;
    // Block-major scales [P / 32][rows]: (row, kb) at kb * rows + row.
    Params p{};
    p.a_scales = x.scales;
    p.b_scales = dy.scales;
    p.a_scale_stride = 1;
    p.b_scale_stride = 1;
    p.a_scale_kb_stride = o_.k;
    p.b_scale_kb_stride = o_.n;
    p.b_scale_batch_stride = 0;
    p.a_scales_end = x.scales + o_.k * (padded / 32);
    p.b_scales_end = dy.scales + o_.n * (padded / 32);
    p.a_rows = o_.k;
    p.offsets = padded_offsets;
    p.num_groups = o_.num_groups;
    p.m = o_.k;
    p.n = o_.n;
    p.k = 0;
    p.offset_limit = padded;
    p.out = dw;
    p.ldc = o_.n;
    p.out_group_stride = static_cast<int64_t>(o_.k) * o_.n;
    if (!paired) return Launch<OutT, true>(map_a, map_b, p, sms_, k_kernel_, stream);
    if (absl::Status s = grouped_gemm_internal::LaunchWeightGradientChoice(
            padded_offsets, o_.num_groups, padded, choice_, stream);
        !s.ok()) {
      return s;
    }
    p.gate = choice_;
    p.gate_value = 1;
    if (absl::Status s = Launch<OutT, true>(map_a, map_b, p, sms_, kWideKernel, stream); !s.ok()) {
      return s;
    }
    p.gate_value = 0;
    return Launch<OutT, true>(map_a_narrow, map_b, p, sms_, kNarrowKernel, stream);
  }

  int64_t PaddedRows() const {
    if (o_.padded_rows > 0) return o_.padded_rows;
    const int64_t bound = o_.max_rows + 31 * static_cast<int64_t>(o_.num_groups);
    return (bound + 31) / 32 * 32;
  }

  MxGroupedGemmOptions o_;
  int sms_;
  int m_kernel_, k_kernel_;
  int32_t* choice_;
  int core_cluster_, core_grid_;  // the bf16-core variant of the image products and its grid
};

}  // namespace

namespace grouped_gemm_internal {

absl::Status LaunchWeightGradientChoice(const int32_t* padded_offsets, int num_groups,
                                        int64_t padded_rows, int32_t* choice,
                                        cudaStream_t stream) {
  ChooseWeightGradientKernel<<<1, kChooseThreads, 0, stream>>>(padded_offsets, num_groups,
                                                               padded_rows, choice);
  return CudaStatus(cudaGetLastError(), "weight-gradient choice launch");
}

}  // namespace grouped_gemm_internal

absl::StatusOr<std::unique_ptr<MxGroupedGemm>> MxGroupedGemm::Create(
    const MxGroupedGemmOptions& options) {
  if (options.num_groups < 1) return absl::InvalidArgumentError("num_groups must be >= 1");
  if (options.k < 32 || options.k % 32 != 0) {
    return absl::InvalidArgumentError("k must be a positive multiple of 32");
  }
  if (options.n < 32 || options.n % 32 != 0) {
    return absl::InvalidArgumentError("n must be a positive multiple of 32");
  }
  if (options.max_rows < 1 || options.max_rows >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError("max_rows must be in [1, 2^31)");
  }
  if (options.padded_rows < 0 || options.padded_rows % 32 != 0 ||
      options.padded_rows >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError("padded_rows must be 0 or a multiple of 32 below 2^31");
  }
  if (options.expected_rows_per_group < 0) {
    return absl::InvalidArgumentError("expected_rows_per_group must be >= 0");
  }
  // Default: 256 x 128 tiles where the A operand has at least 256 rows (its TMA box; forward and
  // data gradient: max_rows). The weight gradient (A rows: k) chooses between 256 x 128 and
  // 128 x 128 tiles on the device per call when both fit (k >= 256): short groups (few stages per
  // tile) run faster on the smaller tiles, which amortize the per-tile start and store better
  // (kernel_choice.h); with k < 256 it runs the 128 x 128 kernel.
  int m_kernel = options.max_rows >= 256 ? kWideKernel : kNarrowKernel;
  int k_kernel = options.k >= 256 ? kPairedWeightGradient : kNarrowKernel;
  // The bf16-core variant (CoreKernelName in mx_grouped_gemm.h): one CTA per tile unless forced.
  int core_cluster = 1;
  if (options.kernel == kCoreClusterKernelName) {
    core_cluster = 2;
  } else if (!options.kernel.empty() && options.kernel != kCoreKernelName) {
    m_kernel = -1;
    for (int i = 0; i < kKernelCount; ++i) {
      if (options.kernel == kKernels[i].name) m_kernel = i;
    }
    if (m_kernel < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("kernel: no compiled kernel named '", options.kernel, "'"));
    }
    k_kernel = m_kernel;
  }
  int device = 0;
  if (absl::Status s = CudaStatus(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) return s;
  int major = 0, sms = 0;
  if (absl::Status s =
          CudaStatus(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
                     "device query");
      !s.ok()) {
    return s;
  }
  if (major != 9) {
    return absl::FailedPreconditionError("MxGroupedGemm needs a Hopper (sm_90) device");
  }
  if (absl::Status s = CudaStatus(
          cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "device query");
      !s.ok()) {
    return s;
  }
  for (int kk : {k_kernel == kPairedWeightGradient ? kWideKernel : k_kernel,
                 k_kernel == kPairedWeightGradient ? kNarrowKernel : k_kernel}) {
    for (absl::Status s : {AllowSmem<__nv_bfloat16, false>(m_kernel),
                           AllowSmem<__nv_bfloat16, true>(kk), AllowSmem<float, true>(kk)}) {
      if (!s.ok()) return s;
    }
  }
  const int grid_sms = options.max_sms > 0 ? std::min(sms, options.max_sms) : sms;
  absl::StatusOr<int> core_grid = mxgemm::PrepareCore(core_cluster, grid_sms);
  if (!core_grid.ok()) return core_grid.status();
  int32_t* choice = nullptr;
  if (k_kernel == kPairedWeightGradient) {
    if (absl::Status s = CudaStatus(cudaMalloc(&choice, sizeof(int32_t)), "cudaMalloc(choice)");
        !s.ok()) {
      return s;
    }
  }
  return std::unique_ptr<MxGroupedGemm>(new MxGroupedGemmImpl(options, grid_sms, m_kernel,
                                                               k_kernel, choice, core_cluster,
                                                               *core_grid));
}

std::vector<std::string> MxGroupedGemm::KernelNames() {
  std::vector<std::string> names;
  for (const KernelConfig& c : kKernels) names.emplace_back(c.name);
  return names;
}

}  // namespace dropless::kernels
