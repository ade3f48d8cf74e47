// ParseJobSpec: every rejection names the field path and the rule; valid specs round-trip.
#include "common/job_spec.h"

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A valid spec with one field per line, so that a case can swap exactly one line.
constexpr char kBase[] = R"(name: base-job
priority: 0
max_attempts: 1
model:
  hidden: 64
  ffn: 128
  experts: 8
  topk: 2
  shared_experts: 0
  layers: 1
  router: softmax
  renormalize: true
  activation: swiglu
  aux_loss_coeff: 0.01
parallel:
  ep: 2
  dp: 1
precision: bf16
tokens_per_rank: 256
steps: 40
optimizer:
  name: adamw
  lr: 0.003
  betas: [0.9, 0.999]
  eps: 1.0e-8
  weight_decay: 0.0
  warmup: 5
dispatcher: auto
overlap: false
activation_offload: false
checkpoint:
  dir: ""
  every: 0
data:
  distribution: uniform
  zipf_exponent: 1.1
  seed: 1234
resources:
  backend: cpu
)";

// kBase with `from` (a whole line, found exactly once) replaced by `to` ("" deletes it).
std::string With(const std::string& from, const std::string& to) {
  std::string base = kBase;
  const std::string line = from + "\n";
  size_t at = base.find(line);
  EXPECT_NE(at, std::string::npos) << "no line '" << from << "' in the base spec";
  EXPECT_EQ(base.find(line, at + 1), std::string::npos) << "line '" << from << "' is not unique";
  if (at == std::string::npos) return base;
  return base.replace(at, line.size(), to.empty() ? "" : to + "\n");
}

// kBase with several whole lines replaced.
std::string WithAll(const std::vector<std::pair<std::string, std::string>>& edits) {
  std::string out = kBase;
  for (const auto& [from, to] : edits) {
    size_t at = out.find(from + "\n");
    EXPECT_NE(at, std::string::npos) << "no line '" << from << "'";
    if (at != std::string::npos) out.replace(at, from.size() + 1, to.empty() ? "" : to + "\n");
  }
  return out;
}

struct BadCase {
  std::string label;
  std::string yaml;
  std::string field;  // the message starts with "<field>: "
  std::string rule;   // and contains this
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.label; }

