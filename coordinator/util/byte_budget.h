// ByteBudget: how many bytes a producer may hold ahead of its consumer (a worker session's reader
// thread ahead of the coordinator): Take waits while they would go past the limit, Give returns
// them once handled. One item larger than the limit still goes when nothing else is held, so a
// single large message is never stuck. Thread-safe.
#ifndef DROPLESS_COORDINATOR_UTIL_BYTE_BUDGET_H_
#define DROPLESS_COORDINATOR_UTIL_BYTE_BUDGET_H_

#include <cstddef>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dropless::coordinator {

class ByteBudget {
 public:
  explicit ByteBudget(size_t limit) : limit_(limit) {}

  // Waits until `bytes` fit (or nothing is held), then holds them; false, holding nothing, once
  // Close was called.
  bool Take(size_t bytes) {
    absl::MutexLock lock(&mu_);
    auto fits = [this, bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closed_ || held_ == 0 || held_ + bytes <= limit_;
    };
    mu_.Await(absl::Condition(&fits));
    if (closed_) return false;
    held_ += bytes;
    return true;
  }
  // The consumer is done with `bytes` of what was taken.
  void Give(size_t bytes) {
    absl::MutexLock lock(&mu_);
    held_ -= bytes < held_ ? bytes : held_;
  }
  // Take returns false from now on, also where it waits.
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  size_t held() const {
    absl::MutexLock lock(&mu_);
    return held_;
  }

 private:
  const size_t limit_;
  mutable absl::Mutex mu_;
  size_t held_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_UTIL_BYTE_BUDGET_H_
