// dropless-bench mxceiling: how fast can an exact per-32 MXFP8 GEMM run on Hopper at all?
//
// Hopper's fp8 tensor cores have no block scales, so every 32-element K block's product (one k32
// wgmma) must be scaled by sa[row] * sb[col] and added to an fp32 accumulator on the CUDA cores:
// one multiply for the scale product and one fused multiply-add per output element and K block,
// where the tensor cores spend 32 multiply-adds on that element. This bench runs the consumer loop
// of the 256 x 128 MXFP8 kernel (mx_gemm_wide_kernel.cuh: four m64n64k32 pieces per warpgroup and
// K block, the temporaries double buffered, scales read from shared memory) with no global memory
// traffic, no TMA and no barriers: operand tiles and scales stay resident in shared memory. Every
// figure is an upper bound for a real kernel of that design, in TFLOP/s of the GEMM (2 x 32 FLOP
// per element and K block):
//
//   wgmma+promote       the real loop: wgmma, then FMUL (sa * sb) and FFMA per element
//   promote-only        the same fp32 instructions with no wgmma (the CUDA-core issue bound)
//   wgmma+ffma-only     one FFMA per element (a scale product that cost nothing: not a valid
//                       MX semantic, it shows what the product costs)
//   wgmma-only          the k32 wgmmas accumulating in place, no promotion (fp8 tensor rate of
//                       this loop shape)
#ifdef DROPLESS_HAVE_GROUPED_GEMM

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/bench_registry.h"
#include "bench/gemm_bench_common.h"
#include "dropless/kernels/adamw.h"
#include "kernels/cuda/grouped_gemm/mxfp8/mx_gemm_wide_kernel.cuh"
#include "kernels/cuda/hopper/bulk_copy.cuh"
#include "kernels/cuda/hopper/smem.cuh"
#include "kernels/cuda/hopper/wgmma.cuh"

namespace dropless::bench {
namespace {

namespace hopper = kernels::hopper;
namespace mx = kernels::mxgemm;
namespace wide = kernels::mxgemm::wide;

#define CEIL_CUDA(expr) CheckCuda((expr), "mxceiling", #expr)

enum Mode : int { kWgmmaPromote = 0, kPromoteOnly = 1, kWgmmaFfmaOnly = 2, kWgmmaOnly = 3 };
constexpr const char* kModeNames[] = {"wgmma+promote", "promote-only", "wgmma+ffma-only",
                                      "wgmma-only"};

constexpr int kKbPerChunk = 16;  // K blocks whose scales stay resident (4 stages of 4)
constexpr int kSmemBytes = 1024 + wide::kATileBytes + wide::kBTileBytes +
                           kKbPerChunk * (wide::kBM + wide::kSbKb) * 4;

__device__ __forceinline__ uint32_t Hash(uint32_t x) { return kernels::MixBits32(x); }

// Two consumer warpgroups (256 threads) per SM; each runs `chunks` x 16 K blocks of a resident
// 256 x 128 tile. The operands are random E4M3 bytes (no NaN codes, |x| <= 1 so no partial sum
// overflows), the scales random powers of two in 2^-4 .. 2^4.
template <int kMode>
__global__ void __launch_bounds__(256, 1) PromotionCeilingKernel(int chunks, uint32_t seed,
                                                                 float* sink) {
  uint8_t* smem = hopper::AlignedDynamicSmem();
  uint8_t* s_a = smem;
  uint8_t* s_b = s_a + wide::kATileBytes;
  float* s_sa = reinterpret_cast<float*>(s_b + wide::kBTileBytes);
  float* s_sb = s_sa + kKbPerChunk * wide::kBM;
  for (int i = threadIdx.x; i < wide::kATileBytes + wide::kBTileBytes; i += blockDim.x) {
    const uint32_t h = Hash(seed + i * 2654435761U);
    smem[i] = static_cast<uint8_t>((h & 0x80u) | (h % 0x38u));  // sign, exponent < 7: |x| < 1
  }
  for (int i = threadIdx.x; i < kKbPerChunk * (wide::kBM + wide::kSbKb); i += blockDim.x) {
    s_sa[i] = mx::E8M0ToFloat(123 + Hash(seed ^ (i * 40503U + 7)) % 9);
  }
  hopper::FenceSharedForCopies();
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = threadIdx.x / 128;
  const int r0 = (warp % 4) * 16 + lane / 4;
  const int quad = lane % 4;
  constexpr uint64_t kPiece = 64 * wide::kBK / 16;
  constexpr uint64_t kAKb = 2;  // 32 bytes along the 128-byte swizzled rows (KBlockUnits)
  constexpr uint64_t kBKb = 2;
  const uint64_t da = mx::OperandDescriptor<false>(s_a, 0);
  const uint64_t db = mx::OperandDescriptor<false>(s_b, 64 * h);

  float acc[4][32], t0[32], t1[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    t0[i] = 1.0f + 0.001f * (threadIdx.x + i);
    t1[i] = 1.0f - 0.001f * (threadIdx.x + i);
#pragma unroll
    for (int m = 0; m < 4; ++m) acc[m][i] = 0.0f;
  }
  // The real promotion is the kernel's own (wide::PromotePiece); this one is the ffma-only loop.
  auto promote = [&](float(&a)[32], const float(&t)[32], float sa0, float sa1,
                     const float4(&b)[4]) {
    if constexpr (kMode != kWgmmaFfmaOnly) {
      wide::PromotePiece(a, t, sa0, sa1, b);
    } else {
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const float bb[4] = {b[v].x, b[v].y, b[v].z, b[v].w};
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int d = 4 * (2 * v + u);
          a[d + 0] = fmaf(t[d + 0], bb[2 * u], a[d + 0]);
          a[d + 1] = fmaf(t[d + 1], bb[2 * u + 1], a[d + 1]);
          a[d + 2] = fmaf(t[d + 2], sa0, a[d + 2]);
          a[d + 3] = fmaf(t[d + 3], sa1, a[d + 3]);
        }
      }
    }
  };
  auto load_sb = [&](int j, float4(&b)[4]) {
    const uint32_t base =
        hopper::SmemAddr(s_sb + j * wide::kSbKb + h * wide::kSbHalf + quad * wide::kSbQuad);
#pragma unroll
    for (int v = 0; v < 4; ++v) b[v] = hopper::LdsV4F32(base + 16 * v);
  };