std::vector<BadCase> BadCases() {
  return {
      // Labels and time limit.
      {"labels_not_a_map", With("priority: 0", "labels: [a, b]\npriority: 0"), "labels",
       "must be a map of key: value"},
      {"label_value_a_map", With("priority: 0", "labels: {team: {a: 1}}\npriority: 0"),
       "labels.team", "must be a string"},
      {"label_key_bad", With("priority: 0", "labels: {\"-team\": x}\npriority: 0"), "labels.-team",
       "key must be [prefix/]name"},
      {"label_value_bad", With("priority: 0", "labels: {team: \"a b\"}\npriority: 0"),
       "labels.team", "value must be empty or up to 63"},
      {"time_limit_not_a_duration", With("priority: 0", "time_limit: soon\npriority: 0"),
       "time_limit", "must be a duration such as 90m or 2h30m, got 'soon'"},
      {"time_limit_negative", With("priority: 0", "time_limit: -5m\npriority: 0"), "time_limit",
       "must be a positive whole number of seconds"},
      {"time_limit_fraction", With("priority: 0", "time_limit: 1.5s\npriority: 0"), "time_limit",
       "must be a positive whole number of seconds"},
      {"time_limit_too_long", With("priority: 0", "time_limit: 9000h\npriority: 0"),
       "time_limit (seconds)", "must be <= 31622400"},
      // Cross-field rules.
      {"experts_not_divisible_by_ep", With("  experts: 8", "  experts: 9"), "model.experts",
       "must be divisible by parallel.ep (got 9 % 2 != 0)"},
      {"ep_3_experts_64", WithAll({{"  experts: 8", "  experts: 64"}, {"  ep: 2", "  ep: 3"}}),
       "model.experts", "must be divisible by parallel.ep (got 64 % 3 != 0)"},
      {"topk_above_experts", With("  topk: 2", "  topk: 10"), "model.topk",
       "must be <= model.experts (got 10 > 8)"},
      {"topk_above_16", WithAll({{"  experts: 8", "  experts: 64"}, {"  topk: 2", "  topk: 17"}}),
       "model.topk", "must be <= 16 (got 17)"},
      {"nccl_on_cpu", With("dispatcher: auto", "dispatcher: nccl-a2a"), "dispatcher",
       "nccl-a2a needs resources.backend cuda (got cpu)"},
      {"nccl_lsa_on_cpu", With("dispatcher: auto", "dispatcher: nccl-lsa"), "dispatcher",
       "needs resources.backend cuda"},
      {"nccl_ep_on_cpu", With("dispatcher: auto", "dispatcher: nccl-ep"), "dispatcher",
       "needs resources.backend cuda"},
      // Quantized precisions run on the cuda backend only; its engine's alignment rules name the
      // field and the precision.
      {"mxfp8_on_cpu_names_precision_first",
       WithAll({{"precision: bf16", "precision: mxfp8"}, {"  hidden: 64", "  hidden: 48"}}),
       "precision", "mxfp8 needs resources.backend cuda"},
      {"mxfp8_hidden",
       WithAll({{"precision: bf16", "precision: mxfp8"}, {"  hidden: 64", "  hidden: 48"},
                {"  backend: cpu", "  backend: cuda"}}),
       "model.hidden", "the cuda engine needs a multiple of 32 with precision mxfp8 (got 48)"},
      {"mxfp8_ffn",
       WithAll({{"precision: bf16", "precision: mxfp8"}, {"  ffn: 128", "  ffn: 100"},
                {"  backend: cpu", "  backend: cuda"}}),
       "model.ffn", "the cuda engine needs a multiple of 32 with precision mxfp8 (got 100)"},
      // At ep 2 the mxfp8 tokens travel with hidden / 32 scale bytes, moved in 4-byte words.
      {"mxfp8_exchange_hidden",
       WithAll({{"precision: bf16", "precision: mxfp8"}, {"  hidden: 64", "  hidden: 160"},
                {"  backend: cpu", "  backend: cuda"}}),
       "model.hidden", "with precision mxfp8 and an EP exchange (parallel.ep 2, dispatcher auto)"},
      {"mxfp8_nccl_dispatcher_at_ep1_hidden",
       WithAll({{"precision: bf16", "precision: mxfp8"}, {"  hidden: 64", "  hidden: 160"},
                {"  ep: 2", "  ep: 1"}, {"dispatcher: auto", "dispatcher: nccl-a2a"},
                {"  backend: cpu", "  backend: cuda"}}),
       "model.hidden", "the cuda engine needs a multiple of 128 (got 160)"},
      {"fp8_block_hidden",
       WithAll({{"precision: bf16", "precision: fp8-block"}, {"  hidden: 64", "  hidden: 192"},
                {"  backend: cpu", "  backend: cuda"}}),
       "model.hidden", "the cuda engine needs a multiple of 128 with precision fp8-block (got 192)"},
      {"fp8_block_wgrad128_ffn",
       WithAll({{"precision: bf16", "precision: fp8-block-wgrad128"},
                {"  hidden: 64", "  hidden: 128"},
                {"  ffn: 128", "  ffn: 64"},
                {"  backend: cpu", "  backend: cuda"}}),
       "model.ffn",
       "the cuda engine needs a multiple of 128 with precision fp8-block-wgrad128 (got 64)"},
      {"checkpoint_every_without_dir", With("  every: 0", "  every: 10"), "checkpoint.every",
       "needs checkpoint.dir"},
      // Sizes: zero, negative, too large.
      {"hidden_zero", With("  hidden: 64", "  hidden: 0"), "model.hidden", "must be >= 1 (got 0)"},
      {"ffn_negative", With("  ffn: 128", "  ffn: -128"), "model.ffn", "must be >= 1 (got -128)"},
      {"experts_zero", With("  experts: 8", "  experts: 0"), "model.experts", "must be >= 1"},
      {"experts_above_1024", With("  experts: 8", "  experts: 2048"), "model.experts",
       "must be <= 1024 (got 2048)"},
      {"topk_zero", With("  topk: 2", "  topk: 0"), "model.topk", "must be >= 1"},
      {"shared_negative", With("  shared_experts: 0", "  shared_experts: -1"),
       "model.shared_experts", "must be >= 0"},
      {"layers_zero", With("  layers: 1", "  layers: 0"), "model.layers", "must be >= 1"},
      {"ep_zero", With("  ep: 2", "  ep: 0"), "parallel.ep", "must be >= 1 (got 0)"},
      {"dp_negative", With("  dp: 1", "  dp: -2"), "parallel.dp", "must be >= 1"},
      {"tokens_zero", With("tokens_per_rank: 256", "tokens_per_rank: 0"), "tokens_per_rank",
       "must be >= 1"},
      {"tokens_huge", With("tokens_per_rank: 256", "tokens_per_rank: 100000000"), "tokens_per_rank",
       "must be <= 1048576"},
      {"steps_negative", With("steps: 40", "steps: -1"), "steps", "must be >= 1"},
      {"hidden_huge", With("  hidden: 64", "  hidden: 1000000"), "model.hidden",
       "must be <= 65536"},
      // The cpu backend's memory bound names the larger term: the model's parameter state here,
      // the activations of tokens_per_rank below.
      {"cpu_memory_bound_by_the_model",
       WithAll({{"  hidden: 64", "  hidden: 16384"},
                {"  ffn: 128", "  ffn: 65536"},
                {"  experts: 8", "  experts: 64"}}),
       "model", "the cpu backend needs ~"},
      {"cpu_memory_bound_by_tokens",
       WithAll({{"  hidden: 64", "  hidden: 1024"},
                {"  ffn: 128", "  ffn: 1024"},
                {"tokens_per_rank: 256", "tokens_per_rank: 1048576"}}),
       "tokens_per_rank", "of activations (tokens_per_rank 1048576); use resources.backend cuda "
                          "or a smaller tokens_per_rank"},
      {"max_attempts_zero", With("max_attempts: 1", "max_attempts: 0"), "max_attempts",
       "must be >= 1"},
      {"priority_out_of_range", With("priority: 0", "priority: 5000"), "priority",
       "must be <= 1000"},
      // Optimizer.
      {"lr_zero", With("  lr: 0.003", "  lr: 0"), "optimizer.lr", "must be > 0"},
      {"lr_negative", With("  lr: 0.003", "  lr: -0.1"), "optimizer.lr", "must be > 0"},
      {"beta2_one", With("  betas: [0.9, 0.999]", "  betas: [0.9, 1.0]"), "optimizer.betas[1]",
       "must be in [0, 1)"},
      {"beta1_negative", With("  betas: [0.9, 0.999]", "  betas: [-0.1, 0.999]"),
       "optimizer.betas[0]", "must be in [0, 1)"},
      {"betas_three", With("  betas: [0.9, 0.999]", "  betas: [0.9, 0.99, 0.999]"),
       "optimizer.betas", "list of two numbers"},
      {"betas_string", With("  betas: [0.9, 0.999]", "  betas: [0.9, high]"), "optimizer.betas[1]",
       "must be a finite number, got 'high'"},
      {"eps_zero", With("  eps: 1.0e-8", "  eps: 0"), "optimizer.eps", "must be > 0"},
      {"optimizer_sgd", With("  name: adamw", "  name: sgd"), "optimizer.name", "must be adamw"},
      {"weight_decay_negative", With("  weight_decay: 0.0", "  weight_decay: -1"),
       "optimizer.weight_decay", "must be in [0, 1]"},
      {"warmup_negative", With("  warmup: 5", "  warmup: -5"), "optimizer.warmup", "must be >= 0"},
      {"zipf_zero",
       absl::StrReplaceAll(kBase, {{"  zipf_exponent: 1.1\n", "  zipf_exponent: 0\n"},
                                   {"  distribution: uniform\n", "  distribution: zipf\n"}}),
       "data.zipf_exponent", "must be > 0"},
      {"seed_negative", With("  seed: 1234", "  seed: -1"), "data.seed", "must be >= 0"},
      // Names and enums.
      {"name_upper", With("name: base-job", "name: Base-Job"), "name",
       "must match [a-z0-9][a-z0-9-]{0,62}"},
      {"name_leading_dash", With("name: base-job", "name: -job"), "name", "must match"},
      {"name_too_long", With("name: base-job", "name: " + std::string(64, 'a')), "name",
       "must match"},
      {"name_empty", With("name: base-job", "name: \"\""), "name", "must match"},
      {"router_unknown", With("  router: softmax", "  router: tanh"), "model.router",
       "must be one of softmax | sigmoid, got 'tanh'"},
      {"precision_unknown", With("precision: bf16", "precision: fp8"), "precision",
       "must be one of bf16 | mxfp8 | fp8-block | fp8-block-wgrad128"},
      {"dispatcher_unknown", With("dispatcher: auto", "dispatcher: mpi"), "dispatcher",
       "must be one of auto | gloo | nccl-a2a | nccl-lsa | nccl-ep"},
      {"backend_unknown", With("  backend: cpu", "  backend: tpu"), "resources.backend",
       "must be one of cpu | cuda"},
      {"distribution_unknown", With("  distribution: uniform", "  distribution: normal"),
       "data.distribution", "must be one of uniform | zipf"},
      {"activation_unknown", With("  activation: swiglu", "  activation: gelu"), "model.activation",
       "must be one of swiglu"},
      {"moment_dtype_unknown", With("  warmup: 5", "  warmup: 5\n  moment_dtype: fp16"),
       "optimizer.moment_dtype", "must be one of fp32 | bf16, got 'fp16'"},
      {"moment_dtype_not_a_string", With("  warmup: 5", "  warmup: 5\n  moment_dtype: [bf16]"),
       "optimizer.moment_dtype", "must be a string, got list"},
      // Unknown fields, at every level.
      {"unknown_top", With("steps: 40", "steps: 40\nstep: 40"), "step", "unknown field"},
      {"unknown_model", With("  topk: 2", "  topk: 2\n  top_k: 2"), "model.top_k", "unknown field"},
      {"misspelt_required", With("  hidden: 64", "  hiden: 64"), "model.hiden", "unknown field"},
      {"unknown_optimizer", With("  lr: 0.003", "  lr: 0.003\n  momentum: 0.9"),
       "optimizer.momentum", "unknown field"},
      {"unknown_parallel", With("  dp: 1", "  dp: 1\n  tp: 2"), "parallel.tp", "unknown field"},
      {"unknown_checkpoint", With("  every: 0", "  every: 0\n  keep: 3"), "checkpoint.keep",
       "unknown field"},
      {"unknown_data", With("  seed: 1234", "  seed: 1234\n  skew: 2"), "data.skew",
       "unknown field"},
      {"unknown_resources", With("  backend: cpu", "  backend: cpu\n  gpus: 8"), "resources.gpus",
       "unknown field"},
      // Wrong types.
      {"string_for_int", With("  hidden: 64", "  hidden: sixty-four"), "model.hidden",
       "must be a decimal integer, got 'sixty-four'"},
      {"quoted_int", With("  hidden: 64", "  hidden: \"64\""), "model.hidden",
       "must be an integer, got \"64\" (a quoted string)"},
      {"float_for_int", With("  experts: 8", "  experts: 8.0"), "model.experts",
       "must be a whole number, got '8.0'"},
      {"exponent_for_int", With("steps: 40", "steps: 4e1"), "steps", "must be a whole number"},
      {"hex_int", With("steps: 40", "steps: 0x28"), "steps", "must be a decimal integer"},
      {"octal_looking_int", With("steps: 40", "steps: 040"), "steps", "leading zeros"},
      {"int_overflow", With("steps: 40", "steps: 99999999999999999999999"), "steps",
       "out of range"},
      {"list_for_int", With("  topk: 2", "  topk: [2]"), "model.topk",
       "must be an integer, got list"},
      {"list_for_map", With("parallel:\n  ep: 2\n  dp: 1", "parallel: [2, 1]"), "parallel",
       "must be a map of fields, got list"},
      {"scalar_for_map", With("resources:\n  backend: cpu", "resources: cpu"), "resources",
       "must be a map of fields, got 'cpu'"},
      {"map_for_string", With("dispatcher: auto", "dispatcher: {kind: auto}"), "dispatcher",
       "must be a string, got map"},
      {"yes_for_bool", With("overlap: false", "overlap: yes"), "overlap",
       "must be true or false, got 'yes' (YAML 1.1 yes/no/on/off are ambiguous)"},
      {"off_for_bool", With("  renormalize: true", "  renormalize: off"), "model.renormalize",
       "ambiguous"},
      {"quoted_bool", With("activation_offload: false", "activation_offload: \"false\""),
       "activation_offload", "must be true or false"},
      {"int_for_bool", With("overlap: false", "overlap: 1"), "overlap", "must be true or false"},
      {"nan_for_double", With("  lr: 0.003", "  lr: .nan"), "optimizer.lr",
       "must be a finite number, got '.nan'"},
      {"inf_for_double", With("  lr: 0.003", "  lr: .inf"), "optimizer.lr", "finite number"},
      {"double_overflow", With("  lr: 0.003", "  lr: 1e999"), "optimizer.lr", "out of range"},
      {"string_for_double", With("  aux_loss_coeff: 0.01", "  aux_loss_coeff: \"0.01\""),
       "model.aux_loss_coeff", "must be a finite number"},
      {"tagged_scalar", With("steps: 40", "steps: !!str 40"), "steps", "explicit YAML tags"},
      // Missing required fields.
      {"missing_hidden", With("  hidden: 64", ""), "model.hidden", "is required"},
      {"missing_ffn", With("  ffn: 128", ""), "model.ffn", "is required"},
      {"missing_experts", With("  experts: 8", ""), "model.experts", "is required"},
      {"missing_topk", With("  topk: 2", ""), "model.topk", "is required"},
      {"missing_ep", With("  ep: 2", ""), "parallel.ep", "is required"},
      {"missing_parallel", With("parallel:\n  ep: 2\n  dp: 1", ""), "parallel", "is required"},
      {"missing_model", "name: x\nparallel: {ep: 1}\ntokens_per_rank: 1\nsteps: 1\n", "model",
       "is required"},
      {"missing_tokens", With("tokens_per_rank: 256", ""), "tokens_per_rank", "is required"},
      {"missing_steps", With("steps: 40", ""), "steps", "is required"},
      {"missing_name", With("name: base-job", ""), "name", "is required"},
      {"null_hidden", With("  hidden: 64", "  hidden: ~"), "model.hidden", "is required"},
      // Document shape.
      {"duplicate_key", With("  topk: 2", "  topk: 2\n  topk: 4"), "model.topk", "duplicate key"},
      {"duplicate_top_key", With("steps: 40", "steps: 40\nsteps: 50"), "steps", "duplicate key"},
      {"multiple_documents", std::string(kBase) + "---\n" + kBase, "spec",
       "more than one YAML document"},
      {"top_level_list", "- name: x\n- steps: 3\n", "spec", "must be a map of fields, got list"},
      {"top_level_scalar", "just a string\n", "spec", "must be a map of fields"},
      {"empty_document", "", "spec", "empty document"},
      {"comment_only", "# nothing here\n", "spec", "empty document"},
      {"syntax_error", "name: [unclosed\n", "name", "invalid YAML: end of sequence flow not found"},
      {"syntax_error_top", "name: x\n  bad indent: [\n", "spec", "invalid YAML"},
      {"anchor", With("  hidden: 64", "  hidden: &h 64"), "model.hidden", "anchors"},
      {"alias", With("  ffn: 128", "  ffn: *h"), "model.ffn", "aliases"},
      {"merge_key", With("parallel:\n  ep: 2\n  dp: 1", "parallel:\n  <<: *p"), "parallel.<<",
       "aliases"},
      {"complex_key", With("steps: 40", "? [a, b]\n: 1\nsteps: 40"), "spec", "map keys must be"},
      {"deep_nesting", std::string(kBase) + "x: " + std::string(200, '[') + std::string(200, ']'),
       "x", "nested deeper than"},
  };
}

class BadSpecTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadSpecTest, RejectedWithFieldAndRule) {
  const BadCase& c = GetParam();
  absl::StatusOr<JobSpec> spec = ParseJobSpec(c.yaml);
  ASSERT_FALSE(spec.ok()) << "accepted:\n" << c.yaml;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(spec.status().message());
  EXPECT_THAT(message, StartsWith(c.field + ": ")) << message;
  EXPECT_THAT(message, HasSubstr(c.rule)) << message;
}

INSTANTIATE_TEST_SUITE_P(AllBadCases, BadSpecTest, ::testing::ValuesIn(BadCases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           return info.param.label;
                         });

TEST(JobSpecTest, BaseSpecParsesWithEveryField) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(kBase);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "base-job");
  EXPECT_EQ(spec->model.hidden, 64);
  EXPECT_EQ(spec->model.ffn, 128);
  EXPECT_EQ(spec->model.experts, 8);
  EXPECT_EQ(spec->model.topk, 2);
  EXPECT_EQ(spec->parallel.ep, 2);
  EXPECT_EQ(spec->world_size(), 2);
  EXPECT_EQ(spec->tokens_per_rank, 256);
  EXPECT_EQ(spec->steps, 40);
  EXPECT_DOUBLE_EQ(spec->optimizer.lr, 0.003);
  EXPECT_DOUBLE_EQ(spec->optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(spec->optimizer.eps, 1e-8);
  EXPECT_EQ(spec->optimizer.warmup_steps, 5);
  EXPECT_EQ(spec->data.seed, 1234u);
  EXPECT_EQ(spec->resources.backend, Backend::kCpu);
}

