// dropless-bench gemm: forward / dgrad / wgrad TFLOP/s of the grouped GEMM on the MoE expert
// shapes (dsv3, qwen3, mixtral), uniform and zipf group sizes, next to a cuBLASLt per-group loop
// and the ceilings (dense bf16 GEMM, device copy) measured in the same run. Writes the BENCH.md
// JSON with --json; bench/peers/gemm_peer.py adds torch's rows to it from the same group sizes.
// --precisions=bf16,fp8-block adds the fp8 blockwise-scaled grouped GEMM
// (fp8_block_grouped_gemm.h) on the same shapes and group sizes, as precision "fp8-block".
#ifdef DROPLESS_HAVE_GROUPED_GEMM

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_registry.h"
#include "bench/gemm_bench_common.h"
#include "dropless/kernels/fp8_block.h"
#include "dropless/kernels/fp8_block_grouped_gemm.h"
#include "dropless/kernels/grouped_gemm.h"

namespace dropless::bench {
namespace {

using kernels::CublasLtGroupedGemm;
using kernels::Fp8BlockGroupedGemm;
using kernels::Fp8BlockOperand;
using kernels::GradType;
using kernels::GroupedGemm;
using kernels::GroupedGemmOp;
using kernels::GroupedGemmOptions;

#define BENCH_CUDA(expr) CheckCuda((expr), "gemm", #expr)

void Check(const absl::Status& status, const char* what) { CheckStatus(status, "gemm", what); }

__global__ void FillRandomBf16(__nv_bfloat16* p, int64_t count, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t h = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = __float2bfloat16(2.0f * u - 1.0f);
  }
}

// Random E4M3 bytes without the NaN codes (scales = 0), or positive fp32 scales in
// [2^-4, 2^4) (scales = 1, p holding floats).
__global__ void FillFp8Block(uint8_t* p, int64_t count, uint64_t seed, int scales) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t h = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    if (scales) {
      reinterpret_cast<float*>(p)[i] = ldexpf(1.0f + (h >> 40) * (1.0f / 16777216.0f),
                                              static_cast<int>((h >> 8) % 8) - 4);
    } else {
      const uint8_t b = static_cast<uint8_t>(h >> 24);
      p[i] = (b & 0x7F) == 0x7F ? static_cast<uint8_t>(b ^ 1) : b;
    }
  }
}

template <class T>
struct DeviceMemory {
  explicit DeviceMemory(size_t count) {
    BENCH_CUDA(cudaMalloc(&ptr, std::max<size_t>(count, 1) * sizeof(T)));
  }
  ~DeviceMemory() { cudaFree(ptr); }
  T* ptr = nullptr;
};

double MedianMs(const std::function<void()>& call, int warmup, int iters) {
  return bench::MedianMs(call, warmup, iters, "gemm");
}

struct Row {
  std::string name, shape, impl, precision, weight, groups, kernel, out, note;
  double ms = 0, tflops = 0, gbps = 0;
};

std::string RowJson(const Row& r) {
  return absl::StrFormat(
      "    {\"name\": \"%s\", \"shape\": \"%s\", \"impl\": \"%s\", \"precision\": \"%s\", "
      "\"ms\": %.4f, \"tflops\": %.1f, \"gbps\": %.1f, \"weight\": \"%s\", \"groups\": \"%s\", "
      "\"kernel\": \"%s\", \"out\": \"%s\", \"note\": \"%s\"}",
      r.name, r.shape, r.impl, r.precision, r.ms, r.tflops, r.gbps, r.weight, r.groups, r.kernel,
      r.out, r.note);
}

struct Flags : CommonGemmFlags {
  bool sweep = false, cublas = true;
  bool bf16 = true, fp8_block = false;  // --precisions
  // --fp8-block-x-scaling=per-block: the fp8-block weight gradient reads X's scales per 128 x 128
  // block (precision fp8-block-wgrad128's layout and default kernel) instead of per column.
  kernels::Fp8ColwiseScaling fp8_block_x_scaling = kernels::Fp8ColwiseScaling::kPerColumn;
};

