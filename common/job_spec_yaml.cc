// JobSpecToYaml and the enum names: the canonical text of a spec, every field written out, so that
// the coordinator stores (and a rank reads) exactly what was validated.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/job_spec_internal.h"

namespace dropless {
namespace {

template <typename Enum>
std::string_view NameOf(const std::vector<std::pair<std::string_view, Enum>>& names, Enum v) {
  for (const auto& [name, value] : names) {
    if (value == v) return name;
  }
  return "?";
}

// Shortest decimal that reads back to the same double, always in the plain-number syntax the
// parser accepts (no inf/nan: validation rejects them).
std::string Number(double v) {
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// YAML double-quoted string; the spec's strings have no control characters (validated).
std::string Quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// absl::string_view is not std::string_view in this abseil build.
std::string Str(std::string_view v) { return std::string(v); }

const char* Bool(bool b) { return b ? "true" : "false"; }

}  // namespace

std::string_view ToString(RouterKind v) { return NameOf(internal::kRouterNames, v); }
std::string_view ToString(Precision v) { return NameOf(internal::kPrecisionNames, v); }
std::string_view ToString(Dispatcher v) { return NameOf(internal::kDispatcherNames, v); }
std::string_view ToString(RoutingDistribution v) { return NameOf(internal::kDistributionNames, v); }
std::string_view ToString(Backend v) { return NameOf(internal::kBackendNames, v); }
std::string_view ToString(MomentDtype v) { return NameOf(internal::kMomentDtypeNames, v); }

std::string JobSpecToYaml(const JobSpec& s) {
  const ModelSpec& m = s.model;
  const OptimizerSpec& o = s.optimizer;
  std::string out;
  // Quoted: a name such as null, true or 123 would read back as another type.
  absl::StrAppend(&out, "name: ", Quoted(s.name), "\n",
                  "labels:", s.labels.empty() ? " {}\n" : "\n");
  for (const auto& [key, value] : s.labels) {
    absl::StrAppend(&out, "  ", Quoted(key), ": ", Quoted(value), "\n");
  }
  absl::StrAppend(&out, "priority: ", s.priority, "\n", "max_attempts: ", s.max_attempts, "\n",
                  "time_limit: ",
                  s.time_limit_seconds > 0 ? absl::StrCat(s.time_limit_seconds, "s") : "null", "\n");
  absl::StrAppend(&out, "model:\n", "  hidden: ", m.hidden, "\n", "  ffn: ", m.ffn, "\n",
                  "  experts: ", m.experts, "\n", "  topk: ", m.topk, "\n",
                  "  shared_experts: ", m.shared_experts, "\n", "  layers: ", m.layers, "\n");
  absl::StrAppend(&out, "  router: ", Str(ToString(m.router)), "\n", "  renormalize: ", Bool(m.renormalize),
                  "\n", "  activation: ", Str(NameOf(internal::kActivationNames, m.activation)), "\n",
                  "  aux_loss_coeff: ", Number(m.aux_loss_coeff), "\n");
  absl::StrAppend(&out, "parallel:\n", "  ep: ", s.parallel.ep, "\n", "  dp: ", s.parallel.dp,
                  "\n");
  absl::StrAppend(&out, "precision: ", Str(ToString(s.precision)), "\n",
                  "tokens_per_rank: ", s.tokens_per_rank, "\n", "steps: ", s.steps, "\n");
  absl::StrAppend(&out, "optimizer:\n", "  name: ", o.name, "\n", "  lr: ", Number(o.lr), "\n",
                  "  betas: [", Number(o.beta1), ", ", Number(o.beta2), "]\n",
                  "  eps: ", Number(o.eps), "\n", "  weight_decay: ", Number(o.weight_decay), "\n",
                  "  warmup: ", o.warmup_steps, "\n");
  // Only when not the default, so that a spec stored by this coordinator stays readable by the
  // ranks of the release before the field (a rolling upgrade).
  if (o.moment_dtype != MomentDtype::kFp32) {
    absl::StrAppend(&out, "  moment_dtype: ", Str(ToString(o.moment_dtype)), "\n");
  }
  absl::StrAppend(&out, "dispatcher: ", Str(ToString(s.dispatcher)), "\n",
                  "overlap: ", Bool(s.overlap), "\n",
                  "activation_offload: ", Bool(s.activation_offload), "\n");
  absl::StrAppend(&out, "checkpoint:\n", "  dir: ", Quoted(s.checkpoint.dir), "\n",
                  "  every: ", s.checkpoint.every, "\n");
  absl::StrAppend(&out, "data:\n", "  distribution: ", Str(ToString(s.data.distribution)), "\n");
  if (s.data.distribution == RoutingDistribution::kZipf) {
    absl::StrAppend(&out, "  zipf_exponent: ", Number(s.data.zipf_exponent), "\n");
  }
  absl::StrAppend(&out, "  seed: ", s.data.seed, "\n");
  absl::StrAppend(&out, "resources:\n", "  backend: ", Str(ToString(s.resources.backend)), "\n");
  return out;
}

}  // namespace dropless