TEST(JobSpecTest, OptionalSectionsTakeDefaults) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      "name: minimal\nmodel: {hidden: 32, ffn: 64, experts: 4, topk: 1}\nparallel: {ep: 1}\n"
      "tokens_per_rank: 8\nsteps: 2\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const JobSpec defaults;
  EXPECT_EQ(spec->parallel.dp, 1);
  EXPECT_EQ(spec->model.layers, defaults.model.layers);
  EXPECT_EQ(spec->model.router, RouterKind::kSoftmax);
  EXPECT_EQ(spec->precision, Precision::kBf16);
  EXPECT_EQ(spec->dispatcher, Dispatcher::kAuto);
  EXPECT_DOUBLE_EQ(spec->optimizer.lr, defaults.optimizer.lr);
  EXPECT_EQ(spec->optimizer.moment_dtype, MomentDtype::kFp32);
  EXPECT_EQ(spec->resources.backend, Backend::kCpu);
  EXPECT_TRUE(spec->checkpoint.dir.empty());
}

TEST(JobSpecTest, LabelsAndTimeLimit) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(With(
      "priority: 0",
      "labels: {team: search, example.com/tier: \"\", run: 42}\ntime_limit: 1h30m\npriority: 0"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->labels, (std::map<std::string, std::string>{
                              {"team", "search"}, {"example.com/tier", ""}, {"run", "42"}}));
  EXPECT_EQ(spec->time_limit_seconds, 5400);
  const JobSpec none = *ParseJobSpec(kBase);
  EXPECT_TRUE(none.labels.empty());
  EXPECT_EQ(none.time_limit_seconds, 0);  // no limit
}

