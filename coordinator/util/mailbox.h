// Mailbox: a bounded queue of protobuf messages from the coordinator (producer, under its lock) to
// one RPC handler thread (consumer). Bounded in items and, optionally, in the items' serialized
// bytes (one item always fits an empty mailbox). A slow consumer never blocks the producer: past
// the bound the mailbox drops new items and remembers that it overflowed, so the consumer can
// resynchronize (a watcher sends a fresh snapshot). A producer that must lose nothing and may wait
// (a stream's reader thread) uses PushWaiting instead. Thread-safe.
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
  // max_bytes 0: bounded in items only.
  explicit Mailbox(size_t capacity, size_t max_bytes = 0)
      : capacity_(capacity), max_bytes_(max_bytes) {}

  // False when the item was dropped (closed, or full).
  bool Push(T item) {
    const size_t bytes = BytesOf(item);
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    if (!Fits(bytes)) {
      overflowed_ = true;
      return false;
    }
    Append(std::move(item), bytes);
    return true;
  }

  // Waits for room rather than dropping the item; false when the mailbox is (or gets) closed.
  bool PushWaiting(T item) {
    const size_t bytes = BytesOf(item);
    absl::MutexLock lock(&mu_);
    auto room = [this, bytes]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || Fits(bytes); };
    mu_.Await(absl::Condition(&room));
    if (closed_) return false;
    Append(std::move(item), bytes);
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
      *out = TakeFront();
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
    for (size_t n = 0; n < max && !items_.empty(); ++n) out->push_back(TakeFront());
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

  // Serialized bytes of the queued items (0 without a byte bound).
  size_t bytes() const {
    absl::MutexLock lock(&mu_);
    return bytes_;
  }

 private:
  size_t BytesOf(const T& item) const { return max_bytes_ == 0 ? 0 : item.ByteSizeLong(); }
  bool Fits(size_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return items_.size() < capacity_ &&
           (max_bytes_ == 0 || items_.empty() || bytes_ + bytes <= max_bytes_);
  }
  void Append(T item, size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    items_.push_back(std::move(item));
    item_bytes_.push_back(bytes);
    bytes_ += bytes;
  }
  T TakeFront() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    T item = std::move(items_.front());
    items_.pop_front();
    bytes_ -= item_bytes_.front();
    item_bytes_.pop_front();
    return item;
  }

  const size_t capacity_;
  const size_t max_bytes_;
  mutable absl::Mutex mu_;
  std::deque<T> items_ ABSL_GUARDED_BY(mu_);
  std::deque<size_t> item_bytes_ ABSL_GUARDED_BY(mu_);  // each item's BytesOf
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool overflowed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_UTIL_MAILBOX_H_
