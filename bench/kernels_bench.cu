// dropless-bench kernels: achieved bandwidth of the memory-bound MoE kernels (routing, dispatch
// plan, permute / unpermute, SwiGLU, MXFP8 quantization) on the dsv3 and qwen3 shapes, next to a
// device-to-device copy measured in the same run. gbps counts the bytes each kernel must read plus
// the bytes it must write, once each (BENCH.md). Writes the BENCH.md JSON with --json PATH.
//
//   dropless-bench kernels [--json PATH] [--shapes dsv3,qwen3] [--reps 20] [--commit SHA]
//                          [--timing queued|synced]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_registry.h"
#include "dropless/kernels/dispatch_plan.h"
#include "dropless/kernels/fp8_block.h"
#include "dropless/kernels/mxfp8.h"
#include "dropless/kernels/permute.h"
#include "dropless/kernels/router_gemm.h"
#include "dropless/kernels/routing.h"
#include "dropless/kernels/swiglu.h"

namespace dropless::bench {
namespace {

namespace k = ::dropless::kernels;

#define KB_CUDA(expr)                                                                  \
  do {                                                                                 \
    const cudaError_t e_ = (expr);                                                     \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "kernels bench: %s: %s\n", #expr, cudaGetErrorString(e_));  \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

struct Shape {
  const char* name;
  int64_t tokens, hidden, ffn;
  int experts, top_k;
};
constexpr Shape kShapes[] = {{"dsv3", 8192, 7168, 2048, 256, 8}, {"qwen3", 16384, 2048, 768, 128, 8}};

struct Row {
  std::string name, shape, impl, precision, note;
  double ms = 0, gbps = 0, tflops = 0;
  bool has_gbps = false, has_tflops = false;
};

// Device allocation released at exit of the shape's scope.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { KB_CUDA(cudaMalloc(&ptr, std::max<size_t>(bytes, 1))); }
  ~DeviceBuffer() { cudaFree(ptr); }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr); }
};

// A per-run buffer small enough to stay in L2 from one timed run to the next (the MXFP8 scale
// arrays: 3-15 MB against the H200's 50 MB L2). Back to back, a run would find the previous run's
// lines of it in L2 and write (or read) them there instead of in DRAM: an L2 policy that keeps
// them (evict-last stores) then reads faster than the kernel is in a training step, where each
// layer has its own buffers. Each run takes the next of enough copies that together they exceed
// kRotationBytes, several times the L2. Copies start as `init`'s bytes when given (inputs).
class Rotation {
 public:
  static constexpr size_t kRotationBytes = size_t{256} << 20;
  explicit Rotation(size_t bytes, const void* init = nullptr) {
    const size_t n = std::max<size_t>(2, (kRotationBytes + bytes - 1) / std::max<size_t>(bytes, 1));
    for (size_t i = 0; i < n; ++i) {
      copies_.push_back(std::make_unique<DeviceBuffer>(bytes));
      if (init != nullptr) {
        KB_CUDA(cudaMemcpy(copies_.back()->ptr, init, bytes, cudaMemcpyDeviceToDevice));
      }
    }
  }
  template <typename T>
  T* Next() {
    T* p = copies_[next_]->as<T>();
    next_ = (next_ + 1) % copies_.size();
    return p;
  }

 private:
  std::vector<std::unique_ptr<DeviceBuffer>> copies_;
  size_t next_ = 0;
};

__global__ void FillBf16(uint16_t* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    // Sum of two uniforms in [-1, 1), scaled: bell-shaped, never all zeros.
    const float a = static_cast<float>(z & 0xffffff) / 8388608.0f - 1.0f;
    const float b = static_cast<float>((z >> 24) & 0xffffff) / 8388608.0f - 1.0f;
    const float v = (a + b) * scale;
    p[i] = static_cast<uint16_t>(__float_as_uint(v) >> 16);
  }
}

