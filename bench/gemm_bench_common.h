// What the grouped-GEMM benchmarks share (`dropless-bench gemm` and `mxgemm`): the MoE expert
// shapes, the group sizes both use (so their rows and the torch peers' line up), fatal checks, the
// event-timed median and the BENCH.md JSON file.
#ifndef DROPLESS_BENCH_GEMM_BENCH_COMMON_H_
#define DROPLESS_BENCH_GEMM_BENCH_COMMON_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace dropless::bench {

struct MoeShape {
  const char* name;
  int64_t tokens, hidden, ffn, experts, top_k;
};
inline constexpr MoeShape kMoeShapes[] = {
    {"dsv3", 8192, 7168, 2048, 256, 8},
    {"qwen3", 16384, 2048, 768, 128, 8},
    {"mixtral", 8192, 4096, 14336, 8, 2},
};

// Exits with "<bench> bench: <what>: <error>" (a benchmark has nothing to recover).
inline void CheckCuda(cudaError_t error, const char* bench, const char* what) {
  if (error != cudaSuccess) {
    std::fprintf(stderr, "%s bench: %s: %s\n", bench, what, cudaGetErrorString(error));
    std::exit(1);
  }
}
inline void CheckStatus(const absl::Status& status, const char* bench, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s bench: %s: %s\n", bench, what, status.ToString().c_str());
    std::exit(1);
  }
}

// uniform: rows / E each (remainder to the first experts). zipf: expert e gets a share
// proportional to 1 / (e + 1), floored, remainder one row each to the first experts.
inline std::vector<int> GroupSizes(int64_t rows, int experts, const std::string& dist) {
  std::vector<int> sizes(experts, 0);
  int64_t assigned = 0;
  if (dist == "uniform") {
    for (int e = 0; e < experts; ++e) sizes[e] = static_cast<int>(rows / experts);
  } else {
    double harmonic = 0.0;
    for (int e = 0; e < experts; ++e) harmonic += 1.0 / (e + 1);
    for (int e = 0; e < experts; ++e) {
      sizes[e] = static_cast<int>(static_cast<double>(rows) / (e + 1) / harmonic);
    }
  }
  for (int s : sizes) assigned += s;
  for (int e = 0; assigned < rows; e = (e + 1) % experts, ++assigned) ++sizes[e];
  return sizes;
}

// Idle milliseconds before each measurement (--cooldown-ms, default 0). An H200 running GEMMs back
// to back lowers its clock within seconds (docs/grouped_gemm.md, "Measuring"), so in a long run a
// row reads lower the later it comes; a cool-down before every row (the torch peers take the same
// flag) measures each one from the same idle state.
inline int& CooldownMs() {
  static int ms = 0;
  return ms;
}

// Median milliseconds per call over `iters` event-timed calls after `warmup` untimed ones (and
// CooldownMs() of idle time before those).
inline double MedianMs(const std::function<void()>& call, int warmup, int iters,
                       const char* bench) {
  if (CooldownMs() > 0) {
    CheckCuda(cudaDeviceSynchronize(), bench, "before the cool-down");
    std::this_thread::sleep_for(std::chrono::milliseconds(CooldownMs()));
  }
  for (int i = 0; i < warmup; ++i) call();
  CheckCuda(cudaDeviceSynchronize(), bench, "warm-up");
  std::vector<cudaEvent_t> events(iters + 1);
  for (auto& e : events) CheckCuda(cudaEventCreate(&e), bench, "cudaEventCreate");
  CheckCuda(cudaEventRecord(events[0]), bench, "cudaEventRecord");
  for (int i = 0; i < iters; ++i) {
    call();
    CheckCuda(cudaEventRecord(events[i + 1]), bench, "cudaEventRecord");
  }
  CheckCuda(cudaEventSynchronize(events[iters]), bench, "cudaEventSynchronize");
  CheckCuda(cudaGetLastError(), bench, "timed calls");
  std::vector<double> ms(iters);
  for (int i = 0; i < iters; ++i) {
    float t = 0;
    CheckCuda(cudaEventElapsedTime(&t, events[i], events[i + 1]), bench, "cudaEventElapsedTime");
    ms[i] = t;
  }
  for (auto& e : events) cudaEventDestroy(e);
  std::nth_element(ms.begin(), ms.begin() + iters / 2, ms.end());
  return ms[iters / 2];
}

