// Fp8BlockGroupedGemm (kernels/include/dropless/kernels/fp8_block_grouped_gemm.h): option and
// pointer checks, and one CUTLASS runner per product (fp8_block_runner.h).
#include "dropless/kernels/fp8_block_grouped_gemm.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dropless/kernels/fp8_block.h"
#include "kernels/cuda/grouped_gemm/fp8_block/fp8_block_runner.h"

namespace dropless::kernels {
namespace {

using fp8_block_gemm::Runner;
using fp8_block_gemm::RunnerCall;
using fp8_block_gemm::RunnerShape;

bool Aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

absl::Status CheckOperand(const Fp8BlockOperand& op, const char* field) {
  if (op.data == nullptr) return absl::InvalidArgumentError(absl::StrCat(field, ".data is null"));
  if (op.scales == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(field, ".scales is null"));
  if (!Aligned(op.data, 16)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".data must be 16-byte aligned"));
  }
  if (!Aligned(op.scales, 4)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".scales must be 4-byte aligned"));
  }
  return absl::OkStatus();
}

absl::Status CheckOutput(const void* out, const int32_t* offsets, const char* out_field,
                         const char* offsets_field) {
  if (out == nullptr) return absl::InvalidArgumentError(absl::StrCat(out_field, " is null"));
  // The epilogue stores through TMA.
  if (!Aligned(out, 16)) {
    return absl::InvalidArgumentError(absl::StrCat(out_field, " must be 16-byte aligned"));
  }
  if (offsets == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(offsets_field, " is null"));
  return absl::OkStatus();
}

// The names of a kernel table of fp8_block_runner.h, and its entry named `name` (the first for an
// empty name; ValidateOptions has refused unknown names).
template <class Entry, size_t N>
std::vector<std::string> NamesOf(const Entry (&table)[N]) {
  std::vector<std::string> names;
  for (const Entry& k : table) names.push_back(k.name);
  return names;
}
template <class Entry, size_t N>
const Entry& Named(const Entry (&table)[N], const std::string& name) {
  for (const Entry& k : table) {
    if (k.name == name) return k;
  }
  return table[0];
}

absl::Status ValidateOptions(const Fp8BlockGroupedGemmOptions& o) {
  if (o.num_groups < 1) return absl::InvalidArgumentError("num_groups must be >= 1");
  if (o.k < kFp8Block || o.k % kFp8Block != 0) {
    return absl::InvalidArgumentError("k must be a positive multiple of 128");
  }
  if (o.n < kFp8Block || o.n % kFp8Block != 0) {
    return absl::InvalidArgumentError("n must be a positive multiple of 128");
  }
  if (o.max_rows < 1 || o.max_rows >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError("max_rows must be in [1, 2^31)");
  }
  if (o.padded_rows < 0 || o.padded_rows % kFp8Block != 0 ||
      o.padded_rows >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError("padded_rows must be 0 or a multiple of 128 below 2^31");
  }
  if (o.padded_rows == 0 && Fp8ColwisePaddedRows(o.max_rows, o.num_groups) >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        "padded_rows: the default Fp8ColwisePaddedRows(max_rows, num_groups) is not below 2^31");
  }
  if (o.expected_rows_per_group < 0) {
    return absl::InvalidArgumentError(
        "expected_rows_per_group must be >= 0 (0: max_rows / num_groups)");
  }
  if (o.x_scaling != Fp8ColwiseScaling::kPerColumn && o.x_scaling != Fp8ColwiseScaling::kPerBlock) {
    return absl::InvalidArgumentError("x_scaling: must be kPerColumn or kPerBlock");
  }
  for (const auto& [field, value, names] :
       {std::tuple{"m_grouped_kernel", &o.m_grouped_kernel,
                   Fp8BlockGroupedGemm::MGroupedKernelNames()},
        std::tuple{"weight_gradient_kernel", &o.weight_gradient_kernel,
                   Fp8BlockGroupedGemm::WeightGradientKernelNames(o.x_scaling)}}) {
    if (value->empty() || std::find(names.begin(), names.end(), *value) != names.end()) continue;
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": unknown \"", *value, "\" (compiled",
                     value == &o.weight_gradient_kernel ? " for this x_scaling" : "", ": ",
                     absl::StrJoin(names, ", "), ")"));
  }
  return absl::OkStatus();
}

// The named weight-gradient kernel, else the one WeightGradientKernelFor picks (ValidateOptions
// checked that the named one reads X's scale layout).
const fp8_block_gemm::NamedWeightGradientRunner& WeightGradientKernel(
    const Fp8BlockGroupedGemmOptions& o) {
  const std::string name = !o.weight_gradient_kernel.empty()
                               ? o.weight_gradient_kernel
                               : Fp8BlockGroupedGemm::WeightGradientKernelFor(
                                     o.x_scaling, o.expected_rows_per_group > 0
                                                      ? o.expected_rows_per_group
                                                      : o.max_rows / std::max(1, o.num_groups));
  for (const auto& k : fp8_block_gemm::kWeightGradientKernels) {
    if (name == k.name) return k;
  }
  return fp8_block_gemm::kWeightGradientKernels[0];
}

