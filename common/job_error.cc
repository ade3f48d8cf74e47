#include "common/job_error.h"

#include "absl/strings/cord.h"

namespace dropless {
namespace {

constexpr char kJobErrorPayload[] = "type.dropless.dev/job-error";

}  // namespace

absl::Status MarkJobError(absl::Status status) {
  if (!status.ok()) status.SetPayload(kJobErrorPayload, absl::Cord("1"));
  return status;
}

bool IsJobError(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kJobErrorPayload).has_value();
}

}  // namespace dropless