__global__ void FillFloat(float* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t z = (i + 7) * 0x9E3779B97F4A7C15ull ^ seed;
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 29;
    p[i] = (static_cast<float>(z & 0xffffff) / 8388608.0f - 1.0f) * scale;
  }
}

void RandomBf16(void* p, int64_t n, float scale = 1.0f) {
  static uint64_t seed = 12345;
  FillBf16<<<1024, 256>>>(static_cast<uint16_t*>(p), n, seed++, scale);
  KB_CUDA(cudaGetLastError());
}
void RandomFloat(float* p, int64_t n, float scale = 1.0f) {
  static uint64_t seed = 777;
  FillFloat<<<1024, 256>>>(p, n, seed++, scale);
  KB_CUDA(cudaGetLastError());
}

// How a kernel's runs are timed.
//  kQueued (default): the timed runs are enqueued back to back, an event between each two, and the
//    host waits once at the end (as gemm_bench_common.h's MedianMs and the torch peers do). Each
//    interval is one run on the GPU plus the stream's gap between two launches: the host's launch
//    cost overlaps the previous run, as it does in a training step.
//  kSynced: the host waits after every run, so each interval also holds the host-side time from
//    the start event to the launch reaching the GPU (a few microseconds: a visible share of a
//    0.1 ms kernel, nothing of the 2 GiB copy). Kept to measure that difference.
enum class Timing { kQueued, kSynced };

class Timer {
 public:
  Timer(int reps, Timing timing) : reps_(reps), timing_(timing), events_(reps + 1) {
    for (cudaEvent_t& e : events_) KB_CUDA(cudaEventCreate(&e));
  }
  ~Timer() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // Median milliseconds of `reps` timed runs after 3 warm-up runs; fails on the first bad status.
  absl::StatusOr<double> Median(const std::function<absl::Status()>& run) {
    for (int i = 0; i < 3; ++i) {
      if (absl::Status s = run(); !s.ok()) return s;
    }
    KB_CUDA(cudaDeviceSynchronize());
    std::vector<float> ms(reps_);
    if (timing_ == Timing::kQueued) {
      KB_CUDA(cudaEventRecord(events_[0]));
      for (int i = 0; i < reps_; ++i) {
        if (absl::Status s = run(); !s.ok()) return s;
        KB_CUDA(cudaEventRecord(events_[i + 1]));
      }
      KB_CUDA(cudaEventSynchronize(events_[reps_]));
      for (int i = 0; i < reps_; ++i) {
        KB_CUDA(cudaEventElapsedTime(&ms[i], events_[i], events_[i + 1]));
      }
    } else {
      for (int i = 0; i < reps_; ++i) {
        KB_CUDA(cudaEventRecord(events_[0]));
        if (absl::Status s = run(); !s.ok()) return s;
        KB_CUDA(cudaEventRecord(events_[1]));
        KB_CUDA(cudaEventSynchronize(events_[1]));
        KB_CUDA(cudaEventElapsedTime(&ms[i], events_[0], events_[1]));
      }
    }
    KB_CUDA(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    return static_cast<double>(ms[reps_ / 2]);
  }

 private:
  int reps_;
  Timing timing_;
  std::vector<cudaEvent_t> events_;
};

class KernelsBench {
 public:
  KernelsBench(int reps, Timing timing)
      : timer_(reps, timing), timing_name_(timing == Timing::kQueued ? "queued" : "synced") {}

  // The ceiling: a large device-to-device copy (bytes read + written).
  void MeasureCopy() {
    const size_t bytes = size_t{2} << 30;
    DeviceBuffer a(bytes), b(bytes);
    RandomBf16(a.ptr, bytes / 2);
    absl::StatusOr<double> ms = timer_.Median([&] {
      return cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice) == cudaSuccess
                 ? absl::OkStatus()
                 : absl::InternalError("cudaMemcpyAsync");
    });
    if (!ms.ok()) Fail(ms.status(), "d2d copy");
    copy_gbps_ = 2.0 * bytes / (*ms * 1e6);
    Add({"d2d_copy", "2GiB", "d2d-copy", "bf16",
         absl::StrCat("cudaMemcpyAsync device to device, 2 GiB; timing ", timing_name_), *ms,
         copy_gbps_, 0, true, false});
  }