class Fp8BlockGroupedGemmImpl final : public Fp8BlockGroupedGemm {
 public:
  Fp8BlockGroupedGemmImpl(std::unique_ptr<Runner> forward, std::unique_ptr<Runner> backward_data,
                          std::unique_ptr<Runner> backward_weight, std::string name)
      : forward_(std::move(forward)),
        backward_data_(std::move(backward_data)),
        backward_weight_(std::move(backward_weight)),
        name_(std::move(name)) {}

  absl::Status Forward(const Fp8BlockOperand& x, const Fp8BlockOperand& w_t,
                       const int32_t* offsets, Bf16* y, Stream stream) override {
    if (absl::Status s = CheckOperand(x, "x"); !s.ok()) return s;
    if (absl::Status s = CheckOperand(w_t, "w_t"); !s.ok()) return s;
    if (absl::Status s = CheckOutput(y, offsets, "y", "offsets"); !s.ok()) return s;
    return forward_->Run({x.data, x.scales, w_t.data, w_t.scales, y, offsets}, stream);
  }

  absl::Status BackwardData(const Fp8BlockOperand& dy, const Fp8BlockOperand& w,
                            const int32_t* offsets, Bf16* dx, Stream stream) override {
    if (absl::Status s = CheckOperand(dy, "dy"); !s.ok()) return s;
    if (absl::Status s = CheckOperand(w, "w"); !s.ok()) return s;
    if (absl::Status s = CheckOutput(dx, offsets, "dx", "offsets"); !s.ok()) return s;
    return backward_data_->Run({dy.data, dy.scales, w.data, w.scales, dx, offsets}, stream);
  }

  absl::Status BackwardWeight(const Fp8BlockOperand& x_colwise, const Fp8BlockOperand& dy_colwise,
                              const int32_t* padded_offsets, float* dw, Stream stream) override {
    if (absl::Status s = CheckOperand(x_colwise, "x_colwise"); !s.ok()) return s;
    if (absl::Status s = CheckOperand(dy_colwise, "dy_colwise"); !s.ok()) return s;
    if (absl::Status s = CheckOutput(dw, padded_offsets, "dw", "padded_offsets"); !s.ok()) return s;
    return backward_weight_->Run({x_colwise.data, x_colwise.scales, dy_colwise.data,
                                  dy_colwise.scales, dw, padded_offsets},
                                 stream);
  }

  std::string KernelName() const override { return name_; }

 private:
  std::unique_ptr<Runner> forward_, backward_data_, backward_weight_;
  std::string name_;
};

}  // namespace

std::vector<std::string> Fp8BlockGroupedGemm::MGroupedKernelNames() {
  return NamesOf(fp8_block_gemm::kMGroupedKernels);
}

std::vector<std::string> Fp8BlockGroupedGemm::WeightGradientKernelNames(
    Fp8ColwiseScaling x_scaling) {
  std::vector<std::string> names;
  for (const auto& k : fp8_block_gemm::kWeightGradientKernels) {
    if (k.x_scaling == x_scaling) names.push_back(k.name);
  }
  return names;
}

std::string Fp8BlockGroupedGemm::MGroupedKernelFor(int output_width, int reduction) {
  // The share of the N tiles' columns that are real, the tile count rounded up to the cluster's
  // N extent (CUTLASS's grouped scheduler rounds each group's tiles to the cluster shape).
  auto covered = [output_width](int tile, int cluster_n) {
    int tiles = (output_width + tile - 1) / tile;
    tiles = (tiles + cluster_n - 1) / cluster_n * cluster_n;
    return static_cast<double>(output_width) / (static_cast<double>(tiles) * tile);
  };
  // On the H200 the 192-wide tile is 2-14% faster than the 128-wide one where it covers the
  // width within 3% (the cluster below); at
  // 2048 (eleven 192-wide tiles, twelve with the cluster) the unclustered 192 tile is 3-6% ahead
  // of 128 on two of the three benchmark products and 3% behind on the third
  // (docs/fp8_block_gemm.md).
  constexpr double kWideTileMinRelativeCover = 0.93;
  const double narrow = covered(128, 2);
  // Where the clustered 192 tile covers the width, the cluster's A multicast pays only on short
  // reductions (4-11% on qwen3's reductions of 768-2048, level on dsv3 w2's forward at 2048); on
  // the long ones (4096 and up) the unclustered tile was level or ahead on five of six products in
  // two runs, H200 and H100 (+1-2% and +1-7%; -2% and -0.4% on mixtral w13's data gradient).
  constexpr int kClusterMaxReduction = 2048;
  if (covered(192, 2) >= kWideTileMinRelativeCover * narrow) {
    return reduction <= kClusterMaxReduction ? "fp8_block_coop_128x192x128_c1x2"
                                             : "fp8_block_coop_128x192x128_c1x1";
  }
  // Where only the unclustered 192 tile fits (2048: eleven tiles) and 128-wide tiles in pairs
  // cover the width at least as tightly, a short reduction goes to the 256 x 128 wave kernel
  // (2048: sixteen tiles, 256 rows a CTA): 10% ahead on qwen3's two such products (reductions of
  // 768 and 1536), 11-12% behind on dsv3's 7168-long one.
  constexpr int kWaveKernelMaxReduction = 2048;
  if (covered(192, 1) >= kWideTileMinRelativeCover * narrow) {
    const bool wave = reduction <= kWaveKernelMaxReduction && narrow >= covered(192, 1);
    return wave ? "fp8_block_wave_256x128x128_c1x2" : "fp8_block_coop_128x192x128_c1x1";
  }
  return "fp8_block_coop_128x128x128_c1x2";
}

