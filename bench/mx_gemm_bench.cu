// dropless-bench mxgemm: forward / dgrad / wgrad TFLOP/s of the MXFP8 grouped GEMM
// (mx_grouped_gemm.h) on the MoE expert shapes (dsv3, qwen3, mixtral; w13 and w2), uniform and
// zipf group sizes, with the device-copy ceiling of the same run. Writes the BENCH.md JSON with
// --json; bench/peers/mx_gemm_peer.py adds torch's rows (bf16 _grouped_mm, fp8 _scaled_grouped_mm)
// from the same group sizes.
#ifdef DROPLESS_HAVE_GROUPED_GEMM

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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
#include "dropless/kernels/mx_grouped_gemm.h"

namespace dropless::bench {
namespace {

using kernels::Bf16;
using kernels::MxGroupedGemm;
using kernels::MxGroupedGemmOptions;
using kernels::MxOperand;

#define MX_BENCH_CUDA(expr) CheckCuda((expr), "mxgemm", #expr)

void MxCheck(const absl::Status& status, const char* what) { CheckStatus(status, "mxgemm", what); }

// Random E4M3 bytes without the NaN codes; scale bytes within 2^-4 .. 2^4.
__global__ void FillMx(uint8_t* p, int64_t count, uint64_t seed, int scales) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t h = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    uint8_t b = static_cast<uint8_t>(h >> 24);
    if (scales) {
      b = static_cast<uint8_t>(123 + (h >> 40) % 9);
    } else if ((b & 0x7F) == 0x7F) {
      b ^= 1;
    }
    p[i] = b;
  }
}

struct Buffer {
  explicit Buffer(size_t bytes) { MX_BENCH_CUDA(cudaMalloc(&ptr, std::max<size_t>(bytes, 16))); }
  ~Buffer() { cudaFree(ptr); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* u8() const { return static_cast<uint8_t*>(ptr); }
  void* ptr = nullptr;
};

// An MXFP8 operand of `elements` bytes (+ elements / 32 scales), filled at random.
struct MxBuffer {
  MxBuffer(size_t elements, uint64_t seed) : data(elements), scales(elements / 32) {
    FillMx<<<4096, 256>>>(data.u8(), static_cast<int64_t>(elements), seed, 0);
    FillMx<<<1024, 256>>>(scales.u8(), static_cast<int64_t>(elements / 32), seed + 7, 1);
    MX_BENCH_CUDA(cudaGetLastError());
  }
  MxOperand op() const { return MxOperand{data.u8(), scales.u8()}; }
  Buffer data, scales;
};

double MxMedianMs(const std::function<void()>& call, int warmup, int iters) {
  return MedianMs(call, warmup, iters, "mxgemm");
}

struct MxRow {
  std::string name, shape, weight, groups, kernel, out, note;
  double ms = 0, tflops = 0, gbps = 0;
};

struct MxFlags : CommonGemmFlags {
  std::vector<std::string> kernels;  // empty: the default kernel; "all": every compiled one
};

MxFlags ParseMxFlags(const std::vector<std::string>& args) {
  MxFlags f;
  for (const std::string& a : args) {
    std::pair<std::string, std::string> kv = absl::StrSplit(a, absl::MaxSplits('=', 1));
    if (ParseCommonGemmFlag(kv.first, kv.second, &f, "mxgemm")) continue;
    if (kv.first == "--kernels") {
      f.kernels = kv.second == "all" ? MxGroupedGemm::KernelNames()
                                     : std::vector<std::string>(absl::StrSplit(kv.second, ','));
    } else {
      std::fprintf(stderr,
                   "mxgemm bench: unknown flag %s\nflags: --json=PATH --commit=SHA "
                   "--shapes=dsv3,qwen3,mixtral --dists=uniform,zipf --ops=fwd,dgrad,wgrad "
                   "--kernels=NAME,...|all --iters=N --cooldown-ms=N\n",
                   a.c_str());
      std::exit(2);
    }
  }
  return f;
}

class MxGemmBench {
 public:
  explicit MxGemmBench(MxFlags flags) : flags_(std::move(flags)) {}

