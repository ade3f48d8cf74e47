// ParseJobSpec: reads the tree of common/yaml_tree into a JobSpec field by field (types, unknown and
// missing fields), then checks the rules that span fields (job_spec_rules.cc).
#include "common/job_spec.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/job_spec_internal.h"
#include "common/status_macros.h"
#include "common/yaml_tree.h"

namespace dropless {
namespace {

using yaml::Node;

std::string Join(const std::string& path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

absl::Status Invalid(const std::string& path, const Node& at, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: %s (line %d, column %d)", path, what, at.line, at.column));
}

// The text of a scalar as the user wrote it, for "got ..." in messages.
std::string Shown(const Node& n) {
  if (n.kind != Node::Kind::kScalar) return std::string(yaml::KindName(n));
  std::string text = n.scalar.size() > 40 ? n.scalar.substr(0, 40) + "..." : n.scalar;
  return n.quoted ? absl::StrCat("\"", text, "\" (a quoted string)") : absl::StrCat("'", text, "'");
}

// A map whose keys were all checked against the known fields up front, so that a misspelt key is
// reported as unknown rather than as its correct spelling being missing.
class FieldMap {
 public:
  static absl::StatusOr<FieldMap> Open(const Node& node, std::string path,
                                       std::initializer_list<absl::string_view> known) {
    if (node.kind != Node::Kind::kMap) {
      return Invalid(path.empty() ? std::string(yaml::kRootPath) : path, node,
                     absl::StrCat("must be a map of fields, got ", Shown(node)));
    }
    for (size_t i = 0; i < node.map_size(); ++i) {
      const std::string& key = node.key(i).scalar;
      bool found = false;
      for (absl::string_view k : known) found = found || (k == key);
      if (!found) {
        return Invalid(Join(path, key), node.key(i),
                       absl::StrCat("unknown field (known: ", absl::StrJoin(known, ", "), ")"));
      }
    }
    return FieldMap(node, std::move(path));
  }

  // The value of `key`, or nullptr when absent or written as null (null means "not set").
  const Node* Find(absl::string_view key) const {
    for (size_t i = 0; i < node_->map_size(); ++i) {
      if (node_->key(i).scalar == key) {
        const Node& v = node_->value(i);
        return v.kind == Node::Kind::kNull ? nullptr : &v;
      }
    }
    return nullptr;
  }

  absl::StatusOr<const Node*> Require(absl::string_view key) const {
    const Node* v = Find(key);
    if (v == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(PathOf(key), ": is required"));
    }
    return v;
  }

  std::string PathOf(absl::string_view key) const { return Join(path_, key); }

 private:
  FieldMap(const Node& node, std::string path) : node_(&node), path_(std::move(path)) {}
  const Node* node_;
  std::string path_;
};

bool IsDecimalInteger(const std::string& s) {
  size_t i = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
  if (i == s.size()) return false;
  for (size_t j = i; j < s.size(); ++j) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(s[j]))) return false;
  }
  return true;
}

bool IsDecimalNumber(const std::string& s) {
  size_t i = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
  size_t digits = 0;
  while (i < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    size_t exp_digits = 0;
    while (i < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[i]))) ++i, ++exp_digits;
    if (exp_digits == 0) return false;
  }
  return i == s.size();
}

absl::Status ToInt(const Node& n, const std::string& path, int64_t* out) {
  if (n.kind != Node::Kind::kScalar || n.quoted) {
    return Invalid(path, n, absl::StrCat("must be an integer, got ", Shown(n)));
  }
  const std::string& s = n.scalar;
  if (!IsDecimalInteger(s)) {
    if (IsDecimalNumber(s)) {
      return Invalid(path, n, absl::StrCat("must be a whole number, got ", Shown(n)));
    }
    return Invalid(path, n, absl::StrCat("must be a decimal integer, got ", Shown(n)));
  }
  const size_t first_digit = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (s.size() - first_digit > 1 && s[first_digit] == '0') {
    // YAML 1.1 reads 010 as octal 8, YAML 1.2 as 10: refuse rather than guess.
    return Invalid(path, n, absl::StrCat("leading zeros are ambiguous, got ", Shown(n)));
  }
  errno = 0;
  long long v = std::strtoll(s.c_str(), nullptr, 10);
  if (errno == ERANGE) return Invalid(path, n, "integer out of range");
  *out = v;
  return absl::OkStatus();
}