std::string Fp8BlockGroupedGemm::WeightGradientKernelFor(Fp8ColwiseScaling x_scaling,
                                                         int64_t expected_rows_per_group) {
  // On the H200 (64 x 128 pingpong tiles against the 128 x 128 cooperative ones, same run): 8-9%
  // faster with per-column X and 7-11% with per-block X at qwen3's 1024 rows a group (8 K blocks
  // a tile); 18-21% slower at 2048 (dsv3 EP-8, mixtral), where the epilogue is a smaller share
  // of a tile and the 64-row tile reads more operand bytes per FLOP (docs/fp8_block_gemm.md).
  constexpr int64_t kPingpongMaxRowsPerGroup = 1024;
  const bool pingpong =
      expected_rows_per_group > 0 && expected_rows_per_group <= kPingpongMaxRowsPerGroup;
  // With X per block, the cooperative tile promotes one K block while the tensor cores work on
  // the next (overlapped_promotion_mainloop.cuh): on an H100, same run, 4-10% faster on dsv3 EP-8,
  // 12-14% on mixtral w2, -1% to +3% on mixtral w13 at 2048 rows a group; at qwen3's 1024 it is
  // 7-11% behind the pingpong kernel, which stays there.
  if (x_scaling == Fp8ColwiseScaling::kPerBlock) {
    return pingpong ? "fp8_block_wgrad_x_blocks_pingpong_64x128x128_c1x2"
                    : "fp8_block_wgrad_x_blocks_coop_overlap_128x128x128_c1x2_d4";
  }
  return pingpong ? "fp8_block_wgrad_pingpong_64x128x128_c1x2"
                  : "fp8_block_wgrad_coop_128x128x128_c1x2_d4";
}

absl::StatusOr<std::unique_ptr<Fp8BlockGroupedGemm>> Fp8BlockGroupedGemm::Create(
    const Fp8BlockGroupedGemmOptions& options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  int device = 0, major = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError("fp8-block grouped gemm: no CUDA device");
  }
  if (major != 9) {
    return absl::FailedPreconditionError(
        absl::StrCat("fp8-block grouped gemm needs a Hopper (sm_90) device, not sm_", major, "x"));
  }
  RunnerShape shape;
  shape.num_groups = options.num_groups;
  shape.k = options.k;
  shape.n = options.n;
  shape.max_rows = options.max_rows;
  shape.padded_rows = options.padded_rows > 0
                          ? options.padded_rows
                          : Fp8ColwisePaddedRows(options.max_rows, options.num_groups);
  shape.sm_count = options.max_sms > 0 ? std::min(sms, options.max_sms) : sms;
  const bool by_width = options.m_grouped_kernel.empty();
  const auto& forward_kernel =
      Named(fp8_block_gemm::kMGroupedKernels,
            by_width ? MGroupedKernelFor(options.n, options.k) : options.m_grouped_kernel);
  const auto& backward_data_kernel =
      Named(fp8_block_gemm::kMGroupedKernels,
            by_width ? MGroupedKernelFor(options.k, options.n) : options.m_grouped_kernel);
  const auto& wgrad = WeightGradientKernel(options);
  auto forward = forward_kernel.forward(shape);
  if (!forward.ok()) return forward.status();
  auto backward_data = backward_data_kernel.backward_data(shape);
  if (!backward_data.ok()) return backward_data.status();
  auto backward_weight = wgrad.make(shape);
  if (!backward_weight.ok()) return backward_weight.status();
  return std::unique_ptr<Fp8BlockGroupedGemm>(new Fp8BlockGroupedGemmImpl(
      *std::move(forward), *std::move(backward_data), *std::move(backward_weight),
      absl::StrCat(forward_kernel.name, "+", backward_data_kernel.name, "+", wgrad.name)));
}

}  // namespace dropless::kernels