  int Run(const std::vector<std::string>& args) {
    cudaDeviceProp prop{};
    MX_BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
    device_ = absl::StrCat(prop.name, " (1 GPU)");
    {
      const size_t bytes = size_t{4} << 30;
      Buffer src(bytes), dst(bytes);
      MX_BENCH_CUDA(cudaMemset(src.ptr, 1, bytes));
      const double ms = MxMedianMs(
          [&] {
            MX_BENCH_CUDA(cudaMemcpyAsync(dst.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice));
          },
          2, 10);
      copy_gbps_ = 2.0 * bytes / (ms * 1e-3) / 1e9;
      std::printf("ceiling: d2d copy %.0f GB/s\n", copy_gbps_);
    }
    for (const MoeShape& s : kMoeShapes) {
      if (std::find(flags_.shapes.begin(), flags_.shapes.end(), s.name) == flags_.shapes.end())
        continue;
      BenchShape(s, "w13", s.hidden, 2 * s.ffn);
      BenchShape(s, "w2", s.ffn, s.hidden);
    }
    std::printf("%-6s %-8s %-4s %-8s %-4s %9s %8s %8s\n", "op", "shape", "w", "groups", "out", "ms",
                "TFLOP/s", "GB/s");
    for (const MxRow& r : rows_) {
      std::printf("%-6s %-8s %-4s %-8s %-4s %9.3f %8.1f %8.0f\n", r.name.c_str(), r.shape.c_str(),
                  r.weight.c_str(), r.groups.c_str(), r.out.c_str(), r.ms, r.tflops, r.gbps);
    }
    if (!flags_.json.empty()) WriteJson(args);
    return 0;
  }