TEST(JobSpecTest, NullMeansNotSetForOptionalFields) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(With("  dir: \"\"", "  dir:"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->checkpoint.dir, "");
}

TEST(JobSpecTest, BooleansAcceptTrueFalseInAnyCase) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(With("renormalize: true", "renormalize: FALSE"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->model.renormalize);
  spec = ParseJobSpec(With("renormalize: true", "renormalize: True"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->model.renormalize);
}

// As submitted, a field that cannot apply is refused: the zipf exponent with uniform routing. A
// spec already stored with it (an older coordinator wrote it for every distribution) still parses.
TEST(JobSpecTest, ASubmittedZipfExponentNeedsZipfRouting) {
  absl::StatusOr<JobSpec> uniform = ParseSubmittedJobSpec(kBase);
  ASSERT_FALSE(uniform.ok());
  EXPECT_TRUE(absl::StartsWith(uniform.status().message(),
                               "data.zipf_exponent: applies only with data.distribution: zipf"))
      << uniform.status();
  EXPECT_TRUE(ParseJobSpec(kBase).ok());
  EXPECT_TRUE(ParseSubmittedJobSpec(With("  zipf_exponent: 1.1", "")).ok());
  absl::StatusOr<JobSpec> zipf =
      ParseSubmittedJobSpec(With("  distribution: uniform", "  distribution: zipf"));
  ASSERT_TRUE(zipf.ok()) << zipf.status();
  EXPECT_EQ(zipf->data.zipf_exponent, 1.1);
  // Stored without it when uniform; read back with the default.
  EXPECT_EQ(JobSpecToYaml(*ParseJobSpec(kBase)).find("zipf_exponent"), std::string::npos);
  EXPECT_EQ(ParseJobSpec(kBase)->data.zipf_exponent, DataSpec{}.zipf_exponent);
}

// As submitted, checkpoint.dir must be absolute (a relative one would be resolved against each
// worker daemon's working directory); a spec stored before that rule still parses.
TEST(JobSpecTest, ASubmittedCheckpointDirIsAbsolute) {
  const std::string relative =
      WithAll({{"  dir: \"\"", "  dir: ckpt/run-1"}, {"  zipf_exponent: 1.1", ""}});
  absl::StatusOr<JobSpec> refused = ParseSubmittedJobSpec(relative);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StartsWith(refused.status().message(),
                               "checkpoint.dir: must be an absolute path (got \"ckpt/run-1\")"))
      << refused.status();
  EXPECT_TRUE(ParseJobSpec(relative).ok());
  EXPECT_TRUE(ParseSubmittedJobSpec(
                  WithAll({{"  dir: \"\"", "  dir: /data/ckpt"}, {"  zipf_exponent: 1.1", ""}}))
                  .ok());
}