absl::Status ToInt32(const Node& n, const std::string& path, int32_t* out) {
  int64_t v = 0;
  DROPLESS_RETURN_IF_ERROR(ToInt(n, path, &v));
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
    return Invalid(path, n, "integer out of range");
  }
  *out = static_cast<int32_t>(v);
  return absl::OkStatus();
}

absl::Status ToUint64(const Node& n, const std::string& path, uint64_t* out) {
  if (n.kind == Node::Kind::kScalar && !n.quoted && !n.scalar.empty() && n.scalar[0] == '-') {
    return Invalid(path, n, absl::StrCat("must be >= 0, got ", Shown(n)));
  }
  int64_t probe = 0;
  absl::Status st = ToInt(n, path, &probe);  // type and syntax checks; the range is wider
  if (!st.ok() && !absl::StrContains(st.message(), "out of range")) return st;
  errno = 0;
  unsigned long long v = std::strtoull(n.scalar.c_str(), nullptr, 10);
  if (errno == ERANGE) return Invalid(path, n, "integer out of range");
  *out = v;
  return absl::OkStatus();
}

absl::Status ToDouble(const Node& n, const std::string& path, double* out) {
  if (n.kind != Node::Kind::kScalar || n.quoted || !IsDecimalNumber(n.scalar)) {
    return Invalid(path, n, absl::StrCat("must be a finite number, got ", Shown(n)));
  }
  double v = std::strtod(n.scalar.c_str(), nullptr);
  if (!std::isfinite(v)) return Invalid(path, n, "number out of range");
  *out = v;
  return absl::OkStatus();
}

absl::Status ToBool(const Node& n, const std::string& path, bool* out) {
  if (n.kind == Node::Kind::kScalar && !n.quoted) {
    const std::string lower = absl::AsciiStrToLower(n.scalar);
    if (lower == "true") return (*out = true), absl::OkStatus();
    if (lower == "false") return (*out = false), absl::OkStatus();
    if (lower == "yes" || lower == "no" || lower == "on" || lower == "off" || lower == "y" ||
        lower == "n") {
      return Invalid(path, n, absl::StrCat("must be true or false, got ", Shown(n),
                                           " (YAML 1.1 yes/no/on/off are ambiguous)"));
    }
  }
  return Invalid(path, n, absl::StrCat("must be true or false, got ", Shown(n)));
}

absl::Status ToText(const Node& n, const std::string& path, std::string* out) {
  if (n.kind != Node::Kind::kScalar) {
    return Invalid(path, n, absl::StrCat("must be a string, got ", Shown(n)));
  }
  *out = n.scalar;
  return absl::OkStatus();
}

template <typename Enum>
absl::Status ToEnum(const Node& n, const std::string& path,
                    const std::vector<std::pair<std::string_view, Enum>>& names, Enum* out) {
  std::string s;
  DROPLESS_RETURN_IF_ERROR(ToText(n, path, &s));
  std::vector<std::string> choices;
  for (const auto& [name, value] : names) {
    if (name == s) return (*out = value), absl::OkStatus();
    choices.emplace_back(name);
  }
  return Invalid(path, n, absl::StrCat("must be one of ", absl::StrJoin(choices, " | "), ", got ",
                                       Shown(n)));
}

// Optional-field readers: leave *out at its default when the field is absent.
template <typename T, typename Conv>
absl::Status Optional(const FieldMap& m, absl::string_view key, T* out, Conv conv) {
  const Node* v = m.Find(key);
  return v == nullptr ? absl::OkStatus() : conv(*v, m.PathOf(key), out);
}
template <typename T, typename Conv>
absl::Status Required(const FieldMap& m, absl::string_view key, T* out, Conv conv) {
  absl::StatusOr<const Node*> v = m.Require(key);
  if (!v.ok()) return v.status();
  return conv(**v, m.PathOf(key), out);
}