Flags ParseFlags(const std::vector<std::string>& args) {
  Flags f;
  for (const std::string& a : args) {
    std::pair<std::string, std::string> kv = absl::StrSplit(a, absl::MaxSplits('=', 1));
    if (ParseCommonGemmFlag(kv.first, kv.second, &f, "gemm")) continue;
    if (kv.first == "--sweep") {
      f.sweep = true;
    } else if (kv.first == "--fp8-block-x-scaling") {
      if (kv.second == "per-column") {
        f.fp8_block_x_scaling = kernels::Fp8ColwiseScaling::kPerColumn;
      } else if (kv.second == "per-block") {
        f.fp8_block_x_scaling = kernels::Fp8ColwiseScaling::kPerBlock;
      } else {
        std::fprintf(stderr, "gemm bench: --fp8-block-x-scaling: '%s' (per-column, per-block)\n",
                     kv.second.c_str());
        std::exit(2);
      }
    } else if (kv.first == "--no-cublas") {
      f.cublas = false;
    } else if (kv.first == "--precisions") {
      f.bf16 = f.fp8_block = false;
      for (absl::string_view p : absl::StrSplit(kv.second, ',')) {
        if (p == "bf16") {
          f.bf16 = true;
        } else if (p == "fp8-block") {
          f.fp8_block = true;
        } else {
          std::fprintf(stderr, "gemm bench: --precisions: unknown '%s' (bf16, fp8-block)\n",
                       std::string(p).c_str());
          std::exit(2);
        }
      }
    } else {
      std::fprintf(
          stderr,
          "gemm bench: unknown flag %s\nflags: --json=PATH --commit=SHA "
          "--shapes=dsv3,qwen3,mixtral --dists=uniform,zipf --ops=fwd,dgrad,wgrad --sweep --no-cublas "
          "--precisions=bf16,fp8-block --fp8-block-x-scaling=per-column|per-block --iters=N "
          "--cooldown-ms=N\n",
          a.c_str());
      std::exit(2);
    }
  }
  return f;
}

// The fp8-block grouped GEMM on one expert shape: operands in the fp8_block.h layouts, filled at
// random once (E4M3 bytes without the NaN codes, fp32 scales in [2^-4, 2^4)), only for the
// requested products; the outputs are the bf16 bench's buffers (same shapes).
class Fp8BlockBench {
 public:
  Fp8BlockBench(int64_t rows, int experts, int k, int n, const Flags& flags)
      : rows_(rows), experts_(experts), k_(k), n_(n),
        padded_(kernels::Fp8ColwisePaddedRows(rows, experts)),
        offsets_(experts + 1), padded_offsets_(experts + 1) {
    const int64_t w = static_cast<int64_t>(experts) * k * n, wb = w / (128 * 128);
    if (flags.Op("fwd")) {
      Make(&x_, rows * k, rows * k / 128, 21);
      Make(&w_t_, w, wb, 22);
    }
    if (flags.Op("dgrad")) {
      Make(&dy_, rows * n, rows * n / 128, 23);
      Make(&w_, w, wb, 24);
    }
    if (flags.Op("wgrad")) {
      Make(&x_col_, padded_ * k, padded_ / 128 * k, 25);
      Make(&dy_col_, padded_ * n, padded_ / 128 * n, 26);
    }
    BENCH_CUDA(cudaGetLastError());
    kernels::Fp8BlockGroupedGemmOptions o;
    o.num_groups = experts;
    o.k = k;
    o.n = n;
    o.max_rows = rows;
    o.padded_rows = padded_;
    o.x_scaling = flags.fp8_block_x_scaling;
    auto gemm = Fp8BlockGroupedGemm::Create(o);
    Check(gemm.status(), "fp8-block create");
    gemm_ = *std::move(gemm);
  }

