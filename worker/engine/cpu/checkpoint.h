// Rank checkpoints of the CPU engine: dir/rank-<r>.ckpt holds the step counter, the parameters
// and the AdamW moments of one rank, as float32 tensors after a versioned header that records the
// job shape, so a checkpoint of another model or layout is refused rather than misread.
//
// Format v1 (little-endian, what every x86-64/arm64 host running the CPU engine is):
//   char[8] "DLCKPT\0\0" | u32 version | u32 tensor count n | i64 step | i64 x 10 shape fields
//   (rank, world_size, ep, dp, hidden, ffn, experts, topk, shared_experts, layers) | u64 seed
//   | i64 x n element counts | float32 payload | u64 FNV-1a of the payload.
// Written to a temporary file, fsync'd and renamed, so a crash leaves the previous checkpoint.
#ifndef DROPLESS_WORKER_ENGINE_CPU_CHECKPOINT_H_
#define DROPLESS_WORKER_ENGINE_CPU_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dropless::cpu {

inline constexpr uint32_t kCheckpointVersion = 1;

struct CheckpointIdentity {
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

  bool operator==(const CheckpointIdentity& other) const;
};

std::string RankCheckpointPath(const std::string& dir, int64_t rank);

// Creates `dir` (and parents) when missing, then writes the checkpoint atomically.
absl::Status WriteRankCheckpoint(const std::string& dir, const CheckpointIdentity& identity,
                                 int64_t step, absl::Span<const absl::Span<const float>> tensors);

// Reads the checkpoint of identity.rank in `dir` into `tensors` (sizes must match) and returns
// its step. NotFound when there is none; InvalidArgument / DataLoss when it does not fit or is
// damaged.
absl::StatusOr<int64_t> ReadRankCheckpoint(const std::string& dir,
                                           const CheckpointIdentity& identity,
                                           absl::Span<const absl::Span<float>> tensors);

}  // namespace dropless::cpu

#endif  // DROPLESS_WORKER_ENGINE_CPU_CHECKPOINT_H_
