// LayerDimsOf and CreateEngineDispatcher (engine_setup.h).
#include "worker/engine/cuda/engine_setup.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "dropless/kernels/grouped_gemm.h"
#include "kernels/cuda/cuda_check.h"
#include "worker/engine/cuda/cuda_engine.h"
#include "worker/engine/cuda/ep/nccl_group.h"

namespace dropless::cuda_engine {
namespace {

// How long a rank waits for the rest of its EP group to set up NCCL.
constexpr absl::Duration kNcclJoinTimeout = absl::Seconds(120);
// Overlap's chunks of the local experts per exchange (fewer when a rank has fewer experts).
constexpr int kOverlapChunks = 4;
// Multiprocessors the expert GEMMs leave to the exchange kernels beside them with overlap (the
// persistent GEMMs otherwise hold every one until they end, and nothing overlaps).
constexpr int kExchangeSms = 20;
// The routed experts' AdamW runs in their weight-gradient GEMM's epilogue (bf16) when a local
// expert expects at most this many rows: the fused update saves the gradient's 8 bytes of traffic
// a parameter and costs tensor-core time in proportion to the rows, so it wins on short
// reductions. On an H200 (docs/step_performance.md, "The weight gradient fused with AdamW") the
// step with it was 2.7% and 2.9% faster than the two passes at 1024 rows per expert (qwen3) and
// 7-9% slower at 2048 (dsv3 at EP 8, mixtral). Either way it allocates no routed-expert gradient.
constexpr int64_t kFusedAdamWMaxRowsPerExpert = 1024;

int OverlapChunks(const EngineConfig& config, int local_experts) {
  return config.overlap ? std::min(kOverlapChunks, local_experts) : 1;
}

// The backward's expert GEMMs one at a time, except in overlap's chunks (whose weight gradients
// wait for every chunk anyway); DROPLESS_SERIAL_EXPERT_BACKWARD=0 puts them side by side (A/B).
bool SerialExpertBackward(int overlap_chunks) {
  const char* serial = std::getenv("DROPLESS_SERIAL_EXPERT_BACKWARD");
  return overlap_chunks == 1 && (serial == nullptr || std::strcmp(serial, "0") != 0);
}

absl::StatusOr<std::unique_ptr<ExpertDispatcher>> NcclDispatcher(const EngineConfig& config,
                                                                 const LayerDims& dims, int rank,
                                                                 RankGroups* groups,
                                                                 DeviceArena* arena) {
  const bool a2a = config.dispatcher == Dispatcher::kNcclA2a;
  if (groups == nullptr || groups->store == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("dispatcher: ", a2a ? "nccl-a2a" : "nccl-lsa",
                     " needs the attempt's rendezvous store to set up its NCCL group"));
  }
  const int ep = dims.ep;
  absl::StatusOr<std::unique_ptr<NcclGroup>> group =
      JoinNcclGroup(groups->store, absl::StrCat("ep/", rank / ep), rank % ep, ep, kNcclJoinTimeout);
  if (!group.ok()) return group.status();
  // auto: nccl-lsa when every rank is load/store reachable, else nccl-a2a (any NCCL transport).
  std::string why = "as the spec asks";
  bool use_a2a = a2a;
  if (config.dispatcher == Dispatcher::kAuto) {
    // Only a clean "not reachable" (FailedPrecondition: the runtime, the NVLink domain) falls
    // back; a probe that failed otherwise may have left the communicator broken.
    const absl::Status lsa = NcclLsaReachable(**group);
    if (!lsa.ok() && !absl::IsFailedPrecondition(lsa)) return lsa;
    // Every rank must build the same dispatcher: one rank's "not reachable" decides for all.
    absl::StatusOr<bool> all_reachable = AllRanksAgree(**group, lsa.ok());
    if (!all_reachable.ok()) return all_reachable.status();
    use_a2a = !*all_reachable;
    why = *all_reachable ? "picked by auto: every rank load/store reachable"
          : lsa.ok() ? "picked by auto: another rank's probe found ranks not load/store reachable"
                     : absl::StrCat("picked by auto: ", lsa.message());
  }
  // The widest row an exchange moves: a bf16 token (hidden x 2 bytes).
  const size_t max_row_bytes = static_cast<size_t>(dims.hidden) * sizeof(Bf16);
  absl::StatusOr<std::unique_ptr<ExpertDispatcher>> d =
      use_a2a ? NewNcclA2aDispatcher(dims.ep_shape(), max_row_bytes, *std::move(group), arena)
              : NewNcclLsaDispatcher(dims.ep_shape(), *std::move(group), arena);
  if (!d.ok()) return d.status();
  LogInfo(absl::StrFormat("cuda engine: rank %d: EP group of %d, dispatcher %s (%s)", rank, ep,
                          (*d)->name(), why));
  return d;
}

}  // namespace