TEST(JobSpecTest, NcclDispatchersParseAndTheCudaEngineTakesThem) {
  // The names parse and the cuda engine takes the NCCL backends it drives (engine_support_test.cc
  // has the engine's whole table; nccl-ep is refused there).
  auto with_dispatcher = [](const std::string& dispatcher) {
    return absl::StrReplaceAll(kBase, {{"dispatcher: auto\n", "dispatcher: " + dispatcher + "\n"},
                                       {"backend: cpu", "backend: cuda"},
                                       {"  ep: 2", "  ep: 1"}});
  };
  for (const std::string dispatcher : {"nccl-lsa", "nccl-a2a"}) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(with_dispatcher(dispatcher));
    EXPECT_TRUE(spec.ok()) << dispatcher << ": " << spec.status();
  }
}

TEST(JobSpecTest, CrlfLineEndingsAndJsonSyntaxAreAccepted) {
  absl::StatusOr<JobSpec> crlf = ParseJobSpec(absl::StrReplaceAll(kBase, {{"\n", "\r\n"}}));
  ASSERT_TRUE(crlf.ok()) << crlf.status();
  EXPECT_EQ(crlf->model.hidden, 64);
  absl::StatusOr<JobSpec> json = ParseJobSpec(
      R"({"name": "from-json", "model": {"hidden": 32, "ffn": 64, "experts": 4, "topk": 2,)"
      R"( "router": "sigmoid", "renormalize": false}, "parallel": {"ep": 2},)"
      R"( "tokens_per_rank": 16, "steps": 3, "optimizer": {"betas": [0.8, 0.9]}})");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->model.router, RouterKind::kSigmoid);
  EXPECT_FALSE(json->model.renormalize);
  EXPECT_DOUBLE_EQ(json->optimizer.beta1, 0.8);
}

