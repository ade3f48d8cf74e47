#include "common/job_error.h"

#include "absl/strings/cord.h"

namespace dropless {
namespace {

constexpr char kJobErrorPayload[] = "type.dropless.dev/job-error";
constexpr char kDeviceTooSmallPayload[] = "type.dropless.dev/device-too-small";

}  // namespace

absl::Status MarkJobError(absl::Status status) {
  if (!status.ok()) status.SetPayload(kJobErrorPayload, absl::Cord("1"));
  return status;
}

bool IsJobError(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kJobErrorPayload).has_value();
}

absl::Status MarkDeviceTooSmall(absl::Status status) {
  if (!status.ok()) status.SetPayload(kDeviceTooSmallPayload, absl::Cord("1"));
  return status;
}

bool IsDeviceTooSmall(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kDeviceTooSmallPayload).has_value();
}

int RankExitCodeFor(const absl::Status& status) {
  if (IsJobError(status)) return kRankExitJobError;
  if (IsDeviceTooSmall(status)) return kRankExitDeviceTooSmall;
  return 1;
}

}  // namespace dropless