 private:
  void BenchShape(const MoeShape& s, const std::string& weight, int k, int n) {
    const int64_t rows = s.tokens * s.top_k;
    const int experts = static_cast<int>(s.experts);
    const int64_t padded = (rows + 31 * int64_t{experts} + 31) / 32 * 32;
    const size_t wsize = static_cast<size_t>(experts) * k * n;
    auto want = [&](const char* op) { return flags_.Op(op); };
    // Only the operands of the requested products (a profiler saves and restores every allocation
    // on each replay pass).
    std::unique_ptr<MxBuffer> x, w_t, dy, w, x_col, dy_col;
    std::unique_ptr<Buffer> y, dx, dw32, dw16;
    if (want("fwd")) {
      x = std::make_unique<MxBuffer>(rows * k, 1);
      w_t = std::make_unique<MxBuffer>(wsize, 2);
      y = std::make_unique<Buffer>(rows * n * 2);
    }
    if (want("dgrad")) {
      dy = std::make_unique<MxBuffer>(rows * n, 3);
      w = std::make_unique<MxBuffer>(wsize, 4);
      dx = std::make_unique<Buffer>(rows * k * 2);
    }
    if (want("wgrad")) {
      x_col = std::make_unique<MxBuffer>(static_cast<size_t>(k) * padded, 5);
      dy_col = std::make_unique<MxBuffer>(static_cast<size_t>(n) * padded, 6);
      dw32 = std::make_unique<Buffer>(wsize * 4);
      dw16 = std::make_unique<Buffer>(wsize * 2);
    }
    Buffer offsets((experts + 1) * 4), padded_offsets((experts + 1) * 4);

    MxGroupedGemmOptions o;
    o.num_groups = experts;
    o.k = k;
    o.n = n;
    o.max_rows = rows;
    o.padded_rows = padded;
    o.expected_rows_per_group = rows / experts;
    const std::vector<std::string> kernels =
        flags_.kernels.empty() ? std::vector<std::string>{""} : flags_.kernels;
    // What Create picks for these options: "<fwd/dgrad kernel>[+<wgrad kernel>]".
    std::string default_m, default_k;
    {
      auto created = MxGroupedGemm::Create(o);
      MxCheck(created.status(), "create");
      const std::vector<std::string> parts = absl::StrSplit((*created)->KernelName(), '+');
      default_m = parts[0];
      default_k = parts.back();
    }
    for (const std::string& kernel : kernels) {
      o.kernel = kernel;
      auto created = MxGroupedGemm::Create(o);
      MxCheck(created.status(), "create");
      MxGroupedGemm* g = created->get();

      for (const std::string& dist : flags_.dists) {
        const std::vector<int> sizes = GroupSizes(rows, experts, dist);
        if (weight == "w13" && (kernel.empty() || kernel == kernels[0])) {
          group_sizes_.emplace_back(absl::StrCat(s.name, "/", dist), sizes);
        }
        std::vector<int32_t> host(1, 0), host_padded(1, 0);
        int nonempty = 0;
        for (int v : sizes) {
          host.push_back(host.back() + v);
          host_padded.push_back(host_padded.back() + (v + 31) / 32 * 32);
          nonempty += v > 0;
        }
        MX_BENCH_CUDA(
            cudaMemcpy(offsets.ptr, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
        MX_BENCH_CUDA(cudaMemcpy(padded_offsets.ptr, host_padded.data(), host_padded.size() * 4,
                                 cudaMemcpyHostToDevice));
        const int32_t* off = static_cast<const int32_t*>(offsets.ptr);
        const int32_t* poff = static_cast<const int32_t*>(padded_offsets.ptr);
        const double flop = 2.0 * rows * k * double(n);
        // fp8 bytes plus 1/32 for the scales, each read once; weights of empty experts untouched.
        const double q = 1.0 + 1.0 / 32;
        const double act_k = q * rows * k, act_n = q * rows * n,
                     wbytes = q * nonempty * k * double(n);
        auto add = [&](const char* name, const char* out, double ms, double bytes) {
          const bool is_default =
              g->KernelName() == (std::string(name) == "wgrad" ? default_k : default_m);
          rows_.push_back({name, s.name, weight, dist, g->KernelName(), out,
                           absl::StrCat(weight, " (k=", k, ", n=", n, "), ", dist, " groups, E=",
                                        experts, ", ", rows, " rows, MXFP8 e4m3 + e8m0/32",
                                        is_default ? ", default kernel" : ""),
                           ms, flop / (ms * 1e-3) / 1e12, bytes / (ms * 1e-3) / 1e9});
          const MxRow& r = rows_.back();
          std::printf("%-6s %-8s %-4s %-8s %-4s %-28s %9.3f ms %8.1f TFLOP/s\n", name, s.name,
                      weight.c_str(), dist.c_str(), out, r.kernel.c_str(), r.ms, r.tflops);
          std::fflush(stdout);
        };
        const int wu = flags_.warmup, it = flags_.iters;
        if (want("fwd"))
          add("fwd", "bf16",
              MxMedianMs(
                  [&] {
                    MxCheck(
                        g->Forward(x->op(), w_t->op(), off, static_cast<Bf16*>(y->ptr), nullptr),
                        "fwd");
                  },
                  wu, it),
              act_k + wbytes + 2.0 * rows * n);
        if (want("dgrad"))
          add("dgrad", "bf16",
              MxMedianMs(
                  [&] {
                    MxCheck(g->BackwardData(dy->op(), w->op(), off, static_cast<Bf16*>(dx->ptr),
                                            nullptr),
                            "dgrad");
                  },
                  wu, it),
              act_n + wbytes + 2.0 * rows * k);
        if (want("wgrad"))
          add("wgrad", "fp32",
              MxMedianMs(
                  [&] {
                    MxCheck(g->BackwardWeight(x_col->op(), dy_col->op(), poff,
                                              static_cast<float*>(dw32->ptr), nullptr),
                            "wgrad");
                  },
                  wu, it),
              act_k + act_n + 4.0 * wsize);
        if (want("wgrad"))
          add("wgrad", "bf16",
              MxMedianMs(
                  [&] {
                    MxCheck(g->BackwardWeight(x_col->op(), dy_col->op(), poff,
                                              static_cast<Bf16*>(dw16->ptr), nullptr),
                            "wgrad");
                  },
                  wu, it),
              act_k + act_n + 2.0 * wsize);
      }
    }
  }

  void WriteJson(const std::vector<std::string>& args) const {
    std::vector<std::string> rows;
    for (const MxRow& r : rows_) {
      rows.push_back(absl::StrFormat(
          "    {\"name\": \"%s\", \"shape\": \"%s\", \"impl\": \"dropless\", \"precision\": "
          "\"mxfp8\", \"ms\": %.4f, \"tflops\": %.1f, \"gbps\": %.1f, \"weight\": \"%s\", "
          "\"groups\": \"%s\", \"kernel\": \"%s\", \"out\": \"%s\", \"note\": \"%s\"}",
          r.name, r.shape, r.ms, r.tflops, r.gbps, r.weight, r.groups, r.kernel, r.out, r.note));
    }
    WriteBenchJson(flags_.json, "mxgemm", device_, args, flags_.commit,
                   absl::StrFormat("\"copy_gbps\": %.0f", copy_gbps_), rows, group_sizes_);
  }

  MxFlags flags_;
  std::string device_;
  double copy_gbps_ = 0;
  std::vector<MxRow> rows_;
  std::vector<std::pair<std::string, std::vector<int>>> group_sizes_;
};

int MxGemmBenchMain(const std::vector<std::string>& args) {
  RequireCudaDevice("mxgemm");
  return MxGemmBench(ParseMxFlags(args)).Run(args);
}

}  // namespace

DROPLESS_REGISTER_BENCH(mxgemm, "mxgemm",
                        "MXFP8 grouped GEMM fwd/dgrad/wgrad TFLOP/s on the MoE expert shapes",
                        MxGemmBenchMain);

}  // namespace dropless::bench

#endif  // DROPLESS_HAVE_GROUPED_GEMM
