// WithContext: an error with a prefix that says where it happened, keeping its code and payloads
// (the job-error mark of common/job_error.h among them). Rebuilding a status from its code and
// message drops the payloads: a job error wrapped that way would be retried as a node's problem.
#ifndef DROPLESS_COMMON_STATUS_CONTEXT_H_
#define DROPLESS_COMMON_STATUS_CONTEXT_H_

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dropless {

// "context: message" with status's code and payloads; an OK status stays OK.
inline absl::Status WithContext(absl::string_view context, const absl::Status& status) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload([&out](absl::string_view type_url, const absl::Cord& payload) {
    out.SetPayload(type_url, payload);
  });
  return out;
}

}  // namespace dropless

#endif  // DROPLESS_COMMON_STATUS_CONTEXT_H_
