// dropless-bench step: the CUDA engine's whole training step (forward, backward, AdamW) on one GPU
// for the MoE layer shapes, with its breakdown (data, forward, backward, optimizer; dispatch,
// combine and the expert GEMMs' phases inside the step) and the step's own expert GEMMs timed
// alone (gemm_tflops: their harmonic mean, BENCH.md). The peers (torch._grouped_mm step, naive
// torch loop, JAX ragged_dot) run next to the same engine in one process, alternating rounds, in
// bench/peers/step_peer.py (through the engine's C entry, worker/engine/cuda/step_capi.cc); that
// script's JSON is what backs a claim. This one prints the engine's own table.
//
// Shapes: BENCH.md's, one GPU's share. dsv3 holds 256 experts of 7168 x 2048 x 3: with fp32
// master weights and AdamW moments (18 bytes a parameter) that is 203 GB, more than one H200, so
// `dsv3` here is one GPU's share of the layer at EP=8 (32 experts, each receiving T*k/32 rows; the
// same T, k, H, F and FLOPs); qwen3 and mixtral fit whole.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_registry.h"
#include "bench/gemm_bench_common.h"
#include "common/engine_config.h"
#include "worker/engine/cuda/cuda_engine.h"
#include "worker/transport/communicator.h"
#include "worker/transport/transport_factory.h"

namespace dropless::bench {
namespace {

struct StepShape {
  const char* name;
  int64_t tokens, hidden, ffn, experts, top_k;
  const char* note;
};
constexpr StepShape kStepShapes[] = {
    {"dsv3", 8192, 7168, 2048, 32, 8, "one GPU's share at EP=8: 32 of 256 experts"},
    {"qwen3", 16384, 2048, 768, 128, 8, ""},
    {"mixtral", 8192, 4096, 14336, 8, 2, ""},
};

struct Flags {
  std::vector<std::string> shapes = {"dsv3", "qwen3", "mixtral"};
  std::vector<std::string> precisions = {"bf16"};
  int steps = 10;
  int warmup = 3;
  int layers = 1;
  int rounds = 3;
  // EP ranks of the layer on this one GPU (the `local` dispatcher): each rank gets T / ep of the
  // shape's tokens and E / ep of its experts, so the group does the shape's FLOPs.
  std::vector<int> eps = {1};
  // Engine settings compared in one run (engines held side by side, rounds alternating):
  // "default", "optimizer-overlap" / "optimizer-after-backward" (DROPLESS_OPTIMIZER_OVERLAP), or
  // "activation-offload" (the spec's activation_offload: true), "overlap" (overlap: true; EP > 1),
  // "overlap:N" (the same with N multiprocessors left to the exchanges, DROPLESS_EXCHANGE_SMS),
  // "fused-adamw" / "two-pass-adamw" (DROPLESS_FUSED_EXPERT_ADAMW), "bf16-expert-grad" /
  // "fp32-expert-grad" (the two passes with the routed experts' gradient in bf16 / fp32,
  // DROPLESS_BF16_EXPERT_GRAD). A knob a variant does not set keeps the bench's environment.
  std::vector<std::string> variants = {"default"};
  // The EP exchange: auto (`local` at EP > 1, none at EP 1), or nccl-lsa / nccl-a2a at world size
  // 1 (one rank per process: on one GPU, --ep=1 through NCCL).
  std::string dispatcher = "auto";
  std::string json, commit;
};

Flags ParseStepFlags(const std::vector<std::string>& args) {
  Flags f;
  for (const std::string& a : args) {
    std::pair<std::string, std::string> kv = absl::StrSplit(a, absl::MaxSplits('=', 1));
    if (kv.first == "--shapes") {
      f.shapes = absl::StrSplit(kv.second, ',');
    } else if (kv.first == "--precision") {
      f.precisions = absl::StrSplit(kv.second, ',');
      for (const std::string& p : f.precisions) {
        if (p != "bf16" && p != "mxfp8" && p != "fp8-block" && p != "fp8-block-wgrad128") {
          std::fprintf(stderr, "step bench: --precision: unknown precision %s (bf16, mxfp8, "
                               "fp8-block, fp8-block-wgrad128)\n", p.c_str());
          std::exit(2);
        }
      }
    } else if (kv.first == "--steps") {
      f.steps = std::max(1, std::atoi(kv.second.c_str()));
    } else if (kv.first == "--warmup") {
      f.warmup = std::max(1, std::atoi(kv.second.c_str()));
    } else if (kv.first == "--rounds") {
      f.rounds = std::max(1, std::atoi(kv.second.c_str()));
    } else if (kv.first == "--variants") {
      f.variants = absl::StrSplit(kv.second, ',');
    } else if (kv.first == "--ep") {
      f.eps.clear();
      for (absl::string_view v : absl::StrSplit(kv.second, ',')) {
        f.eps.push_back(std::max(1, std::atoi(std::string(v).c_str())));
      }
    } else if (kv.first == "--layers") {
      f.layers = std::max(1, std::atoi(kv.second.c_str()));
    } else if (kv.first == "--dispatcher") {
      f.dispatcher = kv.second;
      if (f.dispatcher != "auto" && f.dispatcher != "nccl-lsa" && f.dispatcher != "nccl-a2a") {
        std::fprintf(stderr, "step bench: --dispatcher: %s is not auto, nccl-lsa or nccl-a2a\n",
                     f.dispatcher.c_str());
        std::exit(2);
      }
    } else if (kv.first == "--json") {
      f.json = kv.second;
    } else if (kv.first == "--commit") {
      f.commit = kv.second;
    } else {
      std::fprintf(stderr,
                   "step bench: unknown flag %s\nflags: --shapes=dsv3,qwen3,mixtral "
                   "--precision=bf16,mxfp8,fp8-block,fp8-block-wgrad128 "
                   "--steps=N --warmup=N --rounds=N --layers=N --ep=1,2,8 "
                   "--dispatcher=auto|nccl-lsa|nccl-a2a "
                   "--variants=default|optimizer-overlap,optimizer-after-backward,"
                   "activation-offload,overlap,overlap:N,fused-adamw,two-pass-adamw,bf16-expert-"
                   "grad,fp32-expert-grad "
                   "--json=PATH "
                   "--commit=SHA\n",
                   a.c_str());
      std::exit(2);
    }
  }
  return f;
}

bool IsOverlap(const std::string& variant) {
  return variant == "overlap" || absl::StartsWith(variant, "overlap:");
}

// Environment variables set for a while, then put back as they were (set or not).
class ScopedEnvironment {
 public:
  ScopedEnvironment() = default;
  ScopedEnvironment(ScopedEnvironment&& other) noexcept : saved_(std::move(other.saved_)) {
    other.saved_.clear();
  }
  ScopedEnvironment& operator=(ScopedEnvironment&&) = delete;
  ~ScopedEnvironment() { Restore(); }

