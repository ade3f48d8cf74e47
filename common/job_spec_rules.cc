// The value ranges and cross-field rules of a job spec. Bounds are generous sanity limits: they
// catch typos (an extra zero) and requests no engine can serve, not tuning choices.
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/engine_config.h"
#include "common/job_spec.h"
#include "common/job_spec_internal.h"
#include "common/utf8.h"

namespace dropless::internal {
namespace {

constexpr int64_t kMaxHidden = 65536;
constexpr int64_t kMaxFfn = 262144;
constexpr int64_t kMaxExperts = 1024;
constexpr int64_t kMaxTopk = 16;
constexpr int64_t kMaxLayers = 256;
constexpr int64_t kMaxRanksPerDim = 4096;
constexpr int64_t kMaxWorldSize = 4096;
constexpr int64_t kMaxTokensPerRank = int64_t{1} << 20;
constexpr int64_t kMaxSteps = 1'000'000'000;
constexpr int64_t kMaxPriority = kMaxJobPriority;
constexpr int64_t kMaxAttempts = 100;
constexpr size_t kMaxLabels = 32;
constexpr int64_t kMaxTimeLimitSeconds = 366LL * 24 * 3600;
// A CPU rank computes in float32 on one core's share of a host; beyond this it is a typo.
constexpr double kMaxCpuBytesPerRank = 32.0 * (int64_t{1} << 30);

absl::Status Fail(absl::string_view path, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", rule));
}

absl::Status CheckRange(absl::string_view path, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo) return Fail(path, absl::StrFormat("must be >= %d (got %d)", lo, v));
  if (v > hi) return Fail(path, absl::StrFormat("must be <= %d (got %d)", hi, v));
  return absl::OkStatus();
}

bool IsValidName(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alnum && !(i > 0 && c == '-')) return false;
  }
  return true;
}

// kubectl's label rules: a name or value of up to 63 [A-Za-z0-9._-], alphanumeric at both ends
// (a value may also be empty); a key is [prefix/]name, the prefix a DNS subdomain (<= 253).
bool IsLabelName(absl::string_view s, bool allow_empty) {
  if (s.empty()) return allow_empty;
  if (s.size() > 63) return false;
  auto alnum = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  };
  for (char c : s) {
    if (!alnum(c) && c != '.' && c != '_' && c != '-') return false;
  }
  return alnum(s.front()) && alnum(s.back());
}

bool IsLabelKey(absl::string_view key) {
  const size_t slash = key.find('/');
  if (slash == absl::string_view::npos) return IsLabelName(key, false);
  absl::string_view prefix = key.substr(0, slash);
  if (prefix.empty() || prefix.size() > 253) return false;
  for (char c : prefix) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-')) return false;
  }
  return IsLabelName(key.substr(slash + 1), false);
}

