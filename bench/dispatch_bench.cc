// dropless-bench dispatch: the EP dispatcher's dispatch (plan + rows to their experts' ranks) and
// combine (rows back) at 128, 4096 and 8192 tokens per rank (H=7168, k=8, E=256, uniform top-k
// routing drawn on the host), bf16 rows and mxfp8 rows (H bytes of e4m3 plus H/32 scale bytes,
// 0.52x the bf16 bytes), for each backend available on this machine and each EP size. On one GPU
// that is the `local` backend (every rank in this process); the ceiling is a device-to-device
// copy of the same bytes in the same run (`copy_gbps`). Bytes moved count each row once.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_registry.h"
#include "bench/gemm_bench_common.h"
#include "worker/engine/cuda/device_memory.h"
#include "worker/engine/cuda/ep/expert_dispatcher.h"
#include "worker/engine/cuda/ep/nccl_group.h"
#include "worker/transport/transport_factory.h"

namespace dropless::bench {
namespace {

using cuda_engine::EpShape;
using cuda_engine::ExchangePlan;
using cuda_engine::RankCall;

constexpr int64_t kHidden = 7168;
constexpr int kExperts = 256, kTopK = 8;

struct Flags {
  std::vector<std::string> backends = {"local", "nccl-lsa"};
  std::vector<int> eps = {2, 4, 8};
  std::vector<int64_t> tokens = {128, 4096, 8192};
  std::vector<std::string> precisions = {"bf16", "mxfp8"};
  int iters = 20;
  std::string json, commit;
};

Flags ParseFlags(const std::vector<std::string>& args) {
  Flags f;
  for (const std::string& a : args) {
    std::pair<std::string, std::string> kv = absl::StrSplit(a, absl::MaxSplits('=', 1));
    if (kv.first == "--backends") {
      f.backends = absl::StrSplit(kv.second, ',');
    } else if (kv.first == "--ep") {
      f.eps.clear();
      for (absl::string_view v : absl::StrSplit(kv.second, ','))
        f.eps.push_back(std::atoi(std::string(v).c_str()));
    } else if (kv.first == "--tokens") {
      f.tokens.clear();
      for (absl::string_view v : absl::StrSplit(kv.second, ','))
        f.tokens.push_back(std::atoll(std::string(v).c_str()));
    } else if (kv.first == "--precision") {
      f.precisions = absl::StrSplit(kv.second, ',');
    } else if (kv.first == "--iters") {
      f.iters = std::max(3, std::atoi(kv.second.c_str()));
    } else if (kv.first == "--json") {
      f.json = kv.second;
    } else if (kv.first == "--commit") {
      f.commit = kv.second;
    } else {
      std::fprintf(stderr,
                   "dispatch bench: unknown flag %s\nflags: --backends=local,nccl-lsa,nccl-a2a --ep=2,4,8 "
                   "--tokens=128,4096,8192 "
                   "--precision=bf16,mxfp8 --iters=N --json=PATH --commit=SHA\n",
                   a.c_str());
      std::exit(2);
    }
  }
  return f;
}

// Median ms of `call` between events on `stream` (the collective's joining stream).
template <typename Call>
double MedianOnStream(cudaStream_t stream, int iters, Call call) {
  for (int i = 0; i < 3; ++i) call();
  CheckCuda(cudaDeviceSynchronize(), "dispatch", "warm-up");
  std::vector<cudaEvent_t> ev(iters + 1);
  for (cudaEvent_t& e : ev) CheckCuda(cudaEventCreate(&e), "dispatch", "cudaEventCreate");
  CheckCuda(cudaEventRecord(ev[0], stream), "dispatch", "cudaEventRecord");
  for (int i = 0; i < iters; ++i) {
    call();
    CheckCuda(cudaEventRecord(ev[i + 1], stream), "dispatch", "cudaEventRecord");
  }
  CheckCuda(cudaDeviceSynchronize(), "dispatch", "timed calls");
  std::vector<double> ms(iters);
  for (int i = 0; i < iters; ++i) {
    float t = 0;
    CheckCuda(cudaEventElapsedTime(&t, ev[i], ev[i + 1]), "dispatch", "cudaEventElapsedTime");
    ms[i] = t;
  }
  for (cudaEvent_t e : ev) cudaEventDestroy(e);
  std::nth_element(ms.begin(), ms.begin() + iters / 2, ms.end());
  return ms[iters / 2];
}

// One EP group's buffers for one token count: every rank's rows (data, and scales for mxfp8).
struct Group {
  std::unique_ptr<KeyValueStore> store = NewMemoryKvStore();
  cuda_engine::DeviceArena arena;
  cuda_engine::StreamLinks links;
  std::unique_ptr<cuda_engine::ExpertDispatcher> dispatcher;
  std::vector<cudaStream_t> streams;
  std::vector<ExchangePlan> plans;
  std::vector<RankCall> data, scales;
  int64_t rows_moved = 0;
  ~Group() {
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
  }
};

std::unique_ptr<Group> MakeGroup(const std::string& backend, int ep, int64_t tokens, bool mxfp8,
                                 std::mt19937* rng) {
  auto g = std::make_unique<Group>();
  const EpShape shape{ep, kExperts, tokens * kTopK};
  absl::StatusOr<std::unique_ptr<cuda_engine::ExpertDispatcher>> d;
  if (backend == "local") {
    d = cuda_engine::NewLocalDispatcher(shape, &g->links, &g->arena);
  } else {
    auto group = cuda_engine::JoinNcclGroup(g->store.get(), "bench", 0, 1, absl::Seconds(60));
    CheckStatus(group.status(), "dispatch", "joining a one-rank NCCL group");
    d = backend == "nccl-a2a"
            ? cuda_engine::NewNcclA2aDispatcher(shape, kHidden * 2, *std::move(group), &g->arena)
            : cuda_engine::NewNcclLsaDispatcher(shape, *std::move(group), &g->arena);
  }
  CheckStatus(d.status(), "dispatch", "creating the dispatcher");
  g->dispatcher = *std::move(d);
  const int local = kExperts / ep;
  std::vector<std::vector<int32_t>> counts(ep, std::vector<int32_t>(kExperts, 0));
  std::vector<int> experts(kExperts);
  for (int s = 0; s < ep; ++s) {
    for (int64_t t = 0; t < tokens; ++t) {
      for (int e = 0; e < kExperts; ++e) experts[e] = e;
      for (int j = 0; j < kTopK; ++j) {  // k distinct experts, uniformly
        std::uniform_int_distribution<int> pick(j, kExperts - 1);
        std::swap(experts[j], experts[pick(*rng)]);
        ++counts[s][experts[j]];
      }
    }
  }
  g->streams.resize(ep);
  g->plans.resize(ep);
  const int64_t data_bytes = mxfp8 ? kHidden : kHidden * 2, scale_bytes = kHidden / 32;
  for (int p = 0; p < ep; ++p) {
    CheckCuda(cudaStreamCreateWithFlags(&g->streams[p], cudaStreamNonBlocking), "dispatch",
              "stream");
    std::vector<int32_t> offsets(kExperts + 1, 0);
    for (int e = 0; e < kExperts; ++e) offsets[e + 1] = offsets[e] + counts[p][e];
    int64_t received = 0;
    for (int s = 0; s < ep; ++s) {
      for (int l = 0; l < local; ++l) received += counts[s][p * local + l];
    }
    g->rows_moved += offsets[kExperts];
    int32_t* dev_offsets = nullptr;
    uint8_t *send = nullptr, *recv = nullptr, *send_scales = nullptr, *recv_scales = nullptr;
    CheckStatus(g->arena.Allocate(kExperts + 1, "offsets", &dev_offsets), "dispatch", "alloc");
    CheckCuda(cudaMemcpy(dev_offsets, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice),
              "dispatch", "offsets");
    CheckStatus(g->arena.Allocate(tokens * kTopK * data_bytes, "send rows", &send), "dispatch",
                "alloc");
    CheckStatus(g->dispatcher->AllocateShared(std::max<int64_t>(1, received) * data_bytes,
                                              "recv rows", &recv),
                "dispatch", "alloc");
    CheckCuda(cudaMemset(send, 1, tokens * kTopK * data_bytes), "dispatch", "memset");
    CheckStatus(cuda_engine::AllocateExchangePlan(g->dispatcher.get(), &g->arena, &g->plans[p]),
                "dispatch", "plan");
    g->plans[p].send_offsets = dev_offsets;
    g->data.push_back(RankCall{&g->plans[p], send, recv, g->streams[p]});
    if (mxfp8) {
      CheckStatus(g->arena.Allocate(tokens * kTopK * scale_bytes, "send scales", &send_scales),
                  "dispatch", "alloc");
      CheckStatus(g->dispatcher->AllocateShared(std::max<int64_t>(1, received) * scale_bytes,
                                                "recv scales", &recv_scales),
                  "dispatch", "alloc");
      g->scales.push_back(RankCall{&g->plans[p], send_scales, recv_scales, g->streams[p]});
    }
  }
  return g;
}

int RunDispatchBench(const std::vector<std::string>& args) {
  const Flags f = ParseFlags(args);
  RequireCudaDevice("dispatch");
  cudaDeviceProp prop{};
  CheckCuda(cudaGetDeviceProperties(&prop, 0), "dispatch", "cudaGetDeviceProperties");
  std::mt19937 rng(20261202);
  std::printf("dispatch bench on %s: H=%ld k=%d E=%d, uniform top-k, one GPU\n", prop.name,
              static_cast<long>(kHidden), kTopK, kExperts);
  std::printf("%-8s %-6s %3s %6s %10s | %10s %9s | %10s %9s | %9s %6s\n", "backend", "prec", "ep",
              "tokens", "MB moved", "dispatch us", "GB/s", "combine us", "GB/s", "copy GB/s",
              "ratio");
  std::vector<std::string> rows;
  double copy_ceiling = 0;
  for (const std::string& precision : f.precisions) {
    const bool mxfp8 = precision == "mxfp8";
    if (!mxfp8 && precision != "bf16") {
      std::fprintf(stderr, "dispatch bench: unknown precision %s\n", precision.c_str());
      return 2;
    }
    const size_t data_bytes = mxfp8 ? kHidden : kHidden * 2, scale_bytes = kHidden / 32;
    for (const std::string& backend : f.backends) {
      if (backend != "local" && backend != "nccl-lsa" && backend != "nccl-a2a") {
        std::fprintf(stderr, "dispatch bench: unknown backend %s\n", backend.c_str());
        return 2;
      }
      // The NCCL backends drive one rank per process: world size 1 on this one GPU.
      const std::vector<int> eps = backend == "local" ? f.eps : std::vector<int>{1};
      for (int ep : eps) {
        for (int64_t tokens : f.tokens) {
          std::unique_ptr<Group> g = MakeGroup(backend, ep, tokens, mxfp8, &rng);
          const double bytes =
              static_cast<double>(g->rows_moved) * (data_bytes + (mxfp8 ? scale_bytes : 0));
          cudaStream_t s0 = g->streams[0];
          auto dispatch = [&] {
            CheckStatus(g->dispatcher->Plan(g->data), "dispatch", "plan");
            CheckStatus(g->dispatcher->Dispatch(g->data, data_bytes), "dispatch", "dispatch");
            if (mxfp8)
              CheckStatus(g->dispatcher->Dispatch(g->scales, scale_bytes), "dispatch", "scales");
          };
          auto combine = [&] {
            // Combine moves bf16 expert outputs back (the expert GEMM's output precision).
            CheckStatus(g->dispatcher->Combine(g->data, data_bytes), "dispatch", "combine");
          };
          const double dispatch_ms = MedianOnStream(s0, f.iters, dispatch);
          const double combine_ms = MedianOnStream(s0, f.iters, combine);
          // The ceiling: one device copy of the same bytes (dispatch's), in the same run.
          uint8_t *a = nullptr, *b = nullptr;
          CheckStatus(g->arena.Allocate(static_cast<int64_t>(bytes), "copy source", &a), "dispatch",
                      "alloc");
          CheckStatus(g->arena.Allocate(static_cast<int64_t>(bytes), "copy target", &b), "dispatch",
                      "alloc");
          const double copy_ms = MedianOnStream(s0, f.iters, [&] {
            CheckCuda(
                cudaMemcpyAsync(b, a, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, s0),
                "dispatch", "copy");
          });
          const double combine_bytes = static_cast<double>(g->rows_moved) * data_bytes;
          const double dgbps = bytes / (dispatch_ms * 1e-3) / 1e9;
          const double cgbps = combine_bytes / (combine_ms * 1e-3) / 1e9;
          const double copy_gbps = bytes / (copy_ms * 1e-3) / 1e9;
          copy_ceiling = std::max(copy_ceiling, copy_gbps);
          std::printf("%-8s %-6s %3d %6ld %10.1f | %10.1f %9.1f | %10.1f %9.1f | %9.1f %5.0f%%\n",
                      backend.c_str(), precision.c_str(), ep, static_cast<long>(tokens),
                      bytes / 1e6, dispatch_ms * 1e3, dgbps, combine_ms * 1e3, cgbps, copy_gbps,
                      100 * dgbps / copy_gbps);
          const char* fmt =
              "    {\"name\": \"%s\", \"shape\": \"dsv3\", \"impl\": \"%s\", \"precision\": "
              "\"%s\", "
              "\"backend\": \"%s\", \"ep\": %d, \"tokens\": %d, \"bytes\": %.0f, \"ms\": %.5f, "
              "\"us\": %.2f, \"tflops\": null, \"gbps\": %.1f, \"send_gbps\": null, \"note\": "
              "\"%s\"}";
          rows.push_back(absl::StrFormat(fmt, "dispatch", "dropless", precision, backend, ep,
                                         tokens, bytes, dispatch_ms, dispatch_ms * 1e3, dgbps,
                                         "plan + rows (+ scales for mxfp8), one GPU"));
          rows.push_back(absl::StrFormat(fmt, "combine", "dropless", "bf16", backend, ep, tokens,
                                         combine_bytes, combine_ms, combine_ms * 1e3, cgbps,
                                         "bf16 expert outputs back, one GPU"));
          rows.push_back(absl::StrFormat(fmt, "dispatch", "d2d-copy", precision, "cudaMemcpyAsync",
                                         ep, tokens, bytes, copy_ms, copy_ms * 1e3, copy_gbps,
                                         "the dispatch's bytes as one device copy"));
        }
      }
    }
  }
  if (!f.json.empty()) {
    WriteBenchJson(f.json, "dispatch", std::string(prop.name) + " (1 GPU)", args, f.commit,
                   absl::StrFormat("\"copy_gbps\": %.0f", copy_ceiling), rows, {});
  }
  return 0;
}

}  // namespace

DROPLESS_REGISTER_BENCH(dispatch, "dispatch", "EP dispatch and combine per backend and EP size",
                        RunDispatchBench);

}  // namespace dropless::bench
