#include "coordinator/auth/submit_rate_limiter.h"

#include <algorithm>

namespace dropless::coordinator {

SubmitRateLimiter::SubmitRateLimiter(double per_second, double burst)
    : per_second_(per_second), burst_(std::max(1.0, burst)) {}

bool SubmitRateLimiter::TryTake(const std::string& caller, absl::Time now) {
  if (per_second_ <= 0) return true;
  absl::MutexLock lock(&mu_);
  auto [it, created] = buckets_.try_emplace(caller);
  Bucket& bucket = it->second;
  if (created) {
    bucket.available = burst_;
  } else {
    const double elapsed = std::max(0.0, absl::ToDoubleSeconds(now - bucket.refilled));
    bucket.available = std::min(burst_, bucket.available + elapsed * per_second_);
  }
  bucket.refilled = now;
  if (bucket.available < 1.0) return false;
  bucket.available -= 1.0;
  return true;
}

}  // namespace dropless::coordinator
