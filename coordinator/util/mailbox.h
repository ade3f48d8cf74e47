// Mailbox: a bounded queue from the coordinator (producer, under its lock) to one RPC handler
// thread (consumer). A slow consumer never blocks the producer: past the capacity the mailbox
// drops new items and remembers that it overflowed, so the consumer can resynchronize (a watcher
// sends a fresh snapshot). A producer that must lose nothing and may wait (a stream's reader
// thread) uses PushWaiting instead. Thread-safe.
#ifndef DROPLESS_COORDINATOR_UTIL_MAILBOX_H_
#define DROPLESS_COORDINATOR_UTIL_MAILBOX_H_

#include <cstddef>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dropless::coordinator {

template <typename T>
class Mailbox {
 public:
  explicit Mailbox(size_t capacity) : capacity_(capacity) {}

  // False when the item was dropped (closed, or full).
  bool Push(T item) {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    if (items_.size() >= capacity_) {
      overflowed_ = true;
      return false;
    }
    items_.push_back(std::move(item));
    return true;
  }

  // Waits for room rather than dropping the item; false when the mailbox is (or gets) closed.
  bool PushWaiting(T item) {
    absl::MutexLock lock(&mu_);
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closed_ || items_.size() < capacity_;
    };
    mu_.Await(absl::Condition(&room));
    if (closed_) return false;
    items_.push_back(std::move(item));
    return true;
  }

  // No more items after the ones queued; Pop drains them, then reports closed.
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

  enum class Result { kItem, kTimeout, kClosed };
  // Waits up to timeout for an item.
  Result Pop(absl::Duration timeout, T* out) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !items_.empty() || closed_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    if (!items_.empty()) {
      *out = std::move(items_.front());
      items_.pop_front();
      return Result::kItem;
    }
    return closed_ ? Result::kClosed : Result::kTimeout;
  }

  // As Pop, but appends to `out` the item and every one queued behind it, up to `max` in all:
  // what has arrived while the consumer was busy is taken together.
  Result PopAll(absl::Duration timeout, size_t max, std::vector<T>* out) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !items_.empty() || closed_; };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    if (items_.empty()) return closed_ ? Result::kClosed : Result::kTimeout;
    for (size_t n = 0; n < max && !items_.empty(); ++n) {
      out->push_back(std::move(items_.front()));
      items_.pop_front();
    }
    return Result::kItem;
  }

  // True once since the last call if items were dropped for lack of room.
  bool TakeOverflow() {
    absl::MutexLock lock(&mu_);
    return std::exchange(overflowed_, false);
  }

  bool closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<T> items_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool overflowed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_UTIL_MAILBOX_H_