absl::StatusOr<LayerDims> LayerDimsOf(const EngineConfig& config,
                                      std::optional<bool> high_memory_bandwidth) {
  const ModelSpec& m = config.model;
  LayerDims d;
  d.tokens = config.tokens_per_rank;
  d.hidden = m.hidden;
  d.ffn = m.ffn;
  d.experts = static_cast<int>(m.experts);
  d.ep = static_cast<int>(config.parallel.ep);
  d.topk = static_cast<int>(m.topk);
  d.shared = static_cast<int>(m.shared_experts);
  d.score = m.router == RouterKind::kSigmoid ? kernels::ScoreFunction::kSigmoid
                                             : kernels::ScoreFunction::kSoftmax;
  d.renormalize = m.renormalize;
  d.precision = config.precision;
  d.recompute = config.activation_offload;
  // The routed experts' AdamW fused into their weight-gradient GEMM (bf16) on H200-class devices
  // where a local expert expects few rows (kFusedAdamWMaxRowsPerExpert) and the moments are fp32:
  // with bf16 moments the fused update runs no faster than with fp32 ones while the AdamW pass
  // gains their 8 bytes a parameter, and on H100-class devices (less memory bandwidth) the two
  // passes measured 1-3% faster on qwen3 in four sessions, so the two passes win there
  // (docs/step_performance.md). DROPLESS_FUSED_EXPERT_ADAMW=1 or 0 forces it on or off with
  // either width (the fused form keeps no expert gradient: less memory).
  const char* forced = std::getenv("DROPLESS_FUSED_EXPERT_ADAMW");
  const bool fp32_moments = config.optimizer.moment_dtype == MomentDtype::kFp32;
  if (d.precision == Precision::kBf16 && forced == nullptr && fp32_moments &&
      d.expected_rows_per_expert() <= kFusedAdamWMaxRowsPerExpert) {
    if (!high_memory_bandwidth.has_value()) {
      absl::StatusOr<bool> asked = kernels::DeviceHasHighMemoryBandwidth(0);
      if (!asked.ok()) return asked.status();
      high_memory_bandwidth = *asked;
    }
    d.fused_expert_adamw = *high_memory_bandwidth;
  } else {
    d.fused_expert_adamw =
        d.precision == Precision::kBf16 && forced != nullptr && std::strcmp(forced, "1") == 0;
  }
  // The routed experts' gradient in bf16 where it is stored: bf16 with the two passes (the fused
  // update keeps none; the quantized precisions' weight gradients stay fp32). Opt-in for A/B runs.
  const char* bf16_grad = std::getenv("DROPLESS_BF16_EXPERT_GRAD");
  d.bf16_expert_grad = d.precision == Precision::kBf16 && !d.fused_expert_adamw &&
                       bf16_grad != nullptr && std::strcmp(bf16_grad, "1") == 0;
  // MXFP8 on the bf16 tensor cores where every reduction length is a multiple of 64 (H for w1's
  // forward and w2's data gradient, F and 2F for the others); DROPLESS_MX_CORE=0 keeps the
  // per-32 promotion kernels (A/B runs).
  const char* mx_core = std::getenv("DROPLESS_MX_CORE");
  d.mx_core = d.precision == Precision::kMxfp8 && d.hidden % 64 == 0 && d.ffn % 64 == 0 &&
              (mx_core == nullptr || std::strcmp(mx_core, "0") != 0);
  const char* fused_quantizers = std::getenv("DROPLESS_FP8_BLOCK_FUSED_QUANTIZERS");
  d.fp8_block_fused_quantizers =
      d.fp8_block() && (fused_quantizers == nullptr || std::strcmp(fused_quantizers, "0") != 0);
  d.overlap_chunks = OverlapChunks(config, d.local_experts());
  d.serial_expert_backward = SerialExpertBackward(d.overlap_chunks);
  if (config.overlap) {
    int sms = 0, reserve = kExchangeSms;
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    if (const char* r = std::getenv("DROPLESS_EXCHANGE_SMS"); r != nullptr) reserve = std::atoi(r);
    d.expert_gemm_sms = reserve > 0 ? std::max(1, sms - reserve) : 0;
  }
  return d;
}

