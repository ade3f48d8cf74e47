// JobSpec: the validated form of a job's YAML (configs/jobs/*.yaml). The one parser and validator
// used by the coordinator (on submit), the CLI (before sending) and the rank process (at start);
// nothing outside common/ reads a spec's YAML or checks its fields.
#ifndef DROPLESS_COMMON_JOB_SPEC_H_
#define DROPLESS_COMMON_JOB_SPEC_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace dropless {

enum class RouterKind { kSoftmax, kSigmoid };
enum class Activation { kSwiGLU };
// kFp8BlockWgrad128: fp8-block with the weight gradient's activation operand (X) scaled per
// 128 x 128 block instead of per 1 x 128 column tile (kernels/include/dropless/kernels/fp8_block.h).
enum class Precision { kBf16, kMxfp8, kFp8Block, kFp8BlockWgrad128 };
enum class Dispatcher { kAuto, kGloo, kNcclA2a, kNcclLsa, kNcclEp };
enum class RoutingDistribution { kUniform, kZipf };
enum class Backend { kCpu, kCuda };
enum class MomentDtype { kFp32, kBf16 };

// The fp8-block recipes (1x128 activation tiles, 128x128 weight blocks).
inline bool IsFp8Block(Precision p) {
  return p == Precision::kFp8Block || p == Precision::kFp8BlockWgrad128;
}

// The most always-on (shared) experts a job spec may ask for (model.shared_experts).
inline constexpr int64_t kMaxSharedExperts = 16;

struct ModelSpec {
  int64_t hidden = 0;          // H
  int64_t ffn = 0;             // F, per expert (w1: H x 2F, w2: F x H)
  int64_t experts = 0;         // E, routed experts
  int64_t topk = 0;            // k
  int64_t shared_experts = 0;  // always-on experts of width ffn, at most kMaxSharedExperts
  int64_t layers = 1;          // MoE layers stacked (residual)
  RouterKind router = RouterKind::kSoftmax;
  bool renormalize = true;     // renormalize the top-k weights to sum to 1
  Activation activation = Activation::kSwiGLU;
  double aux_loss_coeff = 0.01;  // load-balancing auxiliary loss weight
};

struct ParallelSpec {
  int64_t ep = 1;  // expert-parallel ranks: experts are split across them
  int64_t dp = 1;  // data-parallel replicas of the EP group
};

struct OptimizerSpec {
  std::string name = "adamw";
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t warmup_steps = 0;  // linear warmup of lr
  // How AdamW stores its moments between steps (YAML optimizer.moment_dtype: fp32 | bf16). Each
  // step computes m and v in fp32 and the update uses those fp32 values; bf16 then stores them
  // rounded stochastically (kernels/adamw.h says why). As DeepSeek-V3 keeps them: 4 fewer bytes
  // a parameter in memory and 8 fewer moved by every step's update.
  MomentDtype moment_dtype = MomentDtype::kFp32;
};

struct CheckpointSpec {
  std::string dir;    // empty: no checkpoints
  int64_t every = 0;  // steps between checkpoints; 0: only at the end when dir is set

  // Whether a checkpoint is written after `step` of a job of `steps` steps: every `every` steps
  // and after the last one, when dir is set. The rank process saves by it (the engines do not).
  bool DueAfter(int64_t step, int64_t steps) const {
    return !dir.empty() && ((every > 0 && step % every == 0) || step == steps);
  }
};

struct DataSpec {
  RoutingDistribution distribution = RoutingDistribution::kUniform;
  double zipf_exponent = 1.0;  // used when distribution is zipf
  uint64_t seed = 0;
};

struct ResourcesSpec {
  Backend backend = Backend::kCpu;
};

struct JobSpec {
  std::string name;
  // Free key/value tags for selecting jobs (`dropless get jobs -l team=search`), kubectl's label
  // syntax: keys [prefix/]name, names and values up to 63 of [A-Za-z0-9._-], alphanumeric at both
  // ends; a prefix up to 253 of [a-z0-9.-]; at most 32 labels.
  std::map<std::string, std::string> labels;
  int32_t priority = 0;      // higher is scheduled first; -kMaxJobPriority..kMaxJobPriority
  int32_t max_attempts = 1;  // attempts before the job is FAILED
  // Wall-clock limit from the job's first start (YAML: a duration such as 90m or 2h30m; absent or
  // null: none). A job still running past it is FAILED, attempts left or not.
  int64_t time_limit_seconds = 0;
  ModelSpec model;
  ParallelSpec parallel;
  Precision precision = Precision::kBf16;
  int64_t tokens_per_rank = 0;  // T per rank per step
  int64_t steps = 0;
  OptimizerSpec optimizer;
  Dispatcher dispatcher = Dispatcher::kAuto;
  bool overlap = false;
  bool activation_offload = false;
  CheckpointSpec checkpoint;
  DataSpec data;
  ResourcesSpec resources;

  int64_t world_size() const { return parallel.ep * parallel.dp; }
};

// Largest YAML document accepted, in bytes.
inline constexpr size_t kMaxJobSpecBytes = 64 * 1024;
// The highest priority a spec may have (and minus it the lowest). The coordinator lets only admins
// go above its --max-user-priority.
inline constexpr int32_t kMaxJobPriority = 1000;

// Parses and validates a job spec. Errors are InvalidArgument with one message naming the field
// path and the rule, e.g. "model.experts: must be divisible by parallel.ep (got 10 % 4 != 0)".
absl::StatusOr<JobSpec> ParseJobSpec(std::string_view yaml);

// ParseJobSpec and the rules for a spec as submitted (the coordinator's SubmitJob, the CLI), not
// for one already stored: a field that is set but cannot apply is refused (data.zipf_exponent
// without distribution zipf). Stored specs are parsed with ParseJobSpec, so that specs an older
// coordinator accepted still run.
absl::StatusOr<JobSpec> ParseSubmittedJobSpec(std::string_view yaml);

// Submit-time overrides of a spec's name and priority (SubmitJobRequest.name / .priority, the
// CLI's --name / --priority); one left unset keeps the spec's value.
struct JobSpecOverrides {
  std::optional<std::string> name;
  std::optional<int32_t> priority;
};

// Applies the overrides to a valid spec and checks the result by the rules ParseJobSpec applies
// to the file (name pattern, priority range), so that the stored spec, which every rank parses
// again, stays valid. InvalidArgument naming the field otherwise, and *spec is left unchanged.
absl::Status ApplyJobSpecOverrides(const JobSpecOverrides& overrides, JobSpec* spec);

// One label by the spec's rules (key [prefix/]name, value empty or a name of up to 63 of
// [A-Za-z0-9._-]): InvalidArgument "<path>: ..." otherwise. A filter on labels (ListJobs, the
// CLI's -l) uses it too, so that a selector that can never match a job is refused.
absl::Status CheckLabel(absl::string_view path, absl::string_view key, absl::string_view value);

// Canonical YAML of a valid spec; ParseJobSpec(JobSpecToYaml(s)) == s.
std::string JobSpecToYaml(const JobSpec& spec);

std::string_view ToString(RouterKind v);
std::string_view ToString(Precision v);
std::string_view ToString(Dispatcher v);
std::string_view ToString(RoutingDistribution v);
std::string_view ToString(Backend v);
std::string_view ToString(MomentDtype v);

}  // namespace dropless

#endif  // DROPLESS_COMMON_JOB_SPEC_H_
