// A google.protobuf.Duration field of a request as milliseconds, checked: one clear error naming
// the field for a negative or out-of-range value (rather than an overflowing conversion).
#ifndef DROPLESS_COORDINATOR_UTIL_DURATION_FIELD_H_
#define DROPLESS_COORDINATOR_UTIL_DURATION_FIELD_H_

#include <google/protobuf/duration.pb.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dropless::coordinator {

// 10 000 years, protobuf's own bound on a Duration (google/protobuf/duration.proto).
inline constexpr int64_t kMaxDurationSeconds = 315'576'000'000;

inline absl::StatusOr<int64_t> NonNegativeDurationMs(const google::protobuf::Duration& d,
                                                     absl::string_view field) {
  if (d.seconds() < 0 || d.nanos() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": must not be negative"));
  }
  if (d.seconds() > kMaxDurationSeconds || d.nanos() > 999'999'999) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": out of range (seconds at most ",
                                                   kMaxDurationSeconds, ", nanos below 1e9)"));
  }
  return d.seconds() * 1000 + d.nanos() / 1'000'000;
}

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_UTIL_DURATION_FIELD_H_
