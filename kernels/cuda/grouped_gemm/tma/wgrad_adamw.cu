// GroupedWgradAdamW (dropless/kernels/grouped_wgrad_adamw.h): the launcher of
// TmaWgradAdamWKernel (wgrad_adamw_kernel.cuh) in its two forms, the fused update and the plain
// fp32 gradient.
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
    if (step == nullptr || state.param == nullptr || state.m == nullptr || state.v == nullptr ||
        state.copy == nullptr) {
      return absl::InvalidArgumentError("wgrad adamw: Update needs the step and all four tensors");
    }
    if (!Aligned16(state.param) || !Aligned16(state.m) || !Aligned16(state.v) ||
        !Aligned16(state.copy)) {
      return absl::InvalidArgumentError("wgrad adamw: the AdamW tensors must be 16-byte aligned");
    }
    tmagemm::FParams p = Params(offsets);
    p.param = state.param;
    p.m = state.m;
    p.v = state.v;
    p.copy = state.copy;
    p.step = step;
    return Launch<true>(x, dy, p, stream);
  }

  absl::Status Gradient(const __nv_bfloat16* x, const __nv_bfloat16* dy, const int32_t* offsets,
                        float* grad, cudaStream_t stream) override {
    if (grad == nullptr) return absl::InvalidArgumentError("wgrad adamw: null gradient");
    tmagemm::FParams p = Params(offsets);
    p.out = grad;
    return Launch<false>(x, dy, p, stream);
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

  template <bool kAdamW>
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
      // The masters and moments as [E k][n] fp32, read in the epilogue's 8 x 32 boxes.
      const uint64_t state_dims[2] = {static_cast<uint64_t>(shape_.n),
                                      static_cast<uint64_t>(shape_.num_groups) * shape_.k};
      const uint32_t state_box[2] = {32, 8};
      const std::pair<CUtensorMap*, const float*> state[3] = {
          {&map_param, p.param}, {&map_m, p.m}, {&map_v, p.v}};
      for (const auto& [map, data] : state) {
        if (absl::Status s = tmagemm::Encode(map, data, 2, state_dims, state_box, "AdamW state",
                                             /*fp32=*/true);
            !s.ok()) {
          return s;
        }
      }
    } else {
      map_param = map_m = map_v = map_x;  // unused
    }
    tmagemm::TmaWgradAdamWKernel<kAdamW>
        <<<sm_count_, tmagemm::kThreads, tmagemm::kFSmemBytes<kAdamW>, stream>>>(
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
  // Both forms of the kernel: the fused update and the plain gradient.
  for (auto [kernel, smem] :
       {std::pair{tmagemm::TmaWgradAdamWKernel<true>, tmagemm::kFSmemBytes<true>},
        std::pair{tmagemm::TmaWgradAdamWKernel<false>, tmagemm::kFSmemBytes<false>}}) {
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