  // Times the requested products for one set of group sizes; appends a row each to `out` (base
  // gives the shape, weight, groups and the start of the note).
  void Run(const std::vector<int>& sizes, const Row& base, __nv_bfloat16* y, __nv_bfloat16* dx,
           float* dw, const Flags& flags, std::vector<Row>* out) {
    std::vector<int32_t> host(1, 0), host_padded(1, 0);
    int nonempty = 0;
    for (int v : sizes) {
      host.push_back(host.back() + v);
      host_padded.push_back(host_padded.back() + (v + 127) / 128 * 128);
      nonempty += v > 0;
    }
    BENCH_CUDA(cudaMemcpy(offsets_.ptr, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(padded_offsets_.ptr, host_padded.data(), host_padded.size() * 4,
                          cudaMemcpyHostToDevice));
    const double q = 1.0 + 4.0 / 128;  // an fp32 scale per 128 elements
    const double act_k = q * rows_ * k_, act_n = q * rows_ * n_;
    const double wbytes = double(nonempty) * k_ * n_;  // weights of empty experts untouched
    const double flop = 2.0 * rows_ * k_ * double(n_);
    // KernelName() is "<forward>+<data gradient>+<weight gradient>": each row names its own.
    const std::vector<std::string> kernels = absl::StrSplit(gemm_->KernelName(), '+');
    auto add = [&](const char* name, const char* type, double ms, double bytes) {
      Row r = base;
      r.name = name;
      r.impl = "dropless";
      r.precision = std::string(name) == "wgrad" &&
                            flags.fp8_block_x_scaling == kernels::Fp8ColwiseScaling::kPerBlock
                        ? "fp8-block-wgrad128"
                        : "fp8-block";
      const size_t part = std::string(name) == "fwd" ? 0 : std::string(name) == "dgrad" ? 1 : 2;
      r.kernel = part < kernels.size() ? kernels[part] : gemm_->KernelName();
      r.out = type;
      r.ms = ms;
      r.tflops = flop / (ms * 1e-3) / 1e12;
      r.gbps = bytes / (ms * 1e-3) / 1e9;
      r.note += ", fp8 e4m3 + fp32 scales per 1x128 tile / 128x128 weight block";
      out->push_back(r);
    };
    const int wu = flags.warmup, it = flags.iters;
    if (flags.Op("fwd")) {
      auto call = [&] {
        Check(gemm_->Forward(x_.Op(), w_t_.Op(), offsets_.ptr, Out(y), nullptr), "fp8-block fwd");
      };
      add("fwd", "bf16", MedianMs(call, wu, it), act_k + wbytes + 2.0 * rows_ * n_);
    }
    if (flags.Op("dgrad")) {
      auto call = [&] {
        Check(gemm_->BackwardData(dy_.Op(), w_.Op(), offsets_.ptr, Out(dx), nullptr),
              "fp8-block dgrad");
      };
      add("dgrad", "bf16", MedianMs(call, wu, it), act_n + wbytes + 2.0 * rows_ * k_);
    }
    if (flags.Op("wgrad")) {
      auto call = [&] {
        Check(gemm_->BackwardWeight(x_col_.Op(), dy_col_.Op(), padded_offsets_.ptr, dw, nullptr),
              "fp8-block wgrad");
      };
      add("wgrad", "fp32", MedianMs(call, wu, it),
          act_k + act_n + 4.0 * experts_ * k_ * double(n_));
    }
  }

 private:
  struct Operand {
    std::unique_ptr<DeviceMemory<uint8_t>> data;
    std::unique_ptr<DeviceMemory<float>> scales;
    Fp8BlockOperand Op() const { return {data->ptr, scales->ptr}; }
  };
  static void Make(Operand* op, int64_t elements, int64_t scales, uint64_t seed) {
    op->data = std::make_unique<DeviceMemory<uint8_t>>(elements);
    op->scales = std::make_unique<DeviceMemory<float>>(scales);
    FillFp8Block<<<4096, 256>>>(op->data->ptr, elements, seed, 0);
    FillFp8Block<<<1024, 256>>>(reinterpret_cast<uint8_t*>(op->scales->ptr), scales, seed + 7, 1);
  }
  static kernels::Bf16* Out(__nv_bfloat16* p) { return reinterpret_cast<kernels::Bf16*>(p); }

  int64_t rows_;
  int experts_, k_, n_;
  int64_t padded_;
  DeviceMemory<int32_t> offsets_, padded_offsets_;
  Operand x_, w_t_, dy_, w_, x_col_, dy_col_;
  std::unique_ptr<Fp8BlockGroupedGemm> gemm_;
};

class GemmBench {
 public:
  explicit GemmBench(Flags flags) : flags_(std::move(flags)) {}

