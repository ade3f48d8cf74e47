// Checkpoints of one rank of a MoE job, the same files for the CPU and the CUDA engine so that each
// resumes from the other's: the parameters and AdamW moments of the two flat float32 buffers of
// worker/engine/cpu/moe_model.h (an engine holding them elsewhere copies them to host first).
// The moments are F32 in the files whatever optimizer.moment_dtype is; a job with bf16 moments
// writes bf16-representable values, which F32 holds exactly.
//
// In `dir`, per rank r:
//   rank-<r>-step-<s>.safetensors  the tensors, by name (H hidden, E experts, F ffn, S shared,
//                                  E/ep this rank's experts, the first of them in metadata):
//       layers.<l>.router.weight [H, E]          layers.<l>.shared_experts.<s>.w1 [H, 2F]
//       layers.<l>.experts.w1 [E/ep, H, 2F]      layers.<l>.shared_experts.<s>.w2 [F, H]
//       layers.<l>.experts.w2 [E/ep, F, H]
//     and the moments as optimizer.exp_avg.<name> and optimizer.exp_avg_sq.<name>; metadata:
//     format "pt", dropless_checkpoint_version, step, the identity fields (router "softmax" or
//     "sigmoid", renormalize "true" or "false", the others decimal), first_expert,
//     local_experts and rng_state ({"seed":..,"step":..}: the task's random numbers are a pure
//     function of (seed, step), so this is their whole state).
//   manifest-rank-<r>.json  format, version (a JSON integer), step, identity (numbers, router a
//                           string, renormalize a boolean), and the data file's name, size and
//                           CRC-32C; renaming it into place commits the checkpoint. "previous"
//                           (step and files) names the rank's checkpoint before it, still kept.
// Writing: the data file (temp, fsync, rename, directory fsync), then the manifest the same way,
// then this rank's data files other than the newest and the previous are removed. A crash at any
// point leaves the previous manifest and the data files it names intact. Ranks write their own
// files only, so they may write at once, and a rank killed while writing leaves the job's ranks one
// checkpoint apart at most: the previous one lets all of them resume from a step each holds
// (checkpoint_agreement.h picks it).
#ifndef DROPLESS_WORKER_ENGINE_CHECKPOINT_MOE_CHECKPOINT_H_
#define DROPLESS_WORKER_ENGINE_CHECKPOINT_MOE_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/engine_config.h"
#include "worker/engine/cpu/moe_model.h"

namespace dropless::engine {

inline constexpr int kMoeCheckpointVersion = 1;

// What a checkpoint must match to be restored: the rank's place in the job, the model's shape and
// routing function, and the data seed. Checkpoints written before the files recorded the routing
// function (router, renormalize) lack it and are accepted whatever the job's.
struct MoeCheckpointIdentity {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t ep = 1;
  int64_t dp = 1;
  int64_t hidden = 0;
  int64_t ffn = 0;
  int64_t experts = 0;
  int64_t topk = 0;
  int64_t shared_experts = 0;
  int64_t layers = 0;
  uint64_t seed = 0;
  RouterKind router = RouterKind::kSoftmax;
  bool renormalize = true;

  bool operator==(const MoeCheckpointIdentity& other) const;
  bool operator!=(const MoeCheckpointIdentity& other) const { return !(*this == other); }
};

// The identity of `rank` in the job of `config` (world_size ep * dp, seed data.seed, router and
// renormalize model.router and model.renormalize).
MoeCheckpointIdentity MoeCheckpointIdentityOf(const EngineConfig& config, int64_t rank);

// One flat parameter buffer with its AdamW moments, each of the layout's size for that buffer.
struct MoeOptimizerBuffers {
  absl::Span<float> value, m, v;
};

std::string MoeCheckpointManifestPath(const std::string& dir, int64_t rank);
std::string MoeCheckpointDataPath(const std::string& dir, int64_t rank, int64_t step);

// Creates `dir` when missing and writes id.rank's checkpoint of `step` atomically. InvalidArgument
// when the buffers or the identity do not fit `layout`.
absl::Status WriteMoeCheckpoint(const std::string& dir, const MoeCheckpointIdentity& id,
                                int64_t step, const cpu::MoeParameterLayout& layout,
                                const MoeOptimizerBuffers& replicated,
                                const MoeOptimizerBuffers& experts);

// The steps id.rank's manifest in `dir` commits, newest first (the newest, then the previous one
// when kept). Errors as ReadMoeCheckpoint's, NotFound when there is none.
absl::StatusOr<std::vector<int64_t>> MoeCheckpointSteps(const std::string& dir,
                                                        const MoeCheckpointIdentity& id);

// Reads id.rank's checkpoint of `step` (default: its newest) in `dir` into the buffers and returns
// its step. NotFound when there is none, or none of `step`; InvalidArgument when it belongs to
// another job (the message names each field that differs, model.router and model.renormalize by
// their spec field) or another format version;
// FailedPrecondition when `dir` holds a checkpoint of the pre-safetensors format; DataLoss when it
// is damaged (a manifest version that is not a JSON integer, "1" too, included). Those three are
// job errors (common/job_error.h): a retry would meet them again. After an error the buffers may
// hold part of the checkpoint.
absl::StatusOr<int64_t> ReadMoeCheckpoint(const std::string& dir, const MoeCheckpointIdentity& id,
                                          const cpu::MoeParameterLayout& layout,
                                          const MoeOptimizerBuffers& replicated,
                                          const MoeOptimizerBuffers& experts,
                                          std::optional<int64_t> step = std::nullopt);

}  // namespace dropless::engine

#endif  // DROPLESS_WORKER_ENGINE_CHECKPOINT_MOE_CHECKPOINT_H_
