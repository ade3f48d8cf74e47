// GroupedWgradAdamW (dropless/kernels/grouped_wgrad_adamw.h): the launcher of
// TmaWgradAdamWKernel (wgrad_adamw_kernel.cuh) in its forms: the fused update with fp32 or bf16
// moments and the plain fp32 gradient.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "dropless/kernels/grouped_wgrad_adamw.h"
#include "kernels/cuda/grouped_gemm/tma/tensor_map_encode.h"
#include "kernels/cuda/grouped_gemm/tma/wgrad_adamw_kernel.cuh"

namespace dropless::kernels {
namespace {

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("wgrad adamw: ", what, ": ", cudaGetErrorString(e)));
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

class GroupedWgradAdamWImpl final : public GroupedWgradAdamW {
 public:
  GroupedWgradAdamWImpl(const WgradAdamWShape& shape, int sm_count)
      : shape_(shape), sm_count_(sm_count) {}

  absl::Status Update(const __nv_bfloat16* x, const __nv_bfloat16* dy, const int32_t* offsets,
                      const AdamWStep* step, const AdamWTensors& state,
                      cudaStream_t stream) override {
    const AdamWMoments& mv = state.moments;
    if (step == nullptr || state.param == nullptr || mv.m == nullptr || mv.v == nullptr ||
        state.copy == nullptr) {
      return absl::InvalidArgumentError("wgrad adamw: Update needs the step and all four tensors");
    }
    if (!Aligned16(state.param) || !Aligned16(mv.m) || !Aligned16(mv.v) || !Aligned16(state.copy)) {
      return absl::InvalidArgumentError("wgrad adamw: the AdamW tensors must be 16-byte aligned");
    }
    tmagemm::FParams p = Params(offsets);
    p.param = state.param;
    p.moments = mv;
    p.copy = state.copy;
    p.step = step;
    return mv.bf16 ? Launch<true, __nv_bfloat16>(x, dy, p, stream)
                   : Launch<true, float>(x, dy, p, stream);
  }

  absl::Status Gradient(const __nv_bfloat16* x, const __nv_bfloat16* dy, const int32_t* offsets,
                        float* grad, cudaStream_t stream) override {
    if (grad == nullptr) return absl::InvalidArgumentError("wgrad adamw: null gradient");
    tmagemm::FParams p = Params(offsets);
    p.out = grad;
    return Launch<false, float>(x, dy, p, stream);
  }

 private:
  tmagemm::FParams Params(const int32_t* offsets) const {
    tmagemm::FParams p{};
    p.offsets = offsets;
    p.num_groups = shape_.num_groups;
    p.m_out = shape_.k;
    p.n_out = shape_.n;
    p.offset_limit = shape_.max_rows;
    return p;
  }