  void Time(const Shape& s, const std::string& name, const std::string& precision, double bytes,
            const std::string& note, const std::function<absl::Status()>& run) {
    absl::StatusOr<double> ms = timer_.Median(run);
    if (!ms.ok()) Fail(ms.status(), name.c_str());
    const double gbps = bytes / (*ms * 1e6);
    Add({name, s.name, "dropless", precision,
         absl::StrFormat("%s%s%.0f%% of d2d copy", note, note.empty() ? "" : "; ",
                         100.0 * gbps / copy_gbps_),
         *ms, gbps, 0, true, false});
  }

  void TimeFlops(const Shape& s, const std::string& name, double flops, const std::string& note,
                 const std::function<absl::Status()>& run) {
    absl::StatusOr<double> ms = timer_.Median(run);
    if (!ms.ok()) Fail(ms.status(), name.c_str());
    Add({name, s.name, "dropless", "bf16", note, *ms, 0, flops / (*ms * 1e9), false, true});
  }

  void RunShape(const Shape& s);
  // The fp8-block kernels on the shape's permuted rows `rows` [T*k][H] (bf16, random), grouped by
  // the plan's `offsets`; `slot_of` is the plan's, `x` the tokens.
  void RunFp8Block(const Shape& s, const DeviceBuffer& x, const DeviceBuffer& rows,
                   const DeviceBuffer& offsets, const DeviceBuffer& slot_of);
  std::string Json(const std::string& command, const std::string& commit) const;
  double copy_gbps() const { return copy_gbps_; }