absl::Status ReadModel(const Node& node, ModelSpec* model) {
  absl::StatusOr<FieldMap> m =
      FieldMap::Open(node, "model",
                     {"hidden", "ffn", "experts", "topk", "shared_experts", "layers", "router",
                      "renormalize", "activation", "aux_loss_coeff"});
  if (!m.ok()) return m.status();
  DROPLESS_RETURN_IF_ERROR(Required(*m, "hidden", &model->hidden, ToInt));
  DROPLESS_RETURN_IF_ERROR(Required(*m, "ffn", &model->ffn, ToInt));
  DROPLESS_RETURN_IF_ERROR(Required(*m, "experts", &model->experts, ToInt));
  DROPLESS_RETURN_IF_ERROR(Required(*m, "topk", &model->topk, ToInt));
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "shared_experts", &model->shared_experts, ToInt));
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "layers", &model->layers, ToInt));
  auto router = [](const Node& n, const std::string& p, RouterKind* o) {
    return ToEnum<RouterKind>(n, p, internal::kRouterNames, o);
  };
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "router", &model->router, router));
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "renormalize", &model->renormalize, ToBool));
  auto activation = [](const Node& n, const std::string& p, Activation* o) {
    return ToEnum<Activation>(n, p, internal::kActivationNames, o);
  };
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "activation", &model->activation, activation));
  return Optional(*m, "aux_loss_coeff", &model->aux_loss_coeff, ToDouble);
}

absl::Status ReadParallel(const Node& node, ParallelSpec* parallel) {
  absl::StatusOr<FieldMap> m = FieldMap::Open(node, "parallel", {"ep", "dp"});
  if (!m.ok()) return m.status();
  DROPLESS_RETURN_IF_ERROR(Required(*m, "ep", &parallel->ep, ToInt));
  return Optional(*m, "dp", &parallel->dp, ToInt);
}

absl::Status ReadBetas(const Node& n, const std::string& path, OptimizerSpec* opt) {
  if (n.kind != Node::Kind::kSequence || n.items.size() != 2) {
    return Invalid(path, n, absl::StrCat("must be a list of two numbers [beta1, beta2], got ",
                                         n.kind == Node::Kind::kSequence
                                             ? absl::StrCat("a list of ", n.items.size())
                                             : Shown(n)));
  }
  DROPLESS_RETURN_IF_ERROR(ToDouble(n.items[0], path + "[0]", &opt->beta1));
  return ToDouble(n.items[1], path + "[1]", &opt->beta2);
}

absl::Status ReadOptimizer(const Node& node, OptimizerSpec* opt) {
  absl::StatusOr<FieldMap> m = FieldMap::Open(
      node, "optimizer", {"name", "lr", "betas", "eps", "weight_decay", "warmup", "moment_dtype"});
  if (!m.ok()) return m.status();
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "name", &opt->name, ToText));
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "lr", &opt->lr, ToDouble));
  if (const Node* betas = m->Find("betas")) {
    DROPLESS_RETURN_IF_ERROR(ReadBetas(*betas, m->PathOf("betas"), opt));
  }
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "eps", &opt->eps, ToDouble));
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "weight_decay", &opt->weight_decay, ToDouble));
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "warmup", &opt->warmup_steps, ToInt));
  auto moment_dtype = [](const Node& n, const std::string& p, MomentDtype* o) {
    return ToEnum<MomentDtype>(n, p, internal::kMomentDtypeNames, o);
  };
  return Optional(*m, "moment_dtype", &opt->moment_dtype, moment_dtype);
}

absl::Status ReadCheckpoint(const Node& node, CheckpointSpec* ckpt) {
  absl::StatusOr<FieldMap> m = FieldMap::Open(node, "checkpoint", {"dir", "every"});
  if (!m.ok()) return m.status();
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "dir", &ckpt->dir, ToText));
  return Optional(*m, "every", &ckpt->every, ToInt);
}

absl::Status ReadData(const Node& node, DataSpec* data) {
  absl::StatusOr<FieldMap> m =
      FieldMap::Open(node, "data", {"distribution", "zipf_exponent", "seed"});
  if (!m.ok()) return m.status();
  auto dist = [](const Node& n, const std::string& p, RoutingDistribution* o) {
    return ToEnum<RoutingDistribution>(n, p, internal::kDistributionNames, o);
  };
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "distribution", &data->distribution, dist));
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "zipf_exponent", &data->zipf_exponent, ToDouble));
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "seed", &data->seed, ToUint64));
  // The exponent shapes zipf routing only. Elsewhere it is dropped (a submitted spec that sets it
  // is refused, CheckSubmittedOnly; specs stored before that rule still parse), so that the
  // canonical YAML, which writes it for zipf only, reads back to the same spec.
  if (data->distribution != RoutingDistribution::kZipf)
    data->zipf_exponent = DataSpec{}.zipf_exponent;
  return absl::OkStatus();
}