namespace {

// LayerDimsOf without the device queries (overlap's SM count; the device's memory bandwidth,
// here H200-class unless said otherwise), for the host-side answers below that do not depend on
// overlap (overlap_chunks and serial_expert_backward do: see RunsExpertBackwardOneGemmAtATime).
absl::StatusOr<LayerDims> HostLayerDims(const EngineConfig& config,
                                        bool high_memory_bandwidth = true) {
  EngineConfig c = config;
  c.overlap = false;
  return LayerDimsOf(c, high_memory_bandwidth);
}

}  // namespace

bool FusesExpertUpdate(const EngineConfig& config, bool high_memory_bandwidth) {
  absl::StatusOr<LayerDims> d = HostLayerDims(config, high_memory_bandwidth);
  return d.ok() && d->fused_expert_adamw;
}

bool StoresBf16ExpertGradient(const EngineConfig& config, bool high_memory_bandwidth) {
  absl::StatusOr<LayerDims> d = HostLayerDims(config, high_memory_bandwidth);
  return d.ok() && d->bf16_expert_grad;
}

bool UsesMxCore(const EngineConfig& config) {
  absl::StatusOr<LayerDims> d = HostLayerDims(config);
  return d.ok() && d->mx_core;
}

bool RunsExpertBackwardOneGemmAtATime(const EngineConfig& config) {
  absl::StatusOr<LayerDims> d = HostLayerDims(config);
  return d.ok() && SerialExpertBackward(OverlapChunks(config, d->local_experts()));
}

bool FusesFp8BlockQuantizers(const EngineConfig& config) {
  absl::StatusOr<LayerDims> d = HostLayerDims(config);
  return d.ok() && d->fp8_block_fused_quantizers;
}

absl::StatusOr<std::unique_ptr<ExpertDispatcher>> CreateEngineDispatcher(
    const EngineConfig& config, const LayerDims& dims, int rank, int ep_local, RankGroups* groups,
    StreamLinks* links, DeviceArena* arena) {
  absl::StatusOr<std::unique_ptr<ExpertDispatcher>> d;
  if (ep_local > 1) {
    d = NewLocalDispatcher(dims.ep_shape(), links, arena);
  } else {
    switch (config.dispatcher) {
      case Dispatcher::kAuto:
        if (dims.ep == 1) {
          d = std::unique_ptr<ExpertDispatcher>();
        } else {
          d = NcclDispatcher(config, dims, rank, groups, arena);
        }
        break;
      case Dispatcher::kNcclLsa:
      case Dispatcher::kNcclA2a:
        d = NcclDispatcher(config, dims, rank, groups, arena);
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("dispatcher: ", std::string(ToString(config.dispatcher)),
                         " is not available to the cuda engine (nccl-lsa, nccl-a2a or auto)"));
    }
  }
  if (!d.ok()) return d.status();
  if (config.overlap && (*d == nullptr || !(*d)->exchanges_expert_runs())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "overlap: needs a dispatcher that exchanges runs of the local experts (local or "
        "nccl-lsa); this job's is ",
        *d == nullptr ? std::string("none") : std::string((*d)->name())));
  }
  return d;
}

}  // namespace dropless::cuda_engine