  int Run(const std::vector<std::string>& args) {
    cudaDeviceProp prop{};
    BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
    device_ = absl::StrCat(prop.name, " (1 GPU)");
    MeasureCeilings();
    for (const MoeShape& shape : kMoeShapes) {
      if (std::find(flags_.shapes.begin(), flags_.shapes.end(), shape.name) == flags_.shapes.end())
        continue;
      BenchShape(shape, "w13", shape.hidden, 2 * shape.ffn);
      BenchShape(shape, "w2", shape.ffn, shape.hidden);
    }
    PrintTable();
    if (!flags_.json.empty()) WriteJson(args);
    return 0;
  }

 private:
  void MeasureCeilings() {
    const size_t bytes = size_t{4} << 30;
    DeviceMemory<char> src(bytes), dst(bytes);
    BENCH_CUDA(cudaMemset(src.ptr, 1, bytes));
    const double copy_ms = MedianMs(
        [&] { BENCH_CUDA(cudaMemcpyAsync(dst.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice)); }, 2,
        10);
    copy_gbps_ = 2.0 * bytes / (copy_ms * 1e-3) / 1e9;

    const int d = 8192;
    DeviceMemory<__nv_bfloat16> a(size_t{d} * d), b(size_t{d} * d), c(size_t{d} * d);
    FillRandomBf16<<<1024, 256>>>(a.ptr, int64_t{d} * d, 1);
    FillRandomBf16<<<1024, 256>>>(b.ptr, int64_t{d} * d, 2);
    auto dense = CublasLtGroupedGemm::Create(1, d, d);
    Check(dense.status(), "cublasLt dense");
    const std::vector<int32_t> offsets = {0, d};
    const double gemm_ms = MedianMs(
        [&] { Check((*dense)->Forward(a.ptr, b.ptr, offsets, c.ptr, nullptr), "dense"); }, 3, 20);
    dense_tflops_ = 2.0 * d * d * double(d) / (gemm_ms * 1e-3) / 1e12;
    std::printf("ceilings: d2d copy %.0f GB/s, dense bf16 GEMM 8192^3 %.1f TFLOP/s\n", copy_gbps_,
                dense_tflops_);
  }

