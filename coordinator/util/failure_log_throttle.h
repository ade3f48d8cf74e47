// FailureLogThrottle: the log lines of a failure that repeats for as long as its cause lasts (a
// full disk fails every job store commit, several times a second): the first failure is logged,
// then at most one line per interval with how many failed since the last line, and one line when
// an attempt succeeds again. The caller logs the lines at the level it chooses.
//
// Not thread-safe: its owner serializes calls (the JobController, under the Coordinator's lock).
#ifndef DROPLESS_COORDINATOR_UTIL_FAILURE_LOG_THROTTLE_H_
#define DROPLESS_COORDINATOR_UTIL_FAILURE_LOG_THROTTLE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dropless::coordinator {

class FailureLogThrottle {
 public:
  // what: what fails, as the subject of the lines ("a job store commit").
  explicit FailureLogThrottle(std::string what, absl::Duration interval = absl::Seconds(30))
      : what_(std::move(what)), interval_(interval) {}

  // A failure at `now` (detail: this one's error). The line to log: for the first failure since
  // the last success, or the first one `interval` after the last line; nullopt otherwise.
  std::optional<std::string> Failed(absl::string_view detail, absl::Time now);
  // A success at `now`: the line saying that the failures are over, when there were any.
  std::optional<std::string> Succeeded(absl::Time now);

 private:
  const std::string what_;
  const absl::Duration interval_;
  int64_t failures_ = 0;           // since the last success
  int64_t failures_unlogged_ = 0;  // since the last line
  absl::Time first_failure_;
  absl::Time last_line_;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_UTIL_FAILURE_LOG_THROTTLE_H_
