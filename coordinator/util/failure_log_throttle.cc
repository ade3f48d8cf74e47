#include "coordinator/util/failure_log_throttle.h"

#include "absl/strings/str_format.h"

namespace dropless::coordinator {
namespace {

std::string Rounded(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1)));
}

}  // namespace

std::optional<std::string> FailureLogThrottle::Failed(absl::string_view detail, absl::Time now) {
  succeeding_ = false;
  ++failures_;
  if (failures_ == 1) {
    first_failure_ = now;
    last_line_ = now;
    failures_unlogged_ = 0;
    return absl::StrFormat("%s failed: %s (while this lasts, one line every %s)", what_, detail,
                           absl::FormatDuration(interval_));
  }
  ++failures_unlogged_;
  if (now - last_line_ < interval_) return std::nullopt;
  std::string line = absl::StrFormat(
      "%s failed %d more times in the last %s (%d times since the first, %s ago); the last: %s",
      what_, failures_unlogged_, Rounded(now - last_line_), failures_,
      Rounded(now - first_failure_), detail);
  last_line_ = now;
  failures_unlogged_ = 0;
  return line;
}

std::optional<std::string> FailureLogThrottle::Succeeded(absl::Time now) {
  if (failures_ == 0) return std::nullopt;
  if (!succeeding_) {
    succeeding_ = true;
    succeeding_since_ = now;
  }
  return Recovered(now);
}

std::optional<std::string> FailureLogThrottle::Recovered(absl::Time now) {
  if (failures_ == 0 || !succeeding_ || now - succeeding_since_ < settle_) return std::nullopt;
  std::string line = absl::StrFormat("%s succeeds again (for %s), after %d failures over %s", what_,
                                     Rounded(now - succeeding_since_), failures_,
                                     Rounded(succeeding_since_ - first_failure_));
  failures_ = 0;
  failures_unlogged_ = 0;
  succeeding_ = false;
  return line;
}

}  // namespace dropless::coordinator
