// GroupedGemm: validates the shapes, picks one compiled kernel per product by shape class, and
// forwards each call to it.
#include "dropless/kernels/grouped_gemm.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cuda/grouped_gemm/grouped_gemm_runner.h"
#include "kernels/cuda/grouped_gemm/kernel_choice.h"

namespace dropless::kernels {
namespace grouped_gemm_internal {

absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeFwdCoop128x256(const RunnerShape&);
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeFwdCoop128x256C2x1(const RunnerShape&);
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeDgradCoop128x256C2x1(const RunnerShape&);
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeWgradBf16Coop128x256(const RunnerShape&);
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeDgradCoop128x256(const RunnerShape&);
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeDgradPingpong128x128(const RunnerShape&);
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeWgradF32Coop128x256(const RunnerShape&);
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeWgradF32Pingpong128x128(const RunnerShape&);
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeWgradBf16Pingpong128x128(const RunnerShape&);
// Own kernels with fixed tensor maps (tma/: factories in tma_grouped_gemm.cu).
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeFwdTma128x256(const RunnerShape&);
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeDgradTma128x256(const RunnerShape&);
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeFwdTma128x256C2x1(const RunnerShape&);
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeFwdTmaPingpong128x128(const RunnerShape&);
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeDgradTmaPingpong128x128(const RunnerShape&);
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeWgradF32Tma128x256(const RunnerShape&);
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeWgradBf16Tma128x256(const RunnerShape&);
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeDgradTma128x256C2x1(const RunnerShape&);

namespace {
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeFwdCoopPaired(const RunnerShape& shape) {
  return MakePairedRunner(shape, MakeFwdCoop128x256C2x1, MakeFwdCoop128x256);
}
absl::StatusOr<std::unique_ptr<GroupedGemmRunner>> MakeDgradCoopPaired(const RunnerShape& shape) {
  return MakePairedRunner(shape, MakeDgradCoop128x256C2x1, MakeDgradCoop128x256);
}
}  // namespace

// The 2x1 / 1x2 cluster pair of the 128x256 cooperative kernel, chosen per call on the device.
constexpr char kPairedName[] = "coop_128x256x64_c2x1_or_c1x2";

const KernelEntry* KernelTable(int* count) {
  using Op = GroupedGemmOp;
  static const KernelEntry kTable[] = {
      {"coop_128x256x64_c1x2", Op::kForward, OutType::kBFloat16, MakeFwdCoop128x256},
      {"coop_128x256x64_c2x1", Op::kForward, OutType::kBFloat16, MakeFwdCoop128x256C2x1},
      {kPairedName, Op::kForward, OutType::kBFloat16, MakeFwdCoopPaired},
      {"tma_128x256x64", Op::kForward, OutType::kBFloat16, MakeFwdTma128x256},
      {"tma_128x256x64_c2x1", Op::kForward, OutType::kBFloat16, MakeFwdTma128x256C2x1},
      {"tma_pingpong_128x128x64", Op::kForward, OutType::kBFloat16, MakeFwdTmaPingpong128x128},
      {"coop_128x256x64_c1x2", Op::kBackwardData, OutType::kBFloat16, MakeDgradCoop128x256},
      {"tma_128x256x64", Op::kBackwardData, OutType::kBFloat16, MakeDgradTma128x256},
      {"tma_128x256x64_c2x1", Op::kBackwardData, OutType::kBFloat16, MakeDgradTma128x256C2x1},
      {"tma_pingpong_128x128x64", Op::kBackwardData, OutType::kBFloat16,
       MakeDgradTmaPingpong128x128},
      {"coop_128x256x64_c2x1", Op::kBackwardData, OutType::kBFloat16, MakeDgradCoop128x256C2x1},
      {kPairedName, Op::kBackwardData, OutType::kBFloat16, MakeDgradCoopPaired},
      {"pingpong_128x128x64_c1x2", Op::kBackwardData, OutType::kBFloat16,
       MakeDgradPingpong128x128},
      {"coop_128x256x64_c2x1", Op::kBackwardWeight, OutType::kFloat32, MakeWgradF32Coop128x256},
      {"pingpong_128x128x64_c2x1", Op::kBackwardWeight, OutType::kFloat32,
       MakeWgradF32Pingpong128x128},
      {"pingpong_128x128x64_c2x1", Op::kBackwardWeight, OutType::kBFloat16,
       MakeWgradBf16Pingpong128x128},
      {"coop_128x256x64_c2x1", Op::kBackwardWeight, OutType::kBFloat16, MakeWgradBf16Coop128x256},
      {"tma_128x256x64", Op::kBackwardWeight, OutType::kFloat32, MakeWgradF32Tma128x256},
      {"tma_128x256x64", Op::kBackwardWeight, OutType::kBFloat16, MakeWgradBf16Tma128x256},
  };
  *count = static_cast<int>(sizeof(kTable) / sizeof(kTable[0]));
  return kTable;
}

namespace {

OutType OutTypeOf(GroupedGemmOp op, GradType grad) {
  if (op != GroupedGemmOp::kBackwardWeight) return OutType::kBFloat16;
  return grad == GradType::kFloat32 ? OutType::kFloat32 : OutType::kBFloat16;
}

// A kernel name may carry a visiting-order variant: "<name>@M<s>" or "<name>@N<s>" (raster along
// M or N, swizzle s in {1, 2, 4, 8}).
bool ParseVariant(const std::string& full, std::string* base, RunnerShape* shape) {
  const size_t at = full.find('@');
  *base = full.substr(0, at);
  if (at == std::string::npos) return true;
  const std::string v = full.substr(at + 1);
  if (v.size() != 2 || (v[0] != 'M' && v[0] != 'N')) return false;
  const int swizzle = v[1] - '0';
  if (swizzle != 1 && swizzle != 2 && swizzle != 4 && swizzle != 8) return false;
  shape->raster_along_n = v[0] == 'N';
  shape->swizzle = swizzle;
  return true;
}

const KernelEntry* FindKernel(GroupedGemmOp op, OutType out, const std::string& name) {
  int count = 0;
  const KernelEntry* table = KernelTable(&count);
  for (int i = 0; i < count; ++i) {
    if (table[i].op == op && table[i].out == out && name == table[i].name) return &table[i];
  }
  return nullptr;
}

// The shape-class choice, made once at creation, from H200 runs that timed every kernel next to
// torch._grouped_mm in one process, alternating (bench/results/gemm-h200-20261130-tma-kernels.json,
// docs/grouped_gemm.md):
// - forward and data gradient: the own kernels with fixed tensor maps (tma/),
//   which need no per-group descriptor rewrite (up to 30% faster than the CUTLASS kernels on
//   qwen3's 1024-row groups). Reductions of at most 2048 (qwen3; dsv3 w2 forward, where both tie)
//   take the ping-pong kernel, whose epilogue runs under the other warpgroup's main loop (3-12%
//   faster there); longer ones (dsv3, mixtral) the cooperative 128x256 tile (5-14% faster than
//   the ping-pong kernel there: a third fewer operand bytes per FLOP, and the epilogue is a smaller
//   share of a long tile). The forward's ping-pong rule holds to 1024 rows a group: with 2048
//   (dsv3 w2 at EP 8) the 128x256 tile read 695 TFLOP/s against 527 on an H100, and tied at 1024
//   (qwen3 w13: 620 / 611; bench/results/gemm-h100-20261206-bf16-fwd-dgrad-kernels.json; the
//   2048-row case was not measured on an H200);
// - weight gradient to bf16: the fixed-map kernel (+2-17% over the CUTLASS kernels on uniform
//   groups, +8.5% on mixtral w2's skewed ones; -2 to -4% on qwen3 w2 and mixtral w13 zipf:
//   bench/results/gemm-h200-20261130-tma-wgrad.json). To fp32 its epilogue (four 64-column
//   blocks through 16 KiB of shared memory each) is no faster, so the CUTLASS rule stays: small
//   groups (<= 512 rows, dsv3) give short main loops and the store of the k x n gradient
//   dominates: the 128x256 cooperative tile there. Above 512 rows the choice follows the
//   device's memory bandwidth (kernel_choice.h, IsHighMemoryBandwidth):
//   - H200-class: the pingpong kernel (epilogue of one warpgroup under the other's main loop),
//     its tiles moving along N above 1024 rows a group (3-22% faster than along M on dsv3 at
//     EP 8 and mixtral on an H100: bench/results/gemm-h100-20261206-bf16-wgrad-raster.json; not
//     measured on an H200). On the H200 in session 5 (along M, bench/results/
//     gemm-h200-20261130-tma-wgrad-fp32.json) the 128x256 tiles were within -5..+3% of it on
//     uniform groups but 12-18% faster on mixtral w2 with zipf groups: a rule to revisit there;
//   - H100-class: 128x256 tiles (a third fewer operand bytes per FLOP than 128x128 tiles), 5-36%
//     faster than the pingpong kernel on the six products of dsv3 at EP 8, mixtral and qwen3
//     (bench/results/
//     gemm-h100-20261206-bf16-wgrad-fp32-kernels.json): CUTLASS's cooperative kernel along N
//     where the gradient has more rows than columns (k > n) above 1024 rows a group (dsv3 w13,
//     mixtral w2: 650 / 625 TFLOP/s against 596 / 533 for the fixed-map kernel), else the
//     fixed-map kernel (dsv3 w2, mixtral w13, qwen3: 655 / 660 / 566 / 540).
std::string DefaultKernel(GroupedGemmOp op, OutType out, const GroupedGemmOptions& options,
                          bool high_bandwidth) {
  const int64_t rows = options.expected_rows_per_group;
  switch (op) {
    case GroupedGemmOp::kForward:  // reduces over k
      return options.k <= 2048 && rows <= 1024 ? "tma_pingpong_128x128x64" : "tma_128x256x64";
    case GroupedGemmOp::kBackwardData:  // reduces over n
      return options.n <= 2048 ? "tma_pingpong_128x128x64" : "tma_128x256x64";
    case GroupedGemmOp::kBackwardWeight:
      if (out == OutType::kBFloat16) return "tma_128x256x64";
      if (rows > 0 && rows <= 512) return "coop_128x256x64_c2x1";
      if (high_bandwidth) {
        return rows > 1024 ? "pingpong_128x128x64_c2x1@N1" : "pingpong_128x128x64_c2x1";
      }
      return rows > 1024 && options.k > options.n ? "coop_128x256x64_c2x1@N1" : "tma_128x256x64";
  }
  return "";
}

class GroupedGemmImpl final : public GroupedGemm {
 public:
  explicit GroupedGemmImpl(GroupedGemmOptions options) : options_(std::move(options)) {}