  template <bool kAdamW, typename M>
  absl::Status Launch(const __nv_bfloat16* x, const __nv_bfloat16* dy, const tmagemm::FParams& p,
                      cudaStream_t stream) {
    if (x == nullptr || dy == nullptr || p.offsets == nullptr) {
      return absl::InvalidArgumentError("wgrad adamw: null operand or offsets");
    }
    if (shape_.num_groups == 0) return absl::OkStatus();
    // With no rows every group is empty; the tile map still needs one row.
    const uint64_t rows = shape_.max_rows > 0 ? static_cast<uint64_t>(shape_.max_rows) : 1;
    CUtensorMap map_x, map_dy, map_param, map_m, map_v;
    const uint64_t x_dims[2] = {static_cast<uint64_t>(shape_.k), rows};
    const uint64_t dy_dims[2] = {static_cast<uint64_t>(shape_.n), rows};
    const uint32_t box[2] = {64, tmagemm::kBK};
    if (absl::Status s = tmagemm::Encode(&map_x, x, 2, x_dims, box, "X"); !s.ok()) return s;
    if (absl::Status s = tmagemm::Encode(&map_dy, dy, 2, dy_dims, box, "dY"); !s.ok()) return s;
    if constexpr (kAdamW) {
      // The masters and moments as [E k][n], read in the epilogue's boxes: 8 x 32 fp32, or 8 x 64
      // bf16 moments.
      const uint64_t state_dims[2] = {static_cast<uint64_t>(shape_.n),
                                      static_cast<uint64_t>(shape_.num_groups) * shape_.k};
      constexpr bool kFp32Moments = sizeof(M) == 4;
      const uint32_t fp32_box[2] = {32, 8}, moment_box[2] = {kFp32Moments ? 32u : 64u, 8};
      if (absl::Status s = tmagemm::Encode(&map_param, p.param, 2, state_dims, fp32_box,
                                           "AdamW master", /*fp32=*/true);
          !s.ok()) {
        return s;
      }
      for (auto [map, data] : {std::pair{&map_m, p.moments.m}, std::pair{&map_v, p.moments.v}}) {
        if (absl::Status s = tmagemm::Encode(map, data, 2, state_dims, moment_box, "AdamW moments",
                                             kFp32Moments);
            !s.ok()) {
          return s;
        }
      }
    } else {
      map_param = map_m = map_v = map_x;  // unused
    }
    tmagemm::TmaWgradAdamWKernel<kAdamW, M>
        <<<sm_count_, tmagemm::kThreads, tmagemm::kFSmemBytes<kAdamW, M>, stream>>>(
            map_x, map_dy, map_param, map_m, map_v, p);
    return CudaStatus(cudaGetLastError(), "launch");
  }

  WgradAdamWShape shape_;
  int sm_count_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GroupedWgradAdamW>> GroupedWgradAdamW::Create(
    const WgradAdamWShape& shape) {
  if (shape.num_groups < 0 || shape.k <= 0 || shape.n <= 0 || shape.k % 8 != 0 ||
      shape.n % 8 != 0 || shape.max_rows < 0 || shape.max_sms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wgrad adamw: needs k and n positive multiples of 8 and non-negative groups and rows; got ",
        shape.num_groups, " groups of ", shape.k, " x ", shape.n, ", ", shape.max_rows, " rows"));
  }
  const int64_t tiles = int64_t{shape.num_groups} * ((shape.k + tmagemm::kFTile - 1) / tmagemm::kFTile) *
                        ((shape.n + tmagemm::kFTile - 1) / tmagemm::kFTile);
  if (tiles >= (int64_t{1} << 31) || int64_t{shape.num_groups} * shape.k >= (int64_t{1} << 31) ||
      shape.max_rows >= (int64_t{1} << 31) - 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wgrad adamw: ", shape.num_groups, " groups of ", shape.k, " x ", shape.n, " with ",
        shape.max_rows, " rows: tile or row indices past the int32 range"));
  }
  int device = 0, major = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (absl::Status s = CudaStatus(err, "device attributes"); !s.ok()) return s;
  if (major != 9) {
    return absl::FailedPreconditionError(
        absl::StrCat("wgrad adamw: needs a Hopper GPU (sm_90); this is sm_", major, "x"));
  }
  // Every form of the kernel: the fused update (fp32, bf16 moments) and the plain gradient.
  for (auto [kernel, smem] :
       {std::pair{tmagemm::TmaWgradAdamWKernel<true, float>, tmagemm::kFSmemBytes<true, float>},
        std::pair{tmagemm::TmaWgradAdamWKernel<true, __nv_bfloat16>,
                  tmagemm::kFSmemBytes<true, __nv_bfloat16>},
        std::pair{tmagemm::TmaWgradAdamWKernel<false, float>,
                  tmagemm::kFSmemBytes<false, float>}}) {
    if (absl::Status s = CudaStatus(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
            "cudaFuncSetAttribute");
        !s.ok()) {
      return s;
    }
  }
  const int grid = shape.max_sms > 0 ? std::min(shape.max_sms, sms) : sms;
  return std::unique_ptr<GroupedWgradAdamW>(std::make_unique<GroupedWgradAdamWImpl>(shape, grid));
}

}  // namespace dropless::kernels