absl::Status ReadResources(const Node& node, ResourcesSpec* res) {
  absl::StatusOr<FieldMap> m = FieldMap::Open(node, "resources", {"backend"});
  if (!m.ok()) return m.status();
  auto backend = [](const Node& n, const std::string& p, Backend* o) {
    return ToEnum<Backend>(n, p, internal::kBackendNames, o);
  };
  return Optional(*m, "backend", &res->backend, backend);
}

absl::Status ReadLabels(const Node& node, const std::string& path,
                        std::map<std::string, std::string>* labels) {
  if (node.kind != Node::Kind::kMap) {
    return Invalid(path, node, absl::StrCat("must be a map of key: value, got ", Shown(node)));
  }
  for (size_t i = 0; i < node.map_size(); ++i) {
    const std::string& key = node.key(i).scalar;
    std::string value;
    DROPLESS_RETURN_IF_ERROR(ToText(node.value(i), Join(path, key), &value));
    (*labels)[key] = value;
  }
  return absl::OkStatus();
}

// A duration as absl::ParseDuration reads it ("90m", "2h30m", "3600s"), in whole seconds.
absl::Status ReadDurationSeconds(const Node& n, const std::string& path, int64_t* seconds) {
  std::string text;
  DROPLESS_RETURN_IF_ERROR(ToText(n, path, &text));
  absl::Duration d;
  if (!absl::ParseDuration(text, &d) || d == absl::InfiniteDuration()) {
    return Invalid(path, n,
                   absl::StrCat("must be a duration such as 90m or 2h30m, got ", Shown(n)));
  }
  if (d <= absl::ZeroDuration() || d != absl::Seconds(absl::ToInt64Seconds(d))) {
    return Invalid(path, n,
                   absl::StrCat("must be a positive whole number of seconds, got ", Shown(n)));
  }
  *seconds = absl::ToInt64Seconds(d);
  return absl::OkStatus();
}

// Sections that are maps of their own: absent means "all defaults", except where required.
template <typename T>
absl::Status Section(const FieldMap& m, absl::string_view key, bool required, T* out,
                     absl::Status (*read)(const Node&, T*)) {
  const Node* v = m.Find(key);
  if (v == nullptr) {
    return required ? absl::InvalidArgumentError(absl::StrCat(key, ": is required"))
                    : absl::OkStatus();
  }
  return read(*v, out);
}

absl::StatusOr<JobSpec> ReadJobSpec(const Node& root) {
  absl::StatusOr<FieldMap> m = FieldMap::Open(
      root, "",
      {"name", "labels", "priority", "max_attempts", "time_limit", "model", "parallel",
       "precision", "tokens_per_rank", "steps", "optimizer", "dispatcher", "overlap",
       "activation_offload", "checkpoint", "data", "resources"});
  if (!m.ok()) return m.status();
  JobSpec spec;
  DROPLESS_RETURN_IF_ERROR(Required(*m, "name", &spec.name, ToText));
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "labels", &spec.labels, ReadLabels));
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "priority", &spec.priority, ToInt32));
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "max_attempts", &spec.max_attempts, ToInt32));
  DROPLESS_RETURN_IF_ERROR(
      Optional(*m, "time_limit", &spec.time_limit_seconds, ReadDurationSeconds));
  DROPLESS_RETURN_IF_ERROR(Section(*m, "model", true, &spec.model, ReadModel));
  DROPLESS_RETURN_IF_ERROR(Section(*m, "parallel", true, &spec.parallel, ReadParallel));
  auto precision = [](const Node& n, const std::string& p, Precision* o) {
    return ToEnum<Precision>(n, p, internal::kPrecisionNames, o);
  };
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "precision", &spec.precision, precision));
  DROPLESS_RETURN_IF_ERROR(Required(*m, "tokens_per_rank", &spec.tokens_per_rank, ToInt));
  DROPLESS_RETURN_IF_ERROR(Required(*m, "steps", &spec.steps, ToInt));
  DROPLESS_RETURN_IF_ERROR(Section(*m, "optimizer", false, &spec.optimizer, ReadOptimizer));
  auto dispatcher = [](const Node& n, const std::string& p, Dispatcher* o) {
    return ToEnum<Dispatcher>(n, p, internal::kDispatcherNames, o);
  };
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "dispatcher", &spec.dispatcher, dispatcher));
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "overlap", &spec.overlap, ToBool));
  DROPLESS_RETURN_IF_ERROR(Optional(*m, "activation_offload", &spec.activation_offload, ToBool));
  DROPLESS_RETURN_IF_ERROR(Section(*m, "checkpoint", false, &spec.checkpoint, ReadCheckpoint));
  DROPLESS_RETURN_IF_ERROR(Section(*m, "data", false, &spec.data, ReadData));
  DROPLESS_RETURN_IF_ERROR(Section(*m, "resources", false, &spec.resources, ReadResources));
  return spec;
}