absl::Status CheckLabels(const JobSpec& s) {
  if (s.labels.size() > kMaxLabels) {
    return Fail("labels",
                absl::StrFormat("at most %d labels (got %d)", kMaxLabels, s.labels.size()));
  }
  for (const auto& [key, value] : s.labels) {
    if (absl::Status st = CheckLabel(absl::StrCat("labels.", key.substr(0, 80)), key, value);
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

// Rough float32 footprint of one CPU rank: expert weights with their gradient and two AdamW
// moments (parameters), plus the activations saved for the backward pass of every layer.
struct CpuRankBytes {
  double parameters = 0, activations = 0;
};
CpuRankBytes CpuBytesPerRank(const JobSpec& s) {
  const ModelSpec& m = s.model;
  const double local_experts = static_cast<double>(m.experts / s.parallel.ep + m.shared_experts);
  const double weights = m.layers * (local_experts * 3.0 * m.hidden * m.ffn + m.hidden * m.experts);
  const double activations = static_cast<double>(m.layers) * s.tokens_per_rank *
                             (m.topk * (2.0 * m.hidden + 3.0 * m.ffn) + 4.0 * m.hidden);
  return CpuRankBytes{4.0 * 4.0 * weights, 4.0 * activations};
}

#define DROPLESS_CHECK(expr)           \
  do {                                 \
    absl::Status st_ = (expr);         \
    if (!st_.ok()) return st_;         \
  } while (0)

absl::Status CheckModel(const JobSpec& s) {
  const ModelSpec& m = s.model;
  DROPLESS_CHECK(CheckRange("model.hidden", m.hidden, 1, kMaxHidden));
  DROPLESS_CHECK(CheckRange("model.ffn", m.ffn, 1, kMaxFfn));
  DROPLESS_CHECK(CheckRange("model.experts", m.experts, 1, kMaxExperts));
  DROPLESS_CHECK(CheckRange("model.topk", m.topk, 1, kMaxTopk));
  if (m.topk > m.experts) {
    return Fail("model.topk",
                absl::StrFormat("must be <= model.experts (got %d > %d)", m.topk, m.experts));
  }
  DROPLESS_CHECK(CheckRange("model.shared_experts", m.shared_experts, 0, kMaxSharedExperts));
  DROPLESS_CHECK(CheckRange("model.layers", m.layers, 1, kMaxLayers));
  if (!(m.aux_loss_coeff >= 0.0 && m.aux_loss_coeff <= 1.0)) {
    return Fail("model.aux_loss_coeff",
                absl::StrFormat("must be in [0, 1] (got %g)", m.aux_loss_coeff));
  }
  return absl::OkStatus();
}

absl::Status CheckParallel(const JobSpec& s) {
  DROPLESS_CHECK(CheckRange("parallel.ep", s.parallel.ep, 1, kMaxRanksPerDim));
  DROPLESS_CHECK(CheckRange("parallel.dp", s.parallel.dp, 1, kMaxRanksPerDim));
  if (s.world_size() > kMaxWorldSize) {
    return Fail("parallel", absl::StrFormat("ep * dp must be <= %d ranks (got %d * %d = %d)",
                                            kMaxWorldSize, s.parallel.ep, s.parallel.dp,
                                            s.world_size()));
  }
  if (s.model.experts % s.parallel.ep != 0) {
    return Fail("model.experts",
                absl::StrFormat("must be divisible by parallel.ep (got %d %% %d != 0)",
                                s.model.experts, s.parallel.ep));
  }
  return absl::OkStatus();
}

absl::Status CheckOptimizer(const JobSpec& s) {
  const OptimizerSpec& o = s.optimizer;
  if (o.name != "adamw") {
    return Fail("optimizer.name", absl::StrCat("must be adamw (got '", o.name, "')"));
  }
  if (!(o.lr > 0.0 && o.lr <= 10.0)) {
    return Fail("optimizer.lr", absl::StrFormat("must be > 0 and <= 10 (got %g)", o.lr));
  }
  if (!(o.beta1 >= 0.0 && o.beta1 < 1.0)) {
    return Fail("optimizer.betas[0]", absl::StrFormat("must be in [0, 1) (got %g)", o.beta1));
  }
  if (!(o.beta2 >= 0.0 && o.beta2 < 1.0)) {
    return Fail("optimizer.betas[1]", absl::StrFormat("must be in [0, 1) (got %g)", o.beta2));
  }
  if (!(o.eps > 0.0 && o.eps <= 1.0)) {
    return Fail("optimizer.eps", absl::StrFormat("must be > 0 and <= 1 (got %g)", o.eps));
  }
  if (!(o.weight_decay >= 0.0 && o.weight_decay <= 1.0)) {
    return Fail("optimizer.weight_decay",
                absl::StrFormat("must be in [0, 1] (got %g)", o.weight_decay));
  }
  return CheckRange("optimizer.warmup", o.warmup_steps, 0, kMaxSteps);
}

absl::Status CheckPlacementRules(const JobSpec& s) {
  const bool nccl = s.dispatcher == Dispatcher::kNcclA2a || s.dispatcher == Dispatcher::kNcclLsa ||
                    s.dispatcher == Dispatcher::kNcclEp;
  if (nccl && s.resources.backend != Backend::kCuda) {
    return Fail("dispatcher", absl::StrCat(std::string(ToString(s.dispatcher)),
                                           " needs resources.backend cuda (got ",
                                           std::string(ToString(s.resources.backend)), ")"));
  }
  if (absl::Status st = CheckEngineSupport(s.resources.backend, EngineConfigFromSpec(s)); !st.ok()) {
    return st;
  }
  if (s.resources.backend == Backend::kCpu) {
    const CpuRankBytes b = CpuBytesPerRank(s);
    const double bytes = b.parameters + b.activations;
    if (bytes > kMaxCpuBytesPerRank) {
      // Named after the larger of the two terms: the model's parameter state or the activations
      // that tokens_per_rank sets.
      const bool model_dominates = b.parameters >= b.activations;
      return Fail(model_dominates ? "model" : "tokens_per_rank",
                  absl::StrFormat("the cpu backend needs ~%.1f GiB per rank (limit %.0f GiB): "
                                  "~%.1f GiB of parameters, gradients and AdamW moments (%d "
                                  "layers, model.hidden %d, model.ffn %d, %d routed + %d shared "
                                  "experts per rank) and ~%.1f GiB of activations "
                                  "(tokens_per_rank %d); use resources.backend cuda or a "
                                  "smaller %s",
                                  bytes / (1 << 30), kMaxCpuBytesPerRank / (1 << 30),
                                  b.parameters / (1 << 30), s.model.layers, s.model.hidden,
                                  s.model.ffn, s.model.experts / s.parallel.ep,
                                  s.model.shared_experts, b.activations / (1 << 30),
                                  s.tokens_per_rank,
                                  model_dominates ? "model" : "tokens_per_rank"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckJobSpecRules(const JobSpec& s) {
  if (!IsValidName(s.name)) {
    return Fail("name", absl::StrCat("must match [a-z0-9][a-z0-9-]{0,62} (got '",
                                     s.name.substr(0, 80), "')"));
  }
  DROPLESS_CHECK(CheckLabels(s));
  DROPLESS_CHECK(CheckRange("priority", s.priority, -kMaxPriority, kMaxPriority));
  DROPLESS_CHECK(CheckRange("max_attempts", s.max_attempts, 1, kMaxAttempts));
  DROPLESS_CHECK(CheckRange("time_limit (seconds)", s.time_limit_seconds, 0, kMaxTimeLimitSeconds));
  DROPLESS_CHECK(CheckModel(s));
  DROPLESS_CHECK(CheckParallel(s));
  DROPLESS_CHECK(CheckRange("tokens_per_rank", s.tokens_per_rank, 1, kMaxTokensPerRank));
  DROPLESS_CHECK(CheckRange("steps", s.steps, 1, kMaxSteps));
  DROPLESS_CHECK(CheckOptimizer(s));
  DROPLESS_CHECK(CheckRange("checkpoint.every", s.checkpoint.every, 0, kMaxSteps));
  if (s.checkpoint.every > 0 && s.checkpoint.dir.empty()) {
    return Fail("checkpoint.every", "needs checkpoint.dir to be set");
  }
  if (s.checkpoint.dir.size() > 4096) return Fail("checkpoint.dir", "must be <= 4096 bytes");
  if (HasControlCharacters(s.checkpoint.dir)) {
    return Fail("checkpoint.dir", "must not contain control characters");
  }
  if (!(s.data.zipf_exponent > 0.0 && s.data.zipf_exponent <= 10.0)) {
    return Fail("data.zipf_exponent",
                absl::StrFormat("must be > 0 and <= 10 (got %g)", s.data.zipf_exponent));
  }
  return CheckPlacementRules(s);
}

}  // namespace dropless::internal

namespace dropless {

absl::Status CheckLabel(absl::string_view path, absl::string_view key, absl::string_view value) {
  if (!internal::IsLabelKey(key)) {
    return internal::Fail(path,
                          "key must be [prefix/]name: a name of up to 63 of [A-Za-z0-9._-], "
                          "alphanumeric at both ends");
  }
  if (!internal::IsLabelName(value, true)) {
    return internal::Fail(path, absl::StrCat("value must be empty or up to 63 of [A-Za-z0-9._-], "
                                             "alphanumeric at both ends (got '",
                                             value.substr(0, 80), "')"));
  }
  return absl::OkStatus();
}

}  // namespace dropless
