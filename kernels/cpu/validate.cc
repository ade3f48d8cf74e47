// Argument checks shared by the CPU references and the CUDA launchers: one error naming the field.
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "dropless/kernels/dispatch_plan.h"
#include "dropless/kernels/fp8_block.h"
#include "dropless/kernels/group_offsets.h"
#include "dropless/kernels/mxfp8.h"
#include "dropless/kernels/permute.h"
#include "dropless/kernels/router_gemm.h"
#include "dropless/kernels/routing.h"
#include "dropless/kernels/swiglu.h"

namespace dropless::kernels {
namespace {

absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

absl::Status CheckTopK(int num_experts, int top_k, const char* experts_field,
                       const char* top_k_field, bool cuda_limits = true) {
  if (num_experts < 1 || (cuda_limits && num_experts > kMaxRoutingExperts)) {
    return Invalid(experts_field, absl::StrCat("must be in [1, ", kMaxRoutingExperts, "], got ",
                                               num_experts));
  }
  if (top_k < 1 || top_k > kMaxRoutingTopK || top_k > num_experts) {
    return Invalid(top_k_field, absl::StrCat("must be in [1, min(num_experts, ", kMaxRoutingTopK,
                                             ")], got ", top_k));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRoutingShape(const RoutingShape& shape, bool cuda_limits) {
  if (shape.num_tokens < 0) return Invalid("num_tokens", "must be >= 0");
  if (shape.num_tokens * static_cast<int64_t>(shape.top_k) > INT32_MAX) {
    return Invalid("num_tokens", "num_tokens * top_k must fit in int32");
  }
  if (shape.aux_tokens < 0) return Invalid("aux_tokens", "must be >= 0");
  return CheckTopK(shape.num_experts, shape.top_k, "num_experts", "top_k", cuda_limits);
}

absl::Status ValidateDispatchPlanShape(const DispatchPlanShape& shape, bool cuda_limits) {
  if (shape.num_tokens < 0) return Invalid("num_tokens", "must be >= 0");
  if (shape.num_tokens * static_cast<int64_t>(shape.top_k) > INT32_MAX) {
    return Invalid("num_tokens", "num_tokens * top_k must fit in int32");
  }
  return CheckTopK(shape.num_experts, shape.top_k, "num_experts", "top_k", cuda_limits);
}

size_t DispatchPlanWorkspaceBytes(const DispatchPlanShape& shape) {
  const int64_t choices = shape.num_tokens * shape.top_k;
  const int64_t chunks = (choices + kDispatchPlanChunk - 1) / kDispatchPlanChunk;
  return static_cast<size_t>((chunks < 1 ? 1 : chunks) * (shape.num_experts < 1 ? 1 : shape.num_experts)) *
         sizeof(int32_t);
}

absl::Status ValidatePermuteShape(const PermuteShape& shape, bool mxfp8, bool cuda_rows) {
  if (shape.num_tokens < 0) return Invalid("num_tokens", "must be >= 0");
  if (shape.top_k < 1 || shape.top_k > kMaxRoutingTopK) {
    return Invalid("top_k", absl::StrCat("must be in [1, ", kMaxRoutingTopK, "], got ",
                                         shape.top_k));
  }
  const int64_t multiple = mxfp8 ? kMxBlock : cuda_rows ? 8 : 1;
  if (shape.hidden <= 0 || shape.hidden % multiple != 0) {
    return Invalid("hidden", absl::StrCat("must be a positive multiple of ", multiple, ", got ",
                                          shape.hidden));
  }
  if (shape.num_tokens * static_cast<int64_t>(shape.top_k) > INT32_MAX) {
    return Invalid("num_tokens", "num_tokens * top_k must fit in int32");
  }
  return absl::OkStatus();
}

absl::Status ValidateSwigluShape(const SwigluShape& shape, bool mxfp8, bool cuda_rows) {
  if (shape.rows < 0) return Invalid("rows", "must be >= 0");
  const int64_t multiple = mxfp8 ? kMxBlock : cuda_rows ? 8 : 1;
  if (shape.ffn <= 0 || shape.ffn % multiple != 0) {
    return Invalid("ffn", absl::StrCat("must be a positive multiple of ", multiple, ", got ",
                                       shape.ffn));
  }
  return absl::OkStatus();
}

namespace {

// The checks every row- / column-wise quantizer shares; `block`: elements per scale along cols
// (row-wise) and per padded group granule (column-wise).
template <class Shape, class Rowwise, class Colwise>
absl::Status ValidateQuantize(const Shape& shape, int64_t block, const Bf16* x,
                              const Rowwise* rowwise, const Colwise* colwise,
                              int64_t needed_padded_rows) {
  if (shape.rows < 0) return Invalid("rows", "must be >= 0");
  if (shape.rows > INT32_MAX) return Invalid("rows", "must fit in int32");
  if (shape.cols <= 0 || shape.cols % block != 0) {
    return Invalid("cols", absl::StrCat("must be a positive multiple of ", block, ", got ",
                                        shape.cols));
  }
  if (shape.num_groups < 1) return Invalid("num_groups", "must be >= 1");
  if (x == nullptr && shape.rows > 0) return Invalid("x", "is null");
  if (rowwise == nullptr && colwise == nullptr) {
    return Invalid("rowwise", "and colwise are both null: nothing to produce");
  }
  if (rowwise != nullptr && (rowwise->data == nullptr || rowwise->scales == nullptr)) {
    return Invalid("rowwise", "data and scales must be set");
  }
  if (colwise != nullptr) {
    if (colwise->data == nullptr || colwise->scales == nullptr ||
        colwise->group_offsets == nullptr) {
      return Invalid("colwise", "data, scales and group_offsets must be set");
    }
    if (colwise->padded_rows < needed_padded_rows || colwise->padded_rows % block != 0) {
      return Invalid("colwise.padded_rows",
                     absl::StrCat("must be a multiple of ", block, " and >= ", needed_padded_rows,
                                  ", got ", colwise->padded_rows));
    }
    if (colwise->padded_rows > INT32_MAX) return Invalid("colwise.padded_rows", "must fit in int32");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateMxColwiseImage(int64_t cols, int num_groups, const MxColwise& colwise,
                                    const Bf16* image) {
  if (cols <= 0 || cols % kMxBlock != 0) {
    return absl::InvalidArgumentError("cols: must be a positive multiple of 32");
  }
  if (num_groups < 1) return absl::InvalidArgumentError("num_groups: must be >= 1");
  if (colwise.data == nullptr || colwise.scales == nullptr || colwise.group_offsets == nullptr ||
      image == nullptr) {
    return absl::InvalidArgumentError("colwise: data, scales, group_offsets and image must be set");
  }
  return absl::OkStatus();
}

absl::Status ValidateMxQuantize(const MxQuantizeShape& shape, const Bf16* x,
                                const MxRowwise* rowwise, const MxColwise* colwise) {
  return ValidateQuantize(shape, kMxBlock, x, rowwise, colwise,
                          ColwisePaddedRows(shape.rows, shape.num_groups));
}

absl::Status ValidateFp8BlockQuantize(const Fp8BlockQuantizeShape& shape, const Bf16* x,
                                      const Fp8BlockRowwise* rowwise,
                                      const Fp8BlockColwise* colwise) {
  return ValidateQuantize(shape, kFp8Block, x, rowwise, colwise,
                          Fp8ColwisePaddedRows(shape.rows, shape.num_groups));
}

absl::Status ValidateFp8BlockWeights(const Fp8BlockWeightShape& shape, const Bf16* w,
                                     const Fp8BlockWeights& out) {
  if (shape.num_experts < 1) return Invalid("num_experts", "must be >= 1");
  if (shape.k <= 0 || shape.k % kFp8Block != 0) {
    return Invalid("k", absl::StrCat("must be a positive multiple of 128, got ", shape.k));
  }
  if (shape.n <= 0 || shape.n % kFp8Block != 0) {
    return Invalid("n", absl::StrCat("must be a positive multiple of 128, got ", shape.n));
  }
  if (w == nullptr) return Invalid("w", "is null");
  const bool plain = out.data != nullptr || out.scales != nullptr;
  const bool transposed = out.data_t != nullptr || out.scales_t != nullptr;
  if (!plain && !transposed) return Invalid("out", "no orientation requested: nothing to produce");
  if (plain && (out.data == nullptr || out.scales == nullptr)) {
    return Invalid("out.data", "and out.scales must be set together");
  }
  if (transposed && (out.data_t == nullptr || out.scales_t == nullptr)) {
    return Invalid("out.data_t", "and out.scales_t must be set together");
  }
  return absl::OkStatus();
}

absl::Status ValidateHostGroupOffsets(const int32_t* offsets, int num_groups, int64_t rows) {
  if (offsets == nullptr) {
    if (num_groups != 1) return Invalid("num_groups", "must be 1 when group_offsets is null");
    return absl::OkStatus();
  }
  if (offsets[0] != 0) return Invalid("group_offsets[0]", "must be 0");
  for (int g = 0; g < num_groups; ++g) {
    if (offsets[g + 1] < offsets[g]) {
      return Invalid("group_offsets", absl::StrCat("must be non-decreasing (at group ", g, ")"));
    }
  }
  if (offsets[num_groups] > rows) {
    return Invalid("group_offsets[num_groups]",
                   absl::StrCat(offsets[num_groups], " exceeds rows = ", rows));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> HostGroupOffsets(const int32_t* offsets, int num_groups,
                                                      int64_t rows) {
  if (absl::Status s = ValidateHostGroupOffsets(offsets, num_groups, rows); !s.ok()) return s;
  if (offsets == nullptr) return std::vector<int32_t>{0, static_cast<int32_t>(rows)};
  return std::vector<int32_t>(offsets, offsets + num_groups + 1);
}

absl::Status ValidateRouterGemmShape(const RouterGemmShape& shape, int64_t num_tokens) {
  if (shape.max_tokens < 0) return Invalid("max_tokens", "must be >= 0");
  if (shape.hidden <= 0 || shape.hidden % 8 != 0) {
    return Invalid("hidden", absl::StrCat("must be a positive multiple of 8, got ", shape.hidden));
  }
  if (shape.num_experts <= 0 || shape.num_experts % 8 != 0) {
    return Invalid("num_experts",
                   absl::StrCat("must be a positive multiple of 8, got ", shape.num_experts));
  }
  if (num_tokens < 0 || num_tokens > shape.max_tokens) {
    return Invalid("num_tokens", absl::StrCat("must be in [0, max_tokens = ", shape.max_tokens,
                                              "], got ", num_tokens));
  }
  return absl::OkStatus();
}

}  // namespace dropless::kernels