// Rules for a spec as a user submits it, not for one already stored (which every rank parses
// again, and which an older coordinator may have written): fields that are set but cannot apply.
absl::Status CheckSubmittedOnly(const Node& root, const JobSpec& spec) {
  // A relative path would be resolved against each worker daemon's working directory. (Specs
  // stored before this rule keep their relative dir.)
  if (!spec.checkpoint.dir.empty() && spec.checkpoint.dir[0] != '/') {
    const Node* checkpoint = nullptr;
    for (size_t i = 0; root.kind == Node::Kind::kMap && i < root.map_size(); ++i) {
      if (root.key(i).scalar == "checkpoint") checkpoint = &root.value(i);
    }
    return Invalid(
        "checkpoint.dir", checkpoint != nullptr ? *checkpoint : root,
        absl::StrCat("must be an absolute path (got \"", spec.checkpoint.dir.substr(0, 80),
                     "\"): a relative one would be resolved on each worker"));
  }
  auto find = [](const Node& map, absl::string_view key) -> const Node* {
    if (map.kind != Node::Kind::kMap) return nullptr;
    for (size_t i = 0; i < map.map_size(); ++i) {
      if (map.key(i).scalar == key && map.value(i).kind != Node::Kind::kNull) return &map.value(i);
    }
    return nullptr;
  };
  const Node* data = find(root, "data");
  const Node* exponent = data != nullptr ? find(*data, "zipf_exponent") : nullptr;
  if (exponent != nullptr) {
    const Node* distribution = find(*data, "distribution");
    if (distribution == nullptr || distribution->scalar != "zipf") {
      return Invalid("data.zipf_exponent", *exponent,
                     absl::StrCat("applies only with data.distribution: zipf (the distribution "
                                  "here is ",
                                  distribution != nullptr ? distribution->scalar : "uniform",
                                  "); remove it or choose zipf"));
    }
  }
  return absl::OkStatus();
}

// Parse and validate; `submitted` adds the rules for a spec as a user submits it.
absl::StatusOr<JobSpec> ParseSpec(std::string_view yaml_text, bool submitted) {
  absl::StatusOr<Node> root = yaml::LoadSingleDocument(yaml_text, kMaxJobSpecBytes);
  if (!root.ok()) return root.status();
  absl::StatusOr<JobSpec> spec = ReadJobSpec(*root);
  if (!spec.ok()) return spec.status();
  DROPLESS_RETURN_IF_ERROR(internal::CheckJobSpecRules(*spec));
  if (submitted) DROPLESS_RETURN_IF_ERROR(CheckSubmittedOnly(*root, *spec));
  return spec;
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(std::string_view yaml_text) {
  return ParseSpec(yaml_text, /*submitted=*/false);
}

absl::StatusOr<JobSpec> ParseSubmittedJobSpec(std::string_view yaml_text) {
  return ParseSpec(yaml_text, /*submitted=*/true);
}

absl::Status ApplyJobSpecOverrides(const JobSpecOverrides& overrides, JobSpec* spec) {
  JobSpec overridden = *spec;
  if (overrides.name.has_value()) overridden.name = *overrides.name;
  if (overrides.priority.has_value()) overridden.priority = *overrides.priority;
  DROPLESS_RETURN_IF_ERROR(internal::CheckJobSpecRules(overridden));
  *spec = std::move(overridden);
  return absl::OkStatus();
}

}  // namespace dropless