  void Set(const char* name, const std::string& value) {
    Save(name);
    setenv(name, value.c_str(), 1);
  }
  void Unset(const char* name) {
    Save(name);
    unsetenv(name);
  }
  void Restore() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second.has_value()) {
        setenv(it->first.c_str(), it->second->c_str(), 1);
      } else {
        unsetenv(it->first.c_str());
      }
    }
    saved_.clear();
  }

 private:
  void Save(const char* name) {
    const char* was = std::getenv(name);
    saved_.emplace_back(name, was != nullptr ? std::optional<std::string>(was) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// The engine knobs a variant sets (Flags::variants); the others keep the bench's environment.
absl::StatusOr<ScopedEnvironment> VariantEnvironment(const std::string& variant) {
  ScopedEnvironment env;
  if (variant == "default" || variant == "activation-offload" || variant == "overlap") {
  } else if (variant == "optimizer-overlap") {
    env.Unset("DROPLESS_OPTIMIZER_OVERLAP");
  } else if (variant == "optimizer-after-backward") {
    env.Set("DROPLESS_OPTIMIZER_OVERLAP", "0");
  } else if (absl::StartsWith(variant, "overlap:")) {
    env.Set("DROPLESS_EXCHANGE_SMS", variant.substr(8));
  } else if (variant == "fused-adamw") {
    env.Set("DROPLESS_FUSED_EXPERT_ADAMW", "1");
  } else if (variant == "two-pass-adamw") {
    env.Set("DROPLESS_FUSED_EXPERT_ADAMW", "0");
  } else if (variant == "bf16-expert-grad" || variant == "fp32-expert-grad") {
    env.Set("DROPLESS_FUSED_EXPERT_ADAMW", "0");
    env.Set("DROPLESS_BF16_EXPERT_GRAD", variant == "bf16-expert-grad" ? "1" : "0");
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown variant ", variant));
  }
  return env;
}

EngineConfig ConfigOf(const StepShape& s, const std::string& precision, int layers, int ep) {
  EngineConfig c;
  c.model.hidden = s.hidden;
  c.model.ffn = s.ffn;
  c.model.experts = s.experts;
  c.model.topk = s.top_k;
  c.model.shared_experts = 0;
  c.model.layers = layers;
  c.model.router = RouterKind::kSoftmax;
  c.model.aux_loss_coeff = 0.01;
  c.precision = precision == "mxfp8"                ? Precision::kMxfp8
                : precision == "fp8-block"          ? Precision::kFp8Block
                : precision == "fp8-block-wgrad128" ? Precision::kFp8BlockWgrad128
                                                    : Precision::kBf16;
  c.parallel.ep = ep;
  c.tokens_per_rank = s.tokens / ep;
  c.steps = 1000000;
  c.optimizer.lr = 1e-4;
  c.data.seed = 1;
  return c;
}

int RunStepBench(const std::vector<std::string>& args) {
  const Flags f = ParseStepFlags(args);
  RequireCudaDevice("step");
  cudaDeviceProp prop{};
  CheckCuda(cudaGetDeviceProperties(&prop, 0), "step", "cudaGetDeviceProperties");
  const double peak = cuda_engine::kHopperDenseBf16PeakFlops;
  std::printf("step bench on %s; MFU against %.1f TFLOP/s (dense bf16, H100/H200 SXM datasheet)\n",
              prop.name, peak / 1e12);
  std::printf("%-8s %-6s %2s %9s %8s %6s %8s | %7s %7s %7s %7s | %8s %8s %8s %8s\n", "shape",
              "prec", "ep", "step ms", "TFLOP/s", "MFU", "mem GiB", "fwd ms", "bwd ms", "opt ms",
              "data ms", "gemm TF", "fwd TF", "dgrad TF", "wgrad TF");
  std::vector<std::string> rows;
  for (const std::string& name : f.shapes) {
    const StepShape* shape = nullptr;
    for (const StepShape& s : kStepShapes) {
      if (name == s.name) shape = &s;
    }
    if (shape == nullptr) {
      std::fprintf(stderr, "step bench: unknown shape %s\n", name.c_str());
      return 2;
    }
    for (const std::string& precision : f.precisions) {
      for (int ep : f.eps) {
        if (shape->experts % ep != 0 || shape->tokens % ep != 0) {
          std::fprintf(stderr, "step bench: %s does not split over ep %d\n", shape->name, ep);
          return 2;
        }
        // One engine per variant, held side by side; rounds alternate between them so the GPU's
        // clock state (power cap) is shared; medians over every timed step of every round.
        const bool nccl = f.dispatcher != "auto";
        if (nccl && ep != 1) {
          std::fprintf(stderr, "step bench: --dispatcher=%s runs one EP rank per process; on one "
                               "GPU that is --ep=1 (world size 1)\n", f.dispatcher.c_str());
          return 2;
        }
        struct Run {
          std::string variant;
          // The NCCL group's rendezvous (nccl-*), at fixed addresses for the engine's lifetime.
          std::unique_ptr<KeyValueStore> store;
          std::unique_ptr<RankGroups> groups;
          std::unique_ptr<cuda_engine::CudaEngine> engine;
          std::vector<double> ms;
          StepStats last;
          cuda_engine::CudaStepDetails details;
        };
        std::vector<Run> runs;
        for (const std::string& variant : f.variants) {
          // The variant's engine knobs, read when its engine starts below; the environment the
          // bench was started with is back once the engine exists, so a knob set outside holds
          // for every variant that does not set it itself.
          absl::StatusOr<ScopedEnvironment> env = VariantEnvironment(variant);
          if (!env.ok()) {
            std::fprintf(stderr, "step bench: %s\n", std::string(env.status().message()).c_str());
            return 2;
          }
          EngineConfig config = ConfigOf(*shape, precision, f.layers, ep);
          config.activation_offload = variant == "activation-offload";
          config.overlap = IsOverlap(variant);
          Run run;
          run.variant = variant;
          if (nccl) {
            config.dispatcher = f.dispatcher == "nccl-lsa" ? Dispatcher::kNcclLsa : Dispatcher::kNcclA2a;
            run.store = NewMemoryKvStore();
            run.groups = std::make_unique<RankGroups>();
            run.groups->store = run.store.get();
          }
          absl::StatusOr<std::unique_ptr<cuda_engine::CudaEngine>> engine =
              ep == 1 ? cuda_engine::CreateCudaEngine(config, 0, 1, run.groups.get())
                      : cuda_engine::CreateLocalEpCudaEngine(config);
          env->Restore();
          CheckStatus(engine.status(), "step", "creating the engine");
          run.engine = *std::move(engine);
          runs.push_back(std::move(run));
        }
        for (int round = 0; round < f.rounds; ++round) {
          for (Run& run : runs) {
            for (int i = 0; i < (round == 0 ? f.warmup : 0) + f.steps; ++i) {
              absl::StatusOr<StepStats> s = run.engine->Step();
              CheckStatus(s.status(), "step", "step");
              if (round > 0 || i >= f.warmup) {
                run.ms.push_back(s->step_seconds * 1e3);
                run.last = *s;
                run.details = run.engine->LastStepDetails();
              }
            }
          }
        }
        for (Run& run : runs) {
          std::sort(run.ms.begin(), run.ms.end());
          const double median = run.ms[run.ms.size() / 2];
          absl::StatusOr<cuda_engine::CudaEngine::GemmSeconds> g = run.engine->TimeExpertGemms(5);
          CheckStatus(g.status(), "step", "timing the expert GEMMs");
          const double routed =
              6.0 * shape->tokens * shape->top_k * shape->hidden * shape->ffn * f.layers;
          const double tflops = 3.0 * routed / (median * 1e-3) / 1e12;
          const double fwd = routed / g->forward / 1e12, dgrad = routed / g->dgrad / 1e12;
          const double wgrad = routed / g->wgrad / 1e12;
          const double gemm_tflops = 3.0 / (1.0 / fwd + 1.0 / dgrad + 1.0 / wgrad);
          // The engine's own device allocations: engines of other variants share the GPU.
          const cuda_engine::CudaStepDetails& d = run.details;
          const double mem_gib = static_cast<double>(d.engine_bytes) / (1 << 30);
          std::printf(
              "%-8s %-6s %2d %9.3f %8.1f %5.1f%% %8.1f | %7.3f %7.3f %7.3f %7.3f | %8.1f %8.1f "
              "%8.1f %8.1f  %s\n",
              shape->name, precision.c_str(), ep, median, tflops, 100 * tflops * 1e12 / peak,
              mem_gib, d.forward_seconds * 1e3, d.backward_seconds * 1e3, d.optimizer_seconds * 1e3,
              d.data_seconds * 1e3, gemm_tflops, fwd, dgrad, wgrad, run.variant.c_str());
          rows.push_back(absl::StrFormat(
              "    {\"name\": \"step\", \"shape\": \"%s\", \"impl\": \"dropless\", \"precision\": "
              "\"%s\", \"ms\": %.4f, \"tflops\": %.1f, \"gbps\": null, \"mfu\": %.4f, "
              "\"peak_mem_gib\": %.2f, \"ep\": %d, \"backend\": \"%s\", \"offload\": %s, "
              "\"overlap\": %s, "
              "\"gemm_tflops\": %.1f, \"forward_ms\": %.4f, \"backward_ms\": %.4f, "
              "\"optimizer_ms\": %.4f, \"data_ms\": %.4f, \"dispatch_ms\": %.4f, \"combine_ms\": "
              "%.4f, "
              "\"layers\": %d, \"variant\": \"%s\", "
              "\"note\": \"%s\"}",
              shape->name, precision, median, tflops, tflops * 1e12 / peak, mem_gib, ep,
              nccl ? f.dispatcher : ep > 1 ? "local" : "none",
              run.variant == "activation-offload" ? "true" : "false",
              IsOverlap(run.variant) ? "true" : "false",
              gemm_tflops, d.forward_seconds * 1e3,
              d.backward_seconds * 1e3, d.optimizer_seconds * 1e3, d.data_seconds * 1e3,
              run.last.dispatch_seconds * 1e3, run.last.combine_seconds * 1e3, f.layers,
              run.variant, shape->note));
        }
      }
    }
  }
  if (!f.json.empty()) {
    WriteBenchJson(f.json, "step", std::string(prop.name) + " (1 GPU)", args, f.commit,
                   "\"dense_bf16_peak_tflops\": 989.5", rows, {});
  }
  return 0;
}

}  // namespace

DROPLESS_REGISTER_BENCH(step, "step", "the CUDA engine's training step (one GPU)", RunStepBench);

}  // namespace dropless::bench