  for (int c = 0; c < chunks; ++c) {
    for (int s = 0; s < 4; ++s) {
      const int jb = 4 * s;
      if constexpr (kMode == kWgmmaOnly) {
        hopper::WgmmaFence();
        auto step = [&](auto ic) {
          constexpr int u = decltype(ic)::value, j = u / 4, m = u % 4;
          hopper::FenceRegs(acc[m]);
          hopper::WgmmaM64N64K32(acc[m], da + kPiece * m + kAKb * j, db + kBKb * j, 1);
        };
        wide::Unrolled(step, std::make_integer_sequence<int, 16>{});
        hopper::WgmmaCommit();
        hopper::WgmmaWait<0>();
#pragma unroll
        for (int m = 0; m < 4; ++m) hopper::FenceRegs(acc[m]);
        continue;
      }
      float4 sb[4];
      constexpr bool kMma = kMode != kPromoteOnly;
      if constexpr (kMma) {
        hopper::WgmmaFence();
        hopper::FenceRegs(t0);
        hopper::WgmmaM64N64K32(t0, da, db);
        hopper::WgmmaCommit();
        hopper::FenceRegs(t1);
        hopper::WgmmaM64N64K32(t1, da + kPiece, db);
        hopper::WgmmaCommit();
      }
      auto step = [&](auto ic) {
        constexpr int u = decltype(ic)::value, j = u / 4, m = u % 4;
        if constexpr (m == 0) load_sb(jb + j, sb);
        const float sa0 =
            hopper::LdsF32(hopper::SmemAddr(s_sa + (jb + j) * wide::kBM + 64 * m + r0));
        const float sa1 =
            hopper::LdsF32(hopper::SmemAddr(s_sa + (jb + j) * wide::kBM + 64 * m + r0 + 8));
        if constexpr (kMma) {
          if constexpr (u < 15) {
            hopper::WgmmaWait<1>();
          } else {
            hopper::WgmmaWait<0>();
          }
        }
        auto body = [&](float(&tt)[32]) {
          hopper::FenceRegs(tt);
          promote(acc[m], tt, sa0, sa1, sb);
          if constexpr (kMma && u + 2 < 16) {
            constexpr int j2 = (u + 2) / 4, m2 = (u + 2) % 4;
            hopper::WgmmaFence();
            hopper::FenceRegs(tt);
            hopper::WgmmaM64N64K32(tt, da + kPiece * m2 + kAKb * j2, db + kBKb * j2);
            hopper::WgmmaCommit();
          }
        };
        if constexpr (u % 2 == 0) {
          body(t0);
        } else {
          body(t1);
        }
      };
      wide::Unrolled(step, std::make_integer_sequence<int, 16>{});
    }
  }
  float sum = 0.0f;
#pragma unroll
  for (int m = 0; m < 4; ++m) {
#pragma unroll
    for (int i = 0; i < 32; ++i) sum += acc[m][i];
  }
  sink[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

template <int kMode>
double RunMode(int sms, int chunks, float* sink, int iters) {
  auto kernel = PromotionCeilingKernel<kMode>;
  CEIL_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  uint32_t seed = 1;
  const double ms = MedianMs(
      [&] {
        kernel<<<sms, 256, kSmemBytes>>>(chunks, seed++, sink);
        CEIL_CUDA(cudaGetLastError());
      },
      3, iters, "mxceiling");
  const double flop = 2.0 * sms * static_cast<double>(chunks) * kKbPerChunk * wide::kBM *
                      wide::kBN * 32;
  return flop / (ms * 1e-3) / 1e12;
}

int MxCeilingMain(const std::vector<std::string>& args) {
  RequireCudaDevice("mxceiling");
  std::string json, commit = "unknown";
  int chunks = 100, iters = 20, rounds = 3;
  for (const std::string& a : args) {
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq), value = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (key == "--json") {
      json = value;
    } else if (key == "--commit") {
      commit = value;
    } else if (key == "--chunks") {
      chunks = std::max(1, std::atoi(value.c_str()));
    } else if (key == "--iters") {
      iters = std::max(1, std::atoi(value.c_str()));
    } else if (key == "--rounds") {
      rounds = std::max(1, std::atoi(value.c_str()));
    } else {
      std::fprintf(stderr,
                   "mxceiling bench: unknown flag %s\nflags: --json=PATH --commit=SHA "
                   "--chunks=N (16 K blocks each, per launch) --iters=N --rounds=N\n",
                   a.c_str());
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CEIL_CUDA(cudaGetDeviceProperties(&prop, 0));
  float* sink = nullptr;
  CEIL_CUDA(cudaMalloc(&sink, sizeof(float) * prop.multiProcessorCount * 256));
  // Rounds alternate the mode order (A B C D D C B A ...): every mode sees the same clock.
  std::vector<std::vector<double>> tflops(4);
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < 4; ++i) {
      const int mode = r % 2 == 0 ? i : 3 - i;
      double t = 0;
      switch (mode) {
        case 0: t = RunMode<kWgmmaPromote>(prop.multiProcessorCount, chunks, sink, iters); break;
        case 1: t = RunMode<kPromoteOnly>(prop.multiProcessorCount, chunks, sink, iters); break;
        case 2: t = RunMode<kWgmmaFfmaOnly>(prop.multiProcessorCount, chunks, sink, iters); break;
        default: t = RunMode<kWgmmaOnly>(prop.multiProcessorCount, chunks, sink, iters); break;
      }
      tflops[mode].push_back(t);
    }
  }
  CEIL_CUDA(cudaFree(sink));
  std::printf("%-18s %12s %12s %12s\n", "loop", "TFLOP/s", "min", "max");
  std::vector<std::string> rows;
  for (int m = 0; m < 4; ++m) {
    std::vector<double> v = tflops[m];
    std::sort(v.begin(), v.end());
    const double med = v[v.size() / 2];
    std::printf("%-18s %12.1f %12.1f %12.1f\n", kModeNames[m], med, v.front(), v.back());
    rows.push_back(absl::StrFormat(
        "    {\"name\": \"mx-consumer-loop\", \"shape\": \"resident 256x128 tile\", \"impl\": "
        "\"dropless\", \"precision\": \"mxfp8\", \"ms\": null, \"tflops\": %.1f, \"gbps\": null, "
        "\"kernel\": \"%s\", \"note\": \"upper bound: the 256x128 kernel's consumer loop with "
        "operands and scales resident in shared memory, %d SMs, %d x 16 K blocks per launch; "
        "median of %d rounds of %d launches (round medians %.1f-%.1f)\"}",
        med, kModeNames[m], prop.multiProcessorCount, chunks, rounds, iters, v.front(),
        v.back()));
  }
  if (!json.empty()) {
    WriteBenchJson(json, "mxceiling", absl::StrFormat("%s (1 GPU)", prop.name), args, commit, "",
                   rows, {});
  }
  return 0;
}

}  // namespace

DROPLESS_REGISTER_BENCH(mxceiling, "mxceiling",
                        "upper bound of an exact per-32 MXFP8 GEMM on Hopper (the consumer loop "
                        "with resident operands)",
                        MxCeilingMain);

}  // namespace dropless::bench

#endif  // DROPLESS_HAVE_GROUPED_GEMM