// Exits (status 2) naming the first --ops entry that is not fwd, dgrad or wgrad.
inline void CheckOps(const std::vector<std::string>& ops, const char* bench) {
  for (const std::string& op : ops) {
    if (op != "fwd" && op != "dgrad" && op != "wgrad") {
      std::fprintf(stderr, "%s bench: --ops: unknown '%s' (fwd, dgrad, wgrad)\n", bench,
                   op.c_str());
      std::exit(2);
    }
  }
}

// The flags both grouped-GEMM benches take.
struct CommonGemmFlags {
  std::string json, commit = "unknown";
  std::vector<std::string> shapes = {"dsv3", "qwen3", "mixtral"};
  std::vector<std::string> dists = {"uniform", "zipf"};
  std::vector<std::string> ops = {"fwd", "dgrad", "wgrad"};
  int iters = 20, warmup = 3;
  bool Op(const char* op) const { return std::find(ops.begin(), ops.end(), op) != ops.end(); }
};

// Applies one of the shared flags (--json, --commit, --shapes, --dists, --ops, --iters,
// --cooldown-ms); false when `key` is none of them.
inline bool ParseCommonGemmFlag(const std::string& key, const std::string& value,
                                CommonGemmFlags* f, const char* bench) {
  if (key == "--json") {
    f->json = value;
  } else if (key == "--commit") {
    f->commit = value;
  } else if (key == "--shapes") {
    f->shapes = absl::StrSplit(value, ',');
  } else if (key == "--dists") {
    f->dists = absl::StrSplit(value, ',');
  } else if (key == "--ops") {
    f->ops = absl::StrSplit(value, ',');
    CheckOps(f->ops, bench);
  } else if (key == "--iters") {
    f->iters = std::max(1, std::atoi(value.c_str()));
  } else if (key == "--cooldown-ms") {
    CooldownMs() = std::max(0, std::atoi(value.c_str()));
  } else {
    return false;
  }
  return true;
}

// Exits with "<bench> bench: no CUDA device" unless one is visible.
inline void RequireCudaDevice(const char* bench) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "%s bench: no CUDA device\n", bench);
    std::exit(1);
  }
}

// Writes the BENCH.md JSON: `rows` are JSON objects already, `ceilings` the members of the
// "ceilings" object; the group sizes every row used go under "group_sizes". Exits when the file
// cannot be written.
inline void WriteBenchJson(const std::string& path, const char* bench, const std::string& device,
                           const std::vector<std::string>& args, const std::string& commit,
                           const std::string& ceilings, const std::vector<std::string>& rows,
                           const std::vector<std::pair<std::string, std::vector<int>>>& groups) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "%s bench: cannot write %s\n", bench, path.c_str());
    std::exit(1);
  }
  char date[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  std::vector<std::string> sizes;
  for (const auto& [key, v] : groups) {
    sizes.push_back(absl::StrCat("    \"", key, "\": [", absl::StrJoin(v, ", "), "]"));
  }
  std::fprintf(f,
               "{\n  \"bench\": \"%s\",\n  \"device\": \"%s\",\n  \"date\": \"%s\",\n"
               "  \"command\": \"dropless-bench %s %s\",\n  \"commit\": \"%s\",\n"
               "  \"ceilings\": {%s},\n"
               "  \"rows\": [\n%s\n  ],\n  \"group_sizes\": {\n%s\n  }\n}\n",
               bench, device.c_str(), date, bench, absl::StrJoin(args, " ").c_str(), commit.c_str(),
               ceilings.c_str(), absl::StrJoin(rows, ",\n").c_str(),
               absl::StrJoin(sizes, ",\n").c_str());
  std::fclose(f);
  std::printf("wrote %s\n", path.c_str());
}

}  // namespace dropless::bench

#endif  // DROPLESS_BENCH_GEMM_BENCH_COMMON_H_
