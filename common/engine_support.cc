// CheckEngineSupport (engine_config.h): the capabilities of the cpu and cuda engines.
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/engine_config.h"

namespace dropless {
namespace {

// The most ranks a cpu job runs: 2 x 512 x 511 Gloo addresses of ~136 bytes (world and EP
// groups) stay within the rendezvous store's 256 MiB an attempt (one more doubling would not).
constexpr int64_t kMaxCpuWorldSize = 512;

absl::Status Refuse(const char* field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

absl::Status CheckCpu(const EngineConfig& c) {
  // The shapes its buffers and loops assume; a spec that passed its ranges always has them, a
  // config built by hand (tests, benchmarks) may not.
  const ModelSpec& m = c.model;
  if (m.hidden <= 0 || m.ffn <= 0 || m.experts <= 0 || m.topk <= 0 || m.topk > m.experts ||
      m.shared_experts < 0 || m.layers <= 0) {
    return Refuse("model", absl::StrFormat("the cpu engine needs positive hidden, ffn, experts, "
                                           "layers and 1 <= topk <= experts (got hidden %d, ffn "
                                           "%d, experts %d, topk %d, shared_experts %d, layers %d)",
                                           m.hidden, m.ffn, m.experts, m.topk, m.shared_experts,
                                           m.layers));
  }
  if (c.parallel.ep <= 0 || c.parallel.dp <= 0 || m.experts % c.parallel.ep != 0) {
    return Refuse("parallel", absl::StrFormat("%d experts must split over ep %d (dp %d)", m.experts,
                                              c.parallel.ep, c.parallel.dp));
  }
  // Gloo connects every pair of ranks of the world group and of each EP group through the
  // attempt's rendezvous keys (~136 bytes an address, 256 MiB an attempt) and a socket each.
  if (c.parallel.ep * c.parallel.dp > kMaxCpuWorldSize) {
    return Refuse("parallel",
                  absl::StrFormat("ep x dp = %d ranks: the cpu engine runs at most %d (its Gloo "
                                  "groups connect every pair of ranks through the rendezvous)",
                                  c.parallel.ep * c.parallel.dp, kMaxCpuWorldSize));
  }
  if (c.tokens_per_rank <= 0) return Refuse("tokens_per_rank", "must be positive");
  if (c.precision != Precision::kBf16) {
    return Refuse("precision", absl::StrCat(std::string(ToString(c.precision)),
                                            " needs resources.backend cuda (the cpu engine "
                                            "computes in float32)"));
  }
  if (c.overlap) {
    return Refuse("overlap", "the cpu engine's Gloo exchange is blocking; overlap is not "
                             "available with resources.backend cpu");
  }
  if (c.activation_offload) {
    return Refuse("activation_offload", "needs resources.backend cuda (the cpu engine keeps "
                                        "activations in host memory already)");
  }
  if (c.dispatcher != Dispatcher::kAuto && c.dispatcher != Dispatcher::kGloo) {
    return Refuse("dispatcher", absl::StrCat(std::string(ToString(c.dispatcher)),
                                             " needs resources.backend cuda"));
  }
  return absl::OkStatus();
}

absl::Status CheckCuda(const EngineConfig& c) {
  const ModelSpec& m = c.model;
  if (c.parallel.dp != 1) {
    return Refuse("parallel.dp", absl::StrFormat("the cuda engine runs one EP group (dp 1); data "
                                                 "parallelism across EP groups is not built yet "
                                                 "(got dp %d)", c.parallel.dp));
  }
  if (c.parallel.ep < 1 || c.parallel.ep > 8 || m.experts % c.parallel.ep != 0) {
    return Refuse("parallel.ep", absl::StrFormat("the cuda engine's EP group is 1 to 8 GPUs of one "
                                                 "NVLink domain and must split model.experts "
                                                 "(%d) evenly (got ep %d)", m.experts,
                                                 c.parallel.ep));
  }
  switch (c.dispatcher) {
    case Dispatcher::kAuto:
    case Dispatcher::kNcclLsa:
    case Dispatcher::kNcclA2a:
      break;
    case Dispatcher::kNcclEp:
      return Refuse("dispatcher",
                    "nccl-ep (NVIDIA's NCCL EP library) is not driven by the cuda "
                    "engine yet; use nccl-lsa, nccl-a2a or auto");
    case Dispatcher::kGloo:
      return Refuse("dispatcher", "gloo moves host buffers (the cpu engine's); use nccl-lsa, "
                                  "nccl-a2a or auto with resources.backend cuda");
  }
  if (c.overlap) {
    // Chunks of each rank's experts: the exchange of one chunk beside the GEMMs of another.
    if (c.parallel.ep < 2) {
      return Refuse("overlap", "overlaps the expert exchange with the expert GEMMs; at parallel.ep "
                               "1 there is no exchange (set overlap: false)");
    }
    if (m.experts / c.parallel.ep < 2) {
      return Refuse("overlap", absl::StrFormat("chunks each rank's experts and needs at least 2 "
                                               "per rank (model.experts %d / parallel.ep %d)",
                                               m.experts, c.parallel.ep));
    }
    if (c.dispatcher == Dispatcher::kNcclA2a || c.dispatcher == Dispatcher::kNcclEp) {
      return Refuse("overlap", absl::StrFormat("needs a dispatcher that exchanges chunks of the "
                                               "experts (nccl-lsa or auto); %s cannot",
                                               std::string(ToString(c.dispatcher))));
    }
  }
  if (c.activation_offload && m.layers < 3) {
    // The ring keeps the last two layers' activations on the device (their backward comes first).
    return Refuse("activation_offload", absl::StrFormat("moves the saved activations of all but "
                                                        "the last two layers to host memory; with "
                                                        "model.layers %d nothing would leave the "
                                                        "GPU (needs 3 or more)",
                                                        m.layers));
  }
  // bf16: 16-byte rows. mxfp8: one E8M0 scale per 32 values. fp8-block: 1x128 activation tiles
  // and 128x128 weight blocks.
  const int64_t align = IsFp8Block(c.precision)             ? 128
                        : c.precision == Precision::kMxfp8  ? 32
                                                             : 8;
  for (auto [field, v] : {std::pair<const char*, int64_t>{"model.hidden", m.hidden},
                          std::pair<const char*, int64_t>{"model.ffn", m.ffn}}) {
    if (v % align != 0) {
      return Refuse(field, absl::StrFormat("the cuda engine needs a multiple of %d with precision "
                                           "%s (got %d)",
                                           align, std::string(ToString(c.precision)), v));
    }
  }
  // With an exchange (parallel.ep > 1, or an NCCL dispatcher named at ep 1) mxfp8 tokens travel
  // quantized: a row of hidden / 32 E8M0 scales, which the exchange moves in 4-byte words.
  const bool exchange = c.parallel.ep > 1 || c.dispatcher == Dispatcher::kNcclLsa ||
                        c.dispatcher == Dispatcher::kNcclA2a;
  if (c.precision == Precision::kMxfp8 && exchange && m.hidden % 128 != 0) {
    return Refuse("model.hidden",
                  absl::StrFormat("with precision mxfp8 and an EP exchange (parallel.ep %d, "
                                  "dispatcher %s) the tokens travel with hidden / 32 one-byte "
                                  "scales, moved in 4-byte words: the cuda engine needs a "
                                  "multiple of 128 (got %d)",
                                  c.parallel.ep, std::string(ToString(c.dispatcher)), m.hidden));
  }
  if (m.experts % 8 != 0 || m.experts > 512) {
    return Refuse("model.experts", absl::StrFormat("the cuda engine needs a multiple of 8, at most "
                                                   "512 (got %d)", m.experts));
  }
  if (m.topk > 16) {
    return Refuse("model.topk", absl::StrFormat("the cuda engine routes at most 16 experts per "
                                                "token (got %d)", m.topk));
  }
  if (c.tokens_per_rank * m.topk >= (int64_t{1} << 31)) {
    return Refuse("tokens_per_rank", "tokens_per_rank * model.topk must stay below 2^31");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckEngineSupport(Backend backend, const EngineConfig& config) {
  return backend == Backend::kCuda ? CheckCuda(config) : CheckCpu(config);
}

}  // namespace dropless
