// SubmitRateLimiter: a token bucket per caller (a bearer token): `per_second` submissions refill
// continuously up to `burst`; a submission with the bucket empty is refused.
#ifndef DROPLESS_COORDINATOR_AUTH_SUBMIT_RATE_LIMITER_H_
#define DROPLESS_COORDINATOR_AUTH_SUBMIT_RATE_LIMITER_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dropless::coordinator {

class SubmitRateLimiter {
 public:
  // per_second <= 0: no limit.
  SubmitRateLimiter(double per_second, double burst);

  // Whether `caller` may submit now; takes one submission from its bucket when it may.
  bool TryTake(const std::string& caller, absl::Time now);

  double per_second() const { return per_second_; }
  double burst() const { return burst_; }

 private:
  struct Bucket {
    double available = 0;
    absl::Time refilled;
  };
  const double per_second_;
  const double burst_;
  absl::Mutex mu_;
  std::map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_AUTH_SUBMIT_RATE_LIMITER_H_