  absl::Status Init() {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    int major = 0;
    int sms = 0;
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) {
      return absl::FailedPreconditionError(
          absl::StrCat("grouped gemm: no usable CUDA device: ", cudaGetErrorString(err)));
    }
    if (major != 9) {
      return absl::FailedPreconditionError(absl::StrCat(
          "grouped gemm: needs a Hopper (sm_90) device, device ", device, " is sm_", major, "x"));
    }
    if (options_.max_sms > 0) sms = std::min(sms, options_.max_sms);
    absl::StatusOr<bool> high_bandwidth = DeviceHasHighMemoryBandwidth(device);
    if (!high_bandwidth.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("grouped gemm: ", high_bandwidth.status().message()));
    }
    grouped_gemm_internal::RunnerShape shape{options_.num_groups, options_.k, options_.n,
                                             options_.max_rows, sms};
    const std::string* forced[3] = {&options_.forward_kernel, &options_.backward_data_kernel,
                                    &options_.backward_weight_kernel};
    const GroupedGemmOp ops[3] = {GroupedGemmOp::kForward, GroupedGemmOp::kBackwardData,
                                  GroupedGemmOp::kBackwardWeight};
    for (int i = 0; i < 3; ++i) {
      const GroupedGemmOp op = ops[i];
      const auto out = OutTypeOf(op, options_.weight_grad_type);
      const std::string name =
          forced[i]->empty() ? DefaultKernel(op, out, options_, *high_bandwidth) : *forced[i];
      grouped_gemm_internal::RunnerShape variant = shape;
      std::string base;
      // The pair's choice rule assumes CUTLASS's default visiting order (padding to the cluster's
      // 2 M tiles), and the tma kernels walk their own order: neither takes a visiting-order
      // suffix.
      const bool suffix = name.find('@') != std::string::npos;
      const bool parsed = ParseVariant(name, &base, &variant) &&
                          !(suffix && (base == kPairedName || base.rfind("tma_", 0) == 0));
      const auto* entry = parsed ? FindKernel(op, out, base) : nullptr;
      if (entry == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "grouped gemm: no ", GroupedGemmOpName(op), " kernel named '", name, "'; have: ",
            absl::StrJoin(KernelNames(op, options_.weight_grad_type), ", ")));
      }
      auto runner = entry->make(variant);
      if (!runner.ok()) return runner.status();
      runners_[i] = *std::move(runner);
      names_[i] = name;
    }
    return absl::OkStatus();
  }

  absl::Status Forward(const __nv_bfloat16* x, const __nv_bfloat16* w, const int32_t* offsets,
                       __nv_bfloat16* y, cudaStream_t stream) override {
    return Run(0, x, w, y, offsets, stream);
  }
  absl::Status BackwardData(const __nv_bfloat16* dy, const __nv_bfloat16* w,
                            const int32_t* offsets, __nv_bfloat16* dx,
                            cudaStream_t stream) override {
    return Run(1, dy, w, dx, offsets, stream);
  }
  absl::Status BackwardWeight(const __nv_bfloat16* x, const __nv_bfloat16* dy,
                              const int32_t* offsets, float* dw, cudaStream_t stream) override {
    if (options_.weight_grad_type != GradType::kFloat32) {
      return absl::InvalidArgumentError(
          "grouped gemm: BackwardWeight(float* dw) on an object created with bf16 weight_grad_type");
    }
    return Run(2, x, dy, dw, offsets, stream);
  }
  absl::Status BackwardWeight(const __nv_bfloat16* x, const __nv_bfloat16* dy,
                              const int32_t* offsets, __nv_bfloat16* dw,
                              cudaStream_t stream) override {
    if (options_.weight_grad_type != GradType::kBFloat16) {
      return absl::InvalidArgumentError(
          "grouped gemm: BackwardWeight(bf16* dw) on an object created with fp32 weight_grad_type");
    }
    return Run(2, x, dy, dw, offsets, stream);
  }

  std::string KernelName(GroupedGemmOp op) const override {
    return names_[static_cast<int>(op)];
  }

 private:
  absl::Status Run(int index, const void* a, const void* b, void* d, const int32_t* offsets,
                   cudaStream_t stream) {
    if (a == nullptr || b == nullptr || d == nullptr || offsets == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("grouped gemm ", GroupedGemmOpName(static_cast<GroupedGemmOp>(index)),
                       ": null operand or offsets pointer"));
    }
    for (const void* p : {a, b, static_cast<const void*>(d)}) {
      if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
        return absl::InvalidArgumentError("grouped gemm: operands must be 16-byte aligned");
      }
    }
    if (options_.num_groups == 0) return absl::OkStatus();
    return runners_[index]->Run({a, b, d, offsets}, stream);
  }

  GroupedGemmOptions options_;
  std::unique_ptr<grouped_gemm_internal::GroupedGemmRunner> runners_[3];
  std::string names_[3];
};

}  // namespace
}  // namespace grouped_gemm_internal