  void BenchShape(const MoeShape& s, const std::string& weight, int k, int n) {
    const int64_t rows = s.tokens * s.top_k;
    const int experts = static_cast<int>(s.experts);
    const size_t wsize = static_cast<size_t>(experts) * k * n;
    DeviceMemory<__nv_bfloat16> x(rows * k), w(wsize), dy(rows * n), y(rows * n), dx(rows * k),
        dw16(wsize);
    DeviceMemory<float> dw32(wsize);
    DeviceMemory<int32_t> offsets(experts + 1);
    FillRandomBf16<<<4096, 256>>>(x.ptr, rows * k, 11);
    FillRandomBf16<<<4096, 256>>>(w.ptr, static_cast<int64_t>(wsize), 12);
    FillRandomBf16<<<4096, 256>>>(dy.ptr, rows * n, 13);
    BENCH_CUDA(cudaGetLastError());
    std::unique_ptr<Fp8BlockBench> fp8;
    if (flags_.fp8_block) fp8 = std::make_unique<Fp8BlockBench>(rows, experts, k, n, flags_);

    for (const std::string& dist : flags_.dists) {
      const std::vector<int> sizes = GroupSizes(rows, experts, dist);
      group_sizes_.emplace_back(absl::StrCat(s.name, "/", dist), sizes);
      std::vector<int32_t> host_offsets(1, 0);
      int nonempty = 0;
      for (int v : sizes) {
        host_offsets.push_back(host_offsets.back() + v);
        nonempty += v > 0;
      }
      BENCH_CUDA(cudaMemcpy(offsets.ptr, host_offsets.data(), host_offsets.size() * 4,
                            cudaMemcpyHostToDevice));
      const double flop = 2.0 * rows * k * double(n);
      // Bytes each operand is read or written once; weights of empty experts are not touched.
      const double act_in = 2.0 * rows * k, act_out = 2.0 * rows * n;
      const double wbytes = 2.0 * nonempty * k * double(n);
      const double gbytes16 = 2.0 * experts * k * double(n), gbytes32 = 2 * gbytes16;
      auto add = [&](const char* name, const std::string& impl, const std::string& kernel,
                     const char* out, double ms, double bytes, const std::string& note) {
        rows_.push_back({name, s.name, impl, "bf16", weight, dist, kernel, out,
                         absl::StrCat(weight, " (k=", k, ", n=", n, "), ", dist,
                                      " groups, E=", experts, ", ", rows, " rows", note),
                         ms, flop / (ms * 1e-3) / 1e12, bytes / (ms * 1e-3) / 1e9});
      };
      if (fp8 != nullptr) {
        Row base;
        base.shape = s.name;
        base.weight = weight;
        base.groups = dist;
        base.note = absl::StrCat(weight, " (k=", k, ", n=", n, "), ", dist, " groups, E=",
                                 experts, ", ", rows, " rows");
        fp8->Run(sizes, base, y.ptr, dx.ptr, dw32.ptr, flags_, &rows_);
      }
      if (!flags_.bf16) continue;

      GroupedGemmOptions options;
      options.num_groups = experts;
      options.k = k;
      options.n = n;
      options.max_rows = rows;
      options.expected_rows_per_group = rows / experts;
      for (GradType grad : {GradType::kFloat32, GradType::kBFloat16}) {
        options.weight_grad_type = grad;
        auto chosen = GroupedGemm::Create(options);
        Check(chosen.status(), "create");
        std::vector<std::string> fwd = {(*chosen)->KernelName(GroupedGemmOp::kForward)};
        std::vector<std::string> dgrad = {(*chosen)->KernelName(GroupedGemmOp::kBackwardData)};
        std::vector<std::string> wgrad = {(*chosen)->KernelName(GroupedGemmOp::kBackwardWeight)};
        if (flags_.sweep) {
          fwd = GroupedGemm::KernelNames(GroupedGemmOp::kForward, grad);
          // Visiting-order variants (raster along N; swizzled runs of 4 along M) of the wide tile.
          for (const char* base : {"coop_128x256x64_c1x2"}) {
            if (std::find(fwd.begin(), fwd.end(), base) == fwd.end()) continue;
            fwd.push_back(absl::StrCat(base, "@N1"));
            fwd.push_back(absl::StrCat(base, "@M4"));
          }
          dgrad = GroupedGemm::KernelNames(GroupedGemmOp::kBackwardData, grad);
          wgrad = GroupedGemm::KernelNames(GroupedGemmOp::kBackwardWeight, grad);
        }
        const bool f32 = grad == GradType::kFloat32;
        const int warmup = flags_.warmup, iters = flags_.iters;
        for (size_t i = 0; i < std::max({fwd.size(), dgrad.size(), wgrad.size()}); ++i) {
          GroupedGemmOptions forced = options;
          forced.forward_kernel = fwd[std::min(i, fwd.size() - 1)];
          forced.backward_data_kernel = dgrad[std::min(i, dgrad.size() - 1)];
          forced.backward_weight_kernel = wgrad[std::min(i, wgrad.size() - 1)];
          auto gemm = GroupedGemm::Create(forced);
          Check(gemm.status(), "create forced");
          GroupedGemm* g = gemm->get();
          auto tag = [&](GroupedGemmOp op, const std::string& name) {
            return name == (*chosen)->KernelName(op) ? std::string(", default kernel")
                                                     : std::string();
          };
          // The bf16 object re-measures forward and dgrad only when sweeping would repeat them.
          if (f32 && i < fwd.size() && flags_.Op("fwd")) {
            add("fwd", "dropless", forced.forward_kernel, "bf16",
                MedianMs(
                    [&] { Check(g->Forward(x.ptr, w.ptr, offsets.ptr, y.ptr, nullptr), "fwd"); },
                    warmup, iters),
                act_in + wbytes + act_out, tag(GroupedGemmOp::kForward, forced.forward_kernel));
          }
          if (f32 && i < dgrad.size() && flags_.Op("dgrad")) {
            add("dgrad", "dropless", forced.backward_data_kernel, "bf16",
                MedianMs(
                    [&] {
                      Check(g->BackwardData(dy.ptr, w.ptr, offsets.ptr, dx.ptr, nullptr), "dgrad");
                    },
                    warmup, iters),
                act_out + wbytes + act_in,
                tag(GroupedGemmOp::kBackwardData, forced.backward_data_kernel));
          }
          if (i < wgrad.size() && flags_.Op("wgrad")) {
            const double ms = MedianMs(
                [&] {
                  Check(f32 ? g->BackwardWeight(x.ptr, dy.ptr, offsets.ptr, dw32.ptr, nullptr)
                            : g->BackwardWeight(x.ptr, dy.ptr, offsets.ptr, dw16.ptr, nullptr),
                        "wgrad");
                },
                warmup, iters);
            add("wgrad", "dropless", forced.backward_weight_kernel, f32 ? "fp32" : "bf16", ms,
                act_in + act_out + (f32 ? gbytes32 : gbytes16),
                tag(GroupedGemmOp::kBackwardWeight, forced.backward_weight_kernel));
          }
        }
      }

      if (flags_.cublas) {
        auto loop = CublasLtGroupedGemm::Create(experts, k, n);
        Check(loop.status(), "cublasLt loop");
        CublasLtGroupedGemm* l = loop->get();
        const int it = 5;
        if (flags_.Op("fwd")) {
          add("fwd", "cublaslt-loop", "per-group cublasLtMatmul", "bf16",
              MedianMs(
                  [&] {
                    Check(l->Forward(x.ptr, w.ptr, host_offsets, y.ptr, nullptr), "loop fwd");
                  },
                  1, it),
              act_in + wbytes + act_out, "");
        }
        if (flags_.Op("dgrad")) {
          add("dgrad", "cublaslt-loop", "per-group cublasLtMatmul", "bf16",
              MedianMs(
                  [&] {
                    Check(l->BackwardData(dy.ptr, w.ptr, host_offsets, dx.ptr, nullptr),
                          "loop dgrad");
                  },
                  1, it),
              act_out + wbytes + act_in, "");
        }
        if (flags_.Op("wgrad")) {
          add("wgrad", "cublaslt-loop", "per-group cublasLtMatmul", "bf16",
              MedianMs(
                  [&] {
                    Check(l->BackwardWeight(x.ptr, dy.ptr, host_offsets, dw16.ptr, nullptr),
                          "loop wgrad");
                  },
                  1, it),
              act_in + act_out + gbytes16, "");
        }
      }
      std::fflush(stdout);
    }
  }