TEST(JobSpecTest, OversizeDocumentRejectedBeforeParsing) {
  std::string yaml = std::string(kBase) + "# " + std::string(kMaxJobSpecBytes, 'x') + "\n";
  absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), StartsWith("spec: document is"));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("over the limit of 65536 bytes"));
}

// Billion laughs: nine levels of ten aliases each would be 10^9 nodes if expanded.
TEST(JobSpecTest, AliasBombRejectedFast) {
  std::string yaml = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
  for (int i = 1; i <= 9; ++i) {
    std::string prev = "*a" + std::to_string(i - 1);
    yaml += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int j = 0; j < 10; ++j) yaml += prev + (j < 9 ? ", " : "]\n");
  }
  yaml += "name: bomb\n";
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), StartsWith("a0: "));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("anchors"));
  EXPECT_LT(elapsed, std::chrono::milliseconds(500));
}

TEST(JobSpecTest, DeepNestingWithinSizeLimitRejectedWithoutCrash) {
  std::string yaml = "x: " + std::string(30000, '[') + std::string(30000, ']') + "\n";
  absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobSpecTest, BinaryGarbageRejected) {
  std::string junk;
  for (int i = 0; i < 4096; ++i) junk += static_cast<char>((i * 7919) % 255 + 1);
  absl::StatusOr<JobSpec> spec = ParseJobSpec(junk);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), StartsWith("spec"));
  EXPECT_FALSE(ParseJobSpec(std::string("name: a\0b\n", 10)).ok());
}

