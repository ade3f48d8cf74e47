// Errors that are properties of the job itself (its spec, its checkpoint directory), not of the
// node it ran on or of the moment: a retry would fail the same way. The rank process exits with
// kRankExitJobError for them, and the coordinator then ends the job instead of retrying it. And
// one that is a property of the job on this node's GPUs: more memory than the GPU has.
#ifndef DROPLESS_COMMON_JOB_ERROR_H_
#define DROPLESS_COMMON_JOB_ERROR_H_

#include "absl/status/status.h"

namespace dropless {

// sysexits' EX_CONFIG: the rank's exit code for a job error.
inline constexpr int kRankExitJobError = 78;

// The rank's exit code when the job needs more memory than its GPU has in all: not a job error
// in a fleet with larger GPUs. The coordinator then places the job only on GPUs with more memory
// than that one's (Job.needs_device_memory_above_bytes), and fails it when no known worker could
// hold its gang on such GPUs. Outside sysexits' range, which ends at 78.
inline constexpr int kRankExitDeviceTooSmall = 79;

// `status` marked as a job error (an OK status stays OK).
absl::Status MarkJobError(absl::Status status);
bool IsJobError(const absl::Status& status);

// `status` marked as "the job does not fit this GPU's total memory" (an OK status stays OK).
absl::Status MarkDeviceTooSmall(absl::Status status);
bool IsDeviceTooSmall(const absl::Status& status);

// The rank process's exit code for the error `status` that ended its run: kRankExitJobError,
// kRankExitDeviceTooSmall or 1.
int RankExitCodeFor(const absl::Status& status);

}  // namespace dropless

#endif  // DROPLESS_COMMON_JOB_ERROR_H_