 private:
  void Add(Row row) {
    std::printf("%-26s %-6s %-10s %-6s %9.4f ms  %8.1f GB/s %8.1f TFLOP/s  %s\n", row.name.c_str(),
                row.shape.c_str(), row.impl.c_str(), row.precision.c_str(), row.ms,
                row.has_gbps ? row.gbps : 0.0, row.has_tflops ? row.tflops : 0.0, row.note.c_str());
    std::fflush(stdout);
    rows_.push_back(std::move(row));
  }
  [[noreturn]] static void Fail(const absl::Status& status, const char* what) {
    std::fprintf(stderr, "kernels bench: %s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }

  Timer timer_;
  const char* timing_name_;
  double copy_gbps_ = 0;
  std::vector<Row> rows_;
};

void KernelsBench::RunShape(const Shape& s) {
  const int64_t T = s.tokens, H = s.hidden, F = s.ffn, E = s.experts, K = s.top_k;
  const int64_t M = T * K;  // routed rows
  const std::string params = absl::StrFormat("T=%d H=%d F=%d E=%d k=%d", T, H, F, E, K);

  DeviceBuffer logits(4 * T * E), weights(4 * M), prob_sums(4 * E), aux(4), d_logits(4 * T * E),
      d_weights(4 * M);
  DeviceBuffer ids(4 * M), counts(4 * E), offsets(4 * (E + 1)), slot_of(4 * M), choice_of(4 * M);
  DeviceBuffer plan_ws(k::DispatchPlanWorkspaceBytes({T, static_cast<int>(E), static_cast<int>(K)}));
  DeviceBuffer x(2 * T * H), y(2 * T * H), router_w(2 * E * H), d_router_w(4 * E * H);
  DeviceBuffer rows(2 * M * H), d_rows(2 * M * H);
  DeviceBuffer q(M * H), q_scales(M * H / 32);
  const int64_t padded = k::ColwisePaddedRows(M, static_cast<int>(E));
  DeviceBuffer cq(H * padded), cq_scales(H * padded / 32), padded_offsets(4 * (E + 1));
  DeviceBuffer h(2 * M * 2 * F), act(2 * M * F), d_act(2 * M * F), d_h(2 * M * 2 * F);
  DeviceBuffer act_q(M * F), act_q_scales(M * F / 32);

  RandomFloat(logits.as<float>(), T * E, 3.0f);
  RandomFloat(d_weights.as<float>(), M);
  RandomBf16(x.ptr, T * H);
  RandomBf16(router_w.ptr, E * H, 0.02f);
  RandomBf16(rows.ptr, M * H);
  RandomBf16(d_rows.ptr, M * H);
  RandomBf16(h.ptr, M * 2 * F, 2.0f);
  RandomBf16(d_act.ptr, M * F);
  KB_CUDA(cudaDeviceSynchronize());

  const k::RoutingShape rs{T, static_cast<int>(E), static_cast<int>(K), k::ScoreFunction::kSoftmax, true};
  const k::RoutingOutputs ro{ids.as<int32_t>(), weights.as<float>(), counts.as<int32_t>(),
                             prob_sums.as<float>()};
  const k::DispatchPlan plan{offsets.as<int32_t>(), slot_of.as<int32_t>(), choice_of.as<int32_t>()};
  const k::PermuteShape ps{T, H, static_cast<int>(K)};
  const auto* xb = x.as<k::Bf16>();

  // Routing and plan first: the later kernels use the real slot map and group offsets.
  Time(s, "route_topk_softmax", "fp32", 4.0 * T * E + 8.0 * M, params + "; logits fit in L2",
       [&] { return k::cuda::RouteTopK(rs, logits.as<float>(), ro, nullptr); });
  k::RoutingShape sig = rs;
  sig.score = k::ScoreFunction::kSigmoid;
  Time(s, "route_topk_sigmoid", "fp32", 4.0 * T * E + 8.0 * M, params + "; logits fit in L2",
       [&] { return k::cuda::RouteTopK(sig, logits.as<float>(), ro, nullptr); });
  Time(s, "route_topk_backward", "fp32", 8.0 * T * E + 8.0 * M, params,
       [&] {
         return k::cuda::RouteTopKBackward(rs, logits.as<float>(), ids.as<int32_t>(),
                                           counts.as<int32_t>(), d_weights.as<float>(), 0.01f,
                                           d_logits.as<float>(), nullptr);
       });
  Time(s, "dispatch_plan", "int32", 4.0 * M + 8.0 * M + 4.0 * (E + 1), params + "; 3 launches",
       [&] {
         return k::cuda::BuildDispatchPlan({T, static_cast<int>(E), static_cast<int>(K)},
                                           ids.as<int32_t>(), plan, plan_ws.ptr, nullptr);
       });
  KB_CUDA(cudaDeviceSynchronize());
  {
    absl::StatusOr<std::unique_ptr<k::cuda::RouterGemm>> gemm =
        k::cuda::RouterGemm::Create({T, H, static_cast<int>(E)});
    if (!gemm.ok()) Fail(gemm.status(), "RouterGemm::Create");
    TimeFlops(s, "router_logits_gemm", 2.0 * T * H * E, params + "; cuBLASLt, fp32 out", [&] {
      return (*gemm)->Logits(T, xb, router_w.as<k::Bf16>(), logits.as<float>(), nullptr);
    });
    TimeFlops(s, "router_logits_gemm_bwd", 4.0 * T * H * E, params + "; d_x and d_w", [&] {
      return (*gemm)->LogitsBackward(T, xb, router_w.as<k::Bf16>(), d_logits.as<float>(),
                                     y.as<k::Bf16>(), false, d_router_w.as<float>(), nullptr);
    });
  }

  const double token_bytes = 2.0 * T * H, row_bytes = 2.0 * M * H, mx_bytes = M * H * (1 + 1 / 32.0);
  Time(s, "permute", "bf16", token_bytes + row_bytes + 4.0 * M, params,
       [&] { return k::cuda::Permute(ps, xb, slot_of.as<int32_t>(), rows.as<k::Bf16>(), nullptr); });
  Rotation perm_scales(M * H / 32);
  Time(s, "permute_mxfp8", "mxfp8", token_bytes + mx_bytes + 4.0 * M,
       params + "; row-wise; scales rotated", [&] {
         return k::cuda::PermuteMxfp8(ps, xb, slot_of.as<int32_t>(),
                                      {q.as<uint8_t>(), perm_scales.Next<uint8_t>()}, nullptr);
       });
  Time(s, "unpermute_combine", "bf16", row_bytes + token_bytes + 8.0 * M, params, [&] {
    return k::cuda::UnpermuteCombine(ps, rows.as<k::Bf16>(), slot_of.as<int32_t>(),
                                     weights.as<float>(), y.as<k::Bf16>(), nullptr);
  });
  Time(s, "permute_backward", "bf16", row_bytes + token_bytes + 4.0 * M, params, [&] {
    return k::cuda::PermuteBackward(ps, d_rows.as<k::Bf16>(), slot_of.as<int32_t>(), y.as<k::Bf16>(),
                                    nullptr);
  });
  Time(s, "unpermute_combine_backward", "bf16", token_bytes + 2 * row_bytes + 12.0 * M, params,
       [&] {
         return k::cuda::UnpermuteCombineBackward(ps, y.as<k::Bf16>(), rows.as<k::Bf16>(),
                                                  slot_of.as<int32_t>(), weights.as<float>(),
                                                  d_rows.as<k::Bf16>(), d_weights.as<float>(), nullptr);
       });

  // Scale arrays (written, or read by the dequantize) rotate through copies: see Rotation.
  const k::SwigluShape ss{M, F};
  Rotation act_scales(M * F / 32);
  auto act_mx = [&] { return k::MxRowwise{act_q.as<uint8_t>(), act_scales.Next<uint8_t>()}; };
  const double h_bytes = 2.0 * M * 2 * F, act_bytes = 2.0 * M * F, act_mx_bytes = M * F * (1 + 1 / 32.0);
  const std::string swiglu_note = absl::StrFormat("M=T*k=%d F=%d", M, F);
  Time(s, "swiglu_forward", "bf16", h_bytes + act_bytes, swiglu_note, [&] {
    return k::cuda::SwigluForward(ss, nullptr, h.as<k::Bf16>(), act.as<k::Bf16>(), nullptr, nullptr);
  });
  Time(s, "swiglu_forward_mxfp8", "mxfp8", h_bytes + act_mx_bytes,
       swiglu_note + "; MXFP8 only; scales rotated", [&] {
         const k::MxRowwise out = act_mx();
         return k::cuda::SwigluForward(ss, nullptr, h.as<k::Bf16>(), nullptr, &out, nullptr);
       });
  Time(s, "swiglu_forward_bf16_mxfp8", "mxfp8", h_bytes + act_bytes + act_mx_bytes,
       swiglu_note + "; bf16 and MXFP8; scales rotated", [&] {
         const k::MxRowwise out = act_mx();
         return k::cuda::SwigluForward(ss, nullptr, h.as<k::Bf16>(), act.as<k::Bf16>(), &out, nullptr);
       });
  {
    Rotation fb_scales(M * F / 32);  // fp32, one per 128 elements
    Time(s, "swiglu_forward_bf16_fp8_block", "fp8-block",
         h_bytes + act_bytes + M * F * (1 + 4 / 128.0), swiglu_note + "; bf16 and fp8-block 1x128",
         [&] {
           return k::cuda::SwigluForwardFp8Block(
               ss, nullptr, h.as<k::Bf16>(), act.as<k::Bf16>(),
               {act_q.as<uint8_t>(), fb_scales.Next<float>()}, k::Fp8ScaleMode::kFloat32, nullptr);
         });
  }
  Time(s, "swiglu_backward", "bf16", h_bytes + act_bytes + h_bytes, swiglu_note, [&] {
    return k::cuda::SwigluBackward(ss, nullptr, h.as<k::Bf16>(), d_act.as<k::Bf16>(), d_h.as<k::Bf16>(),
                                   nullptr);
  });

  // MXFP8 of the permuted activations [M, H], grouped by the plan's expert offsets.
  const k::MxQuantizeShape qs{M, H, static_cast<int>(E)};
  Rotation row_scales(M * H / 32), col_scales(H * padded / 32);
  auto rw = [&] { return k::MxRowwise{q.as<uint8_t>(), row_scales.Next<uint8_t>()}; };
  auto cw = [&] {
    return k::MxColwise{cq.as<uint8_t>(), col_scales.Next<uint8_t>(), padded_offsets.as<int32_t>(),
                        padded};
  };
  const std::string q_note = absl::StrFormat("[%d x %d], %d groups", M, H, E);
  Time(s, "mxfp8_quantize_rowwise", "mxfp8", row_bytes + mx_bytes, q_note + "; scales rotated", [&] {
    const k::MxRowwise r = rw();
    return k::cuda::QuantizeMxfp8(qs, rows.as<k::Bf16>(), offsets.as<int32_t>(), &r, nullptr, nullptr);
  });
  Time(s, "mxfp8_quantize_colwise", "mxfp8", row_bytes + mx_bytes,
       q_note + "; padded to 32 per group; scales rotated", [&] {
         const k::MxColwise c = cw();
         return k::cuda::QuantizeMxfp8(qs, rows.as<k::Bf16>(), offsets.as<int32_t>(), nullptr, &c, nullptr);
       });
  Time(s, "mxfp8_quantize_row_and_colwise", "mxfp8", row_bytes + 2 * mx_bytes,
       q_note + "; one read, both layouts; scales rotated", [&] {
         const k::MxRowwise r = rw();
         const k::MxColwise c = cw();
         return k::cuda::QuantizeMxfp8(qs, rows.as<k::Bf16>(), offsets.as<int32_t>(), &r, &c, nullptr);
       });
  // The dequantize reads real MXFP8 (the row-wise quantization of `rows`), its scales rotated.
  {
    const k::MxRowwise r{q.as<uint8_t>(), q_scales.as<uint8_t>()};
    absl::Status st = k::cuda::QuantizeMxfp8(qs, rows.as<k::Bf16>(), offsets.as<int32_t>(), &r, nullptr, nullptr);
    if (!st.ok()) Fail(st, "QuantizeMxfp8 (dequantize input)");
    KB_CUDA(cudaDeviceSynchronize());
  }
  Rotation deq_scales(M * H / 32, q_scales.ptr);
  Time(s, "mxfp8_dequantize_rowwise", "mxfp8", mx_bytes + row_bytes, q_note + "; to bf16; scales rotated",
       [&] {
         return k::cuda::DequantizeMxfp8Rowwise(M, H, nullptr, q.as<uint8_t>(), deq_scales.Next<uint8_t>(),
                                                d_rows.as<k::Bf16>(), nullptr);
       });
  KB_CUDA(cudaDeviceSynchronize());
  RunFp8Block(s, x, rows, offsets, slot_of);
}

void KernelsBench::RunFp8Block(const Shape& s, const DeviceBuffer& x, const DeviceBuffer& rows,
                               const DeviceBuffer& offsets, const DeviceBuffer& slot_of) {
  const int64_t T = s.tokens, H = s.hidden, F = s.ffn, E = s.experts, K = s.top_k, M = T * K;
  const k::PermuteShape ps{T, H, static_cast<int>(K)};
  const k::Fp8BlockQuantizeShape qs{M, H, static_cast<int>(E)};
  const int64_t padded = k::Fp8ColwisePaddedRows(M, static_cast<int>(E));
  DeviceBuffer q(M * H), cq(H * padded), padded_offsets(4 * (E + 1)), deq(2 * M * H);
  // fp32 scales: one per 128 elements (4 bytes each), rotated through copies like the MXFP8 rows.
  Rotation row_scales(M * H / 32), col_scales(H * padded / 32);
  auto rw = [&] { return k::Fp8BlockRowwise{q.as<uint8_t>(), row_scales.Next<float>()}; };
  auto cw = [&] {
    return k::Fp8BlockColwise{cq.as<uint8_t>(), col_scales.Next<float>(),
                              padded_offsets.as<int32_t>(), padded};
  };
  const double token_bytes = 2.0 * T * H, row_bytes = 2.0 * M * H, fb_bytes = M * H * (1 + 4 / 128.0);
  const std::string note = absl::StrFormat("[%d x %d], %d groups", M, H, E);
  Time(s, "permute_fp8_block", "fp8-block", token_bytes + fb_bytes + 4.0 * M,
       absl::StrFormat("T=%d H=%d k=%d; row-wise 1x128, fp32 scales rotated", T, H, K), [&] {
         return k::cuda::PermuteFp8Block(ps, x.as<k::Bf16>(), slot_of.as<int32_t>(), rw(),
                                         k::Fp8ScaleMode::kFloat32, nullptr);
       });
  Time(s, "fp8_block_quantize_rowwise", "fp8-block", row_bytes + fb_bytes, note + "; scales rotated",
       [&] {
         const k::Fp8BlockRowwise r = rw();
         return k::cuda::QuantizeFp8Block(qs, rows.as<k::Bf16>(), offsets.as<int32_t>(), &r, nullptr,
                                          nullptr);
       });
  Time(s, "fp8_block_quantize_colwise", "fp8-block", row_bytes + fb_bytes,
       note + "; padded to 128 per group, transposed; scales rotated", [&] {
         const k::Fp8BlockColwise c = cw();
         return k::cuda::QuantizeFp8Block(qs, rows.as<k::Bf16>(), offsets.as<int32_t>(), nullptr, &c,
                                          nullptr);
       });
  Time(s, "fp8_block_quantize_row_and_colwise", "fp8-block", row_bytes + 2 * fb_bytes,
       note + "; one call, both layouts; scales rotated", [&] {
         const k::Fp8BlockRowwise r = rw();
         const k::Fp8BlockColwise c = cw();
         return k::cuda::QuantizeFp8Block(qs, rows.as<k::Bf16>(), offsets.as<int32_t>(), &r, &c,
                                          nullptr);
       });
  {
    const k::Fp8BlockRowwise r = rw();
    absl::Status st = k::cuda::QuantizeFp8Block(qs, rows.as<k::Bf16>(), offsets.as<int32_t>(), &r,
                                                nullptr, nullptr);
    if (!st.ok()) Fail(st, "QuantizeFp8Block (dequantize input)");
    KB_CUDA(cudaDeviceSynchronize());
  }
  Time(s, "fp8_block_dequantize_rowwise", "fp8-block", fb_bytes + row_bytes, note + "; to bf16", [&] {
    return k::cuda::DequantizeFp8BlockRowwise(M, H, nullptr, q.as<uint8_t>(), row_scales.Next<float>(),
                                              deq.as<k::Bf16>(), nullptr);
  });
  // One GPU's share of w1 at EP=8 for dsv3 (32 experts; qwen3's 128 as they are): W [E][H][2F]
  // bf16 into both orientations with their 128x128 block scales.
  const int64_t We = std::min<int64_t>(E, 32), wn = We * H * 2 * F;
  DeviceBuffer w(2 * wn), wq(wn), wq_t(wn), ws(wn / (128 * 128) * 4), ws_t(wn / (128 * 128) * 4);
  RandomBf16(w.ptr, wn, 0.02f);
  KB_CUDA(cudaDeviceSynchronize());
  Time(s, "fp8_block_quantize_weights", "fp8-block", 2.0 * wn + 2.0 * wn * (1 + 4 / 16384.0),
       absl::StrFormat("W [%d][%d][%d], both orientations, 128x128 blocks", We, H, 2 * F), [&] {
         return k::cuda::QuantizeFp8BlockWeights(
             {static_cast<int>(We), H, 2 * F}, w.as<k::Bf16>(),
             {wq.as<uint8_t>(), ws.as<float>(), wq_t.as<uint8_t>(), ws_t.as<float>()}, nullptr);
       });
  KB_CUDA(cudaDeviceSynchronize());
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string KernelsBench::Json(const std::string& command, const std::string& commit) const {
  cudaDeviceProp prop{};
  int device = 0;
  cudaGetDevice(&device);
  cudaGetDeviceProperties(&prop, device);
  char date[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  std::vector<std::string> rows;
  for (const Row& r : rows_) {
    rows.push_back(absl::StrFormat(
        "    {\"name\": \"%s\", \"shape\": \"%s\", \"impl\": \"%s\", \"precision\": \"%s\", "
        "\"ms\": %.5f, \"tflops\": %s, \"gbps\": %s, \"note\": \"%s\"}",
        r.name, r.shape, r.impl, r.precision, r.ms,
        r.has_tflops ? absl::StrFormat("%.2f", r.tflops) : "null",
        r.has_gbps ? absl::StrFormat("%.1f", r.gbps) : "null", JsonEscape(r.note)));
  }
  return absl::StrCat("{\n  \"bench\": \"kernels\",\n  \"device\": \"", JsonEscape(prop.name),
                      " (1 GPU)\",\n  \"date\": \"", date, "\",\n  \"command\": \"",
                      JsonEscape(command), "\",\n  \"commit\": \"", JsonEscape(commit),
                      "\",\n  \"ceilings\": {\"copy_gbps\": ", absl::StrFormat("%.1f", copy_gbps_),
                      "},\n  \"rows\": [\n", absl::StrJoin(rows, ",\n"), "\n  ]\n}\n");
}

int KernelsMain(const std::vector<std::string>& args) {
  std::string json_path, commit = "unknown", shapes = "dsv3,qwen3";
  int reps = 20;
  Timing timing = Timing::kQueued;
  for (size_t i = 0; i < args.size(); ++i) {
    const bool has_value = i + 1 < args.size();
    if (args[i] == "--json" && has_value) {
      json_path = args[++i];
    } else if (args[i] == "--commit" && has_value) {
      commit = args[++i];
    } else if (args[i] == "--shapes" && has_value) {
      shapes = args[++i];
    } else if (args[i] == "--timing" && has_value) {
      const std::string& t = args[++i];
      if (t != "queued" && t != "synced") {
        std::fprintf(stderr, "kernels bench: --timing must be queued or synced, got %s\n", t.c_str());
        return 2;
      }
      timing = t == "queued" ? Timing::kQueued : Timing::kSynced;
    } else if (args[i] == "--reps" && has_value) {
      reps = std::max(3, std::atoi(args[++i].c_str()));
    } else {
      std::fprintf(stderr, "kernels bench: unknown flag %s\n", args[i].c_str());
      return 2;
    }
  }
  KernelsBench bench(reps, timing);
  bench.MeasureCopy();
  for (absl::string_view name : absl::StrSplit(shapes, ',')) {
    const Shape* shape = nullptr;
    for (const Shape& s : kShapes) {
      if (name == s.name) shape = &s;
    }
    if (shape == nullptr) {
      std::fprintf(stderr, "kernels bench: unknown shape %s (dsv3, qwen3)\n", std::string(name).c_str());
      return 2;
    }
    bench.RunShape(*shape);
  }
  bench.MeasureCopy();  // again at the end: the ceiling brackets the run
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "kernels bench: cannot write %s\n", json_path.c_str());
      return 1;
    }
    const std::string json = bench.Json(absl::StrCat("dropless-bench kernels ", absl::StrJoin(args, " ")), commit);
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }
  return 0;
}

}  // namespace

DROPLESS_REGISTER_BENCH(kernels, "kernels",
                        "memory-bound MoE kernels (routing, permute, SwiGLU, MXFP8) vs d2d copy",
                        KernelsMain);

}  // namespace dropless::bench