// Submit-time overrides (the coordinator's and the CLI's --name/--priority) pass the file's rules.
TEST(JobSpecTest, OverridesAreCheckedByTheSpecRules) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(kBase);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(ApplyJobSpecOverrides({}, &*spec).ok());
  EXPECT_EQ(spec->name, "base-job");
  ASSERT_TRUE(ApplyJobSpecOverrides({"renamed", 7}, &*spec).ok());
  EXPECT_EQ(spec->name, "renamed");
  EXPECT_EQ(spec->priority, 7);
  absl::StatusOr<JobSpec> again = ParseJobSpec(JobSpecToYaml(*spec));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->name, "renamed");

  absl::Status bad_name =
      ApplyJobSpecOverrides({std::string("Bad Name\x01"), std::nullopt}, &*spec);
  EXPECT_EQ(bad_name.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_name.message()), StartsWith("name: "));
  absl::Status bad_priority = ApplyJobSpecOverrides({std::nullopt, 5000}, &*spec);
  EXPECT_THAT(std::string(bad_priority.message()), StartsWith("priority: "));
  absl::Status long_name = ApplyJobSpecOverrides({std::string(300, 'a'), std::nullopt}, &*spec);
  EXPECT_THAT(std::string(long_name.message()), StartsWith("name: "));
  EXPECT_EQ(spec->name, "renamed");  // unchanged by a refused override
  EXPECT_EQ(spec->priority, 7);
}

TEST(JobSpecTest, MomentDtypeParsesAndDefaultsToFp32) {
  absl::StatusOr<JobSpec> base = ParseJobSpec(kBase);  // optimizer section without the field
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(base->optimizer.moment_dtype, MomentDtype::kFp32);
  const std::pair<const char*, MomentDtype> cases[] = {{"fp32", MomentDtype::kFp32},
                                                       {"bf16", MomentDtype::kBf16}};
  for (const auto& [name, want] : cases) {
    const std::string yaml =
        With("  warmup: 5", std::string("  warmup: 5\n  moment_dtype: ") + name);
    absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml);
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    EXPECT_EQ(spec->optimizer.moment_dtype, want) << name;
    EXPECT_EQ(ToString(spec->optimizer.moment_dtype), name);
    // Both engines honour it: the cuda backend takes it too.
    absl::StatusOr<JobSpec> cuda = ParseJobSpec(absl::StrReplaceAll(
        yaml, {{"  backend: cpu\n", "  backend: cuda\n"}, {"  ep: 2\n", "  ep: 1\n"}}));
    ASSERT_TRUE(cuda.ok()) << name << ": " << cuda.status();
    EXPECT_EQ(cuda->optimizer.moment_dtype, want) << name;
    EXPECT_EQ(cuda->resources.backend, Backend::kCuda);
  }
  // In flow style too, and null means "not set".
  absl::StatusOr<JobSpec> flow = ParseJobSpec(
      "name: flow\nmodel: {hidden: 32, ffn: 64, experts: 4, topk: 1}\nparallel: {ep: 1}\n"
      "tokens_per_rank: 8\nsteps: 2\noptimizer: {lr: 0.01, moment_dtype: bf16}\n");
  ASSERT_TRUE(flow.ok()) << flow.status();
  EXPECT_EQ(flow->optimizer.moment_dtype, MomentDtype::kBf16);
  absl::StatusOr<JobSpec> null =
      ParseJobSpec(With("  warmup: 5", "  warmup: 5\n  moment_dtype: ~"));
  ASSERT_TRUE(null.ok()) << null.status();
  EXPECT_EQ(null->optimizer.moment_dtype, MomentDtype::kFp32);
}

TEST(JobSpecTest, EnumNames) {
  EXPECT_EQ(ToString(RouterKind::kSigmoid), "sigmoid");
  EXPECT_EQ(ToString(Precision::kMxfp8), "mxfp8");
  EXPECT_EQ(ToString(Precision::kFp8Block), "fp8-block");
  EXPECT_EQ(ToString(Precision::kFp8BlockWgrad128), "fp8-block-wgrad128");
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      "name: wgrad128\nmodel: {hidden: 128, ffn: 128, experts: 8, topk: 1}\nparallel: {ep: 1}\n"
      "tokens_per_rank: 8\nsteps: 2\nprecision: fp8-block-wgrad128\nresources: {backend: cuda}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->precision, Precision::kFp8BlockWgrad128);
  EXPECT_EQ(ToString(Dispatcher::kNcclA2a), "nccl-a2a");
  EXPECT_EQ(ToString(RoutingDistribution::kZipf), "zipf");
  EXPECT_EQ(ToString(Backend::kCuda), "cuda");
  EXPECT_EQ(ToString(MomentDtype::kFp32), "fp32");
  EXPECT_EQ(ToString(MomentDtype::kBf16), "bf16");
}

}  // namespace
}  // namespace dropless
