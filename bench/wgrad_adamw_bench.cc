// `dropless-bench wgrad-adamw`: the routed experts' weight gradient fused with AdamW
// (kernels::GroupedWgradAdamW) against the two passes it replaces, the bf16 grouped GEMM's weight
// gradient (fp32 out, the engine's default kernel) and the engine's AdamW kernel over the same
// weight, on the step's expert shapes (dsv3 as one GPU's EP=8 share: 32 experts), uniform
// groups. Also the fused kernel's own gradient (its GEMM without the update). --moments=bf16
// keeps AdamW's moments in bf16 (optimizer.moment_dtype) in both forms. Rounds alternate the four;
// each figure is the median of the rounds' medians.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_registry.h"
#include "bench/gemm_bench_common.h"
#include "common/job_spec.h"
#include "dropless/kernels/grouped_gemm.h"
#include "dropless/kernels/grouped_wgrad_adamw.h"
#include "worker/engine/cuda/engine_kernels.h"

namespace dropless::bench {
namespace {

constexpr const char* kBench = "wgrad-adamw";

// Fills `count` elements of a device buffer with a repeated host pattern of uniform draws in
// [lo, hi) (bf16 when bf16, else fp32).
void Fill(void* dst, int64_t count, bool bf16, float lo, float hi, uint64_t seed) {
  constexpr int64_t kPattern = 1 << 22;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  const int64_t n = std::min(count, kPattern);
  std::vector<float> f(n);
  for (float& x : f) x = u(rng);
  std::vector<__nv_bfloat16> b;
  const void* src = f.data();
  const size_t elem = bf16 ? 2 : 4;
  if (bf16) {
    b.resize(n);
    for (int64_t i = 0; i < n; ++i) b[i] = __float2bfloat16(f[i]);
    src = b.data();
  }
  for (int64_t at = 0; at < count; at += n) {
    const int64_t c = std::min(n, count - at);
    CheckCuda(cudaMemcpy(static_cast<char*>(dst) + at * elem, src, c * elem, cudaMemcpyHostToDevice),
              kBench, "fill");
  }
}

template <typename T>
T* Alloc(int64_t count) {
  void* p = nullptr;
  CheckCuda(cudaMalloc(&p, std::max<int64_t>(count, 1) * sizeof(T)), kBench, "cudaMalloc");
  return static_cast<T*>(p);
}

int Run(const std::vector<std::string>& args) {
  CommonGemmFlags f;
  int rounds = 3;
  bool bf16_moments = false;
  for (const std::string& a : args) {
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq), value = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (ParseCommonGemmFlag(key, value, &f, kBench)) continue;
    if (key == "--rounds") {
      rounds = std::max(1, std::atoi(value.c_str()));
      continue;
    }
    if (key == "--moments" && (value == "fp32" || value == "bf16")) {
      bf16_moments = value == "bf16";
      continue;
    }
    std::fprintf(stderr,
                 "%s bench: unknown flag %s\nflags: --shapes=dsv3,qwen3,mixtral "
                 "--iters=N --rounds=N --moments=fp32|bf16 --json=PATH --commit=SHA\n",
                 kBench, a.c_str());
    return 2;
  }
  RequireCudaDevice(kBench);
  cudaDeviceProp prop{};
  CheckCuda(cudaGetDeviceProperties(&prop, 0), kBench, "cudaGetDeviceProperties");
  std::vector<std::string> rows;
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  std::printf("%-8s %-4s %9s %9s %9s %9s %9s %8s\n", "shape", "w", "gemm ms", "adamw ms",
              "sum ms", "fused ms", "grad ms", "speedup");
  for (const MoeShape& s : kMoeShapes) {
    if (std::find(f.shapes.begin(), f.shapes.end(), s.name) == f.shapes.end()) continue;
    const int experts = std::string(s.name) == "dsv3" ? 32 : static_cast<int>(s.experts);
    const int64_t rows_total = s.tokens * s.top_k;
    const std::vector<int> sizes = GroupSizes(rows_total, experts, "uniform");
    std::vector<int32_t> offsets(1, 0);
    for (int v : sizes) offsets.push_back(offsets.back() + v);
    groups.emplace_back(absl::StrCat(s.name, "/uniform"), sizes);
    for (int w = 0; w < 2; ++w) {
      const int k = static_cast<int>(w == 0 ? s.hidden : s.ffn);
      const int n = static_cast<int>(w == 0 ? 2 * s.ffn : s.hidden);
      const int64_t params = int64_t{experts} * k * n;
      auto* x = Alloc<__nv_bfloat16>(rows_total * k);
      auto* dy = Alloc<__nv_bfloat16>(rows_total * n);
      auto* d_offsets = Alloc<int32_t>(experts + 1);
      float *param = Alloc<float>(params), *grad = Alloc<float>(params);
      const int64_t moment_floats = bf16_moments ? (params + 1) / 2 : params;
      float *m = Alloc<float>(moment_floats), *v = Alloc<float>(moment_floats);
      auto* copy = Alloc<__nv_bfloat16>(params);
      auto* counter = Alloc<int64_t>(1);
      Fill(x, rows_total * k, true, -1, 1, 1);
      Fill(dy, rows_total * n, true, -1e-3f, 1e-3f, 2);
      Fill(param, params, false, -0.05f, 0.05f, 3);
      Fill(m, params, bf16_moments, -1e-4f, 1e-4f, 4);
      Fill(v, params, bf16_moments, 0, 1e-8f, 5);
      const kernels::AdamWMoments moments{m, v, bf16_moments, /*stream=*/1, /*first=*/0};
      CheckCuda(cudaMemset(counter, 0, sizeof(int64_t)), kBench, "counter");
      CheckCuda(cudaMemcpy(d_offsets, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice),
                kBench, "offsets");

      kernels::GroupedGemmOptions o;
      o.num_groups = experts;
      o.k = k;
      o.n = n;
      o.max_rows = rows_total;
      o.expected_rows_per_group = rows_total / experts;
      o.weight_grad_type = kernels::GradType::kFloat32;
      auto gemm = kernels::GroupedGemm::Create(o);
      CheckStatus(gemm.status(), kBench, "GroupedGemm::Create");
      auto fused = kernels::GroupedWgradAdamW::Create({experts, k, n, rows_total, 0});
      CheckStatus(fused.status(), kBench, "GroupedWgradAdamW::Create");
      OptimizerSpec spec;
      spec.weight_decay = 0.1;
      spec.moment_dtype = bf16_moments ? MomentDtype::kBf16 : MomentDtype::kFp32;
      auto adamw = cuda_engine::FusedAdamW::Create(
          spec,
          {cuda_engine::AdamWTensor{param, grad, /*grad_bf16=*/nullptr, moments, params,
                                    reinterpret_cast<cuda_engine::Bf16*>(copy), 0, 0}},
          counter);
      CheckStatus(adamw.status(), kBench, "FusedAdamW::Create");
      CheckStatus((*adamw)->PrepareStep(nullptr), kBench, "PrepareStep");
      const kernels::AdamWTensors state{param, moments, copy};

      std::vector<double> t[4];
      for (int r = 0; r < rounds; ++r) {
        t[0].push_back(MedianMs([&] {
          CheckStatus((*gemm)->BackwardWeight(x, dy, d_offsets, grad, nullptr), kBench, "gemm");
        }, f.warmup, f.iters, kBench));
        t[1].push_back(MedianMs([&] {
          CheckStatus((*adamw)->Update(0, 1, nullptr), kBench, "adamw");
        }, f.warmup, f.iters, kBench));
        t[2].push_back(MedianMs([&] {
          CheckStatus((*fused)->Update(x, dy, d_offsets, (*adamw)->step_scalars(), state, nullptr),
                      kBench, "fused");
        }, f.warmup, f.iters, kBench));
        t[3].push_back(MedianMs([&] {
          CheckStatus((*fused)->Gradient(x, dy, d_offsets, grad, nullptr), kBench, "gradient");
        }, f.warmup, f.iters, kBench));
      }
      double med[4];
      for (int i = 0; i < 4; ++i) {
        std::sort(t[i].begin(), t[i].end());
        med[i] = t[i][t[i].size() / 2];
      }
      const double flop = 2.0 * rows_total * k * n;
      const char* wname = w == 0 ? "w13" : "w2";
      std::printf("%-8s %-4s %9.3f %9.3f %9.3f %9.3f %9.3f %7.2fx\n", s.name, wname, med[0], med[1],
                  med[0] + med[1], med[2], med[3], (med[0] + med[1]) / med[2]);
      rows.push_back(absl::StrFormat(
          "    {\"shape\": \"%s\", \"weight\": \"%s\", \"moment_dtype\": \"%s\", \"experts\": %d, "
          "\"params\": %d, "
          "\"gemm_ms\": %.4f, \"adamw_ms\": %.4f, \"fused_ms\": %.4f, \"fused_gradient_ms\": %.4f, "
          "\"gemm_tflops\": %.1f, \"fused_gradient_tflops\": %.1f, \"adamw_gbps\": %.0f}",
          s.name, wname, bf16_moments ? "bf16" : "fp32", experts, params, med[0], med[1], med[2],
          med[3], flop / med[0] * 1e-9, flop / med[3] * 1e-9,
          params * (bf16_moments ? 22.0 : 30.0) / med[1] * 1e-6));
      for (void* p : std::initializer_list<void*>{x, dy, d_offsets, param, m, v, grad, copy, counter}) {
        cudaFree(p);
      }
    }
  }
  if (!f.json.empty()) WriteBenchJson(f.json, kBench, prop.name, args, f.commit, "", rows, groups);
  return 0;
}

}  // namespace

DROPLESS_REGISTER_BENCH(wgrad_adamw, "wgrad-adamw",
                        "the weight gradient fused with AdamW against the GEMM and AdamW passes",
                        Run);

}  // namespace dropless::bench
