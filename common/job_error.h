// Errors that are properties of the job itself (its spec, its checkpoint directory), not of the
// node it ran on or of the moment: a retry would fail the same way. The rank process exits with
// kRankExitJobError for them, and the coordinator then ends the job instead of retrying it.
#ifndef DROPLESS_COMMON_JOB_ERROR_H_
#define DROPLESS_COMMON_JOB_ERROR_H_

#include "absl/status/status.h"

namespace dropless {

// sysexits' EX_CONFIG: the rank's exit code for a job error.
inline constexpr int kRankExitJobError = 78;

// `status` marked as a job error (an OK status stays OK).
absl::Status MarkJobError(absl::Status status);
bool IsJobError(const absl::Status& status);

}  // namespace dropless

#endif  // DROPLESS_COMMON_JOB_ERROR_H_