absl::StatusOr<bool> DeviceHasHighMemoryBandwidth(int device) {
  int memory_khz = 0, bus_bits = 0;
  cudaError_t err = cudaDeviceGetAttribute(&memory_khz, cudaDevAttrMemoryClockRate, device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device);
  if (err != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", device, ": no memory clock or bus width: ", cudaGetErrorString(err)));
  }
  return grouped_gemm_internal::IsHighMemoryBandwidth(memory_khz, bus_bits);
}

const char* GroupedGemmOpName(GroupedGemmOp op) {
  switch (op) {
    case GroupedGemmOp::kForward:
      return "forward";
    case GroupedGemmOp::kBackwardData:
      return "backward_data";
    case GroupedGemmOp::kBackwardWeight:
      return "backward_weight";
  }
  return "unknown";
}

std::vector<std::string> GroupedGemm::KernelNames(GroupedGemmOp op, GradType weight_grad_type) {
  using namespace grouped_gemm_internal;
  const OutType out = OutTypeOf(op, weight_grad_type);
  int count = 0;
  const KernelEntry* table = KernelTable(&count);
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) {
    if (table[i].op == op && table[i].out == out) names.emplace_back(table[i].name);
  }
  return names;
}

absl::StatusOr<std::unique_ptr<GroupedGemm>> GroupedGemm::Create(
    const GroupedGemmOptions& options) {
  if (options.num_groups < 0 || options.num_groups > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("grouped gemm: num_groups must be in [0, 65535], got ", options.num_groups));
  }
  if (options.k <= 0 || options.k % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("grouped gemm: k must be a positive multiple of 8, got ", options.k));
  }
  if (options.n <= 0 || options.n % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("grouped gemm: n must be a positive multiple of 8, got ", options.n));
  }
  if (options.max_rows < 0 || options.max_rows > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("grouped gemm: max_rows must be in [0, 2^31), got ", options.max_rows));
  }
  auto gemm = std::make_unique<grouped_gemm_internal::GroupedGemmImpl>(options);
  absl::Status status = gemm->Init();
  if (!status.ok()) return status;
  return std::unique_ptr<GroupedGemm>(std::move(gemm));
}

}  // namespace dropless::kernels
