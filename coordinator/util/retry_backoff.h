// RetryBackoff: when to try again something that keeps failing (the ticker's commit of what the
// job store did not take): after the first failure `initial`, doubling with each failure up to
// `max`; a success starts over.
//
// Not thread-safe: its owner serializes calls (the JobController, under the Coordinator's lock).
#ifndef DROPLESS_COORDINATOR_UTIL_RETRY_BACKOFF_H_
#define DROPLESS_COORDINATOR_UTIL_RETRY_BACKOFF_H_

#include <algorithm>

#include "absl/time/time.h"

namespace dropless::coordinator {

class RetryBackoff {
 public:
  RetryBackoff(absl::Duration initial, absl::Duration max)
      : initial_(initial), max_(max), delay_(initial) {}

  // Whether a try is due at `now`: no failure since the last success, or the delay has passed.
  bool Due(absl::Time now) const { return now >= next_try_; }
  void Failed(absl::Time now) {
    next_try_ = now + delay_;
    delay_ = std::min(delay_ * 2, max_);
  }
  void Succeeded() {
    delay_ = initial_;
    next_try_ = absl::InfinitePast();
  }

 private:
  const absl::Duration initial_;
  const absl::Duration max_;
  absl::Duration delay_;
  absl::Time next_try_ = absl::InfinitePast();
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_UTIL_RETRY_BACKOFF_H_
