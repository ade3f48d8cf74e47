// FailureLogThrottle: the log lines of a failure that repeats for as long as its cause lasts (a
// full disk fails every job store commit, several times a second): the first failure is logged,
// then at most one line per interval with how many failed since the last line, and one line once
// success lasts: `settle` after a success with no failure since (a store that takes one commit in
// ten is still failing, and its failures go on in the same run of lines). The caller logs the
// lines at the level it chooses.
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
  explicit FailureLogThrottle(std::string what, absl::Duration interval = absl::Seconds(30),
                              absl::Duration settle = absl::Seconds(5))
      : what_(std::move(what)), interval_(interval), settle_(settle) {}

  // A failure at `now` (detail: this one's error). The line to log: for the first failure since
  // the failures were last said to be over, or the first one `interval` after the last line;
  // nullopt otherwise.
  std::optional<std::string> Failed(absl::string_view detail, absl::Time now);
  // A success at `now`. The line saying that the failures are over, once there were some and
  // success has lasted `settle` without a failure (this call or a later one says it).
  std::optional<std::string> Succeeded(absl::Time now);
  // Nothing failed, nothing was tried: Succeeded's line, if success (since its last call) has
  // lasted `settle` by `now`; nothing is counted as a success.
  std::optional<std::string> Recovered(absl::Time now);

 private:
  const std::string what_;
  const absl::Duration interval_;
  const absl::Duration settle_;
  bool succeeding_ = false;  // a success came after the last failure
  absl::Time succeeding_since_;
  int64_t failures_ = 0;           // since the failures were last said to be over
  int64_t failures_unlogged_ = 0;  // since the last line
  absl::Time first_failure_;
  absl::Time last_line_;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_UTIL_FAILURE_LOG_THROTTLE_H_
