// The one answer for a job id that names no job the caller may see: the store's for an id it does
// not hold (JobStore::GetJob), and, word for word the same, JobService's for another user's job
// (CheckJobAccess, coordinator/auth/caller.h). Job ids are sequential: an answer that differed
// would tell anyone probing ids which ones run.
#ifndef DROPLESS_COORDINATOR_STORE_JOB_NOT_FOUND_H_
#define DROPLESS_COORDINATOR_STORE_JOB_NOT_FOUND_H_

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dropless::coordinator {

// NotFound `job "<id>" not found`.
inline absl::Status JobNotFoundError(absl::string_view job_id) {
  return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
}

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_STORE_JOB_NOT_FOUND_H_