  void PrintTable() const {
    std::printf("%-6s %-8s %-4s %-8s %-14s %-28s %-4s %9s %8s %8s\n", "op", "shape", "w", "groups",
                "impl", "kernel", "out", "ms", "TFLOP/s", "GB/s");
    for (const Row& r : rows_) {
      std::printf("%-6s %-8s %-4s %-8s %-14s %-28s %-4s %9.3f %8.1f %8.0f\n", r.name.c_str(),
                  r.shape.c_str(), r.weight.c_str(), r.groups.c_str(), r.impl.c_str(),
                  r.kernel.substr(0, 28).c_str(), r.out.c_str(), r.ms, r.tflops, r.gbps);
    }
  }

  void WriteJson(const std::vector<std::string>& args) const {
    std::vector<std::string> rows;
    for (const Row& r : rows_) rows.push_back(RowJson(r));
    WriteBenchJson(flags_.json, "gemm", device_, args, flags_.commit,
                   absl::StrFormat("\"copy_gbps\": %.0f, \"dense_bf16_tflops\": %.1f", copy_gbps_,
                                   dense_tflops_),
                   rows, group_sizes_);
  }

  Flags flags_;
  std::string device_;
  double copy_gbps_ = 0, dense_tflops_ = 0;
  std::vector<Row> rows_;
  std::vector<std::pair<std::string, std::vector<int>>> group_sizes_;
};

int GemmBenchMain(const std::vector<std::string>& args) {
  RequireCudaDevice("gemm");
  return GemmBench(ParseFlags(args)).Run(args);
}

}  // namespace

DROPLESS_REGISTER_BENCH(gemm, "gemm",
                        "grouped GEMM fwd/dgrad/wgrad TFLOP/s on the MoE expert shapes",
                        GemmBenchMain);

}  // namespace dropless::bench

#endif  // DROPLESS_HAVE_GROUPED_GEMM
