// StreamLimiter: how many streaming calls (WatchJob, GetLogs) may be open at once, per
// authenticated user and in all. Each holds a server thread, a mailbox of up to 8 MiB
// (watch_hub.h) and, for GetLogs, a backlog page of up to 8 MiB: without a bound, a client that
// opens streams and never reads them runs the coordinator out of threads and memory.
// Thread-safe.
#ifndef DROPLESS_COORDINATOR_AUTH_STREAM_LIMITER_H_
#define DROPLESS_COORDINATOR_AUTH_STREAM_LIMITER_H_

#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace dropless::coordinator {

class StreamLimiter {
 public:
  StreamLimiter(int per_user, int total) : per_user_(per_user), total_(total) {}

  // One open stream, released when destroyed.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept : limiter_(other.limiter_), user_(std::move(other.user_)) {
      other.limiter_ = nullptr;
    }
    Slot& operator=(Slot&&) = delete;
    ~Slot() {
      if (limiter_ != nullptr) limiter_->Release(user_);
    }

   private:
    friend class StreamLimiter;
    Slot(StreamLimiter* limiter, std::string user) : limiter_(limiter), user_(std::move(user)) {}
    StreamLimiter* limiter_ = nullptr;
    std::string user_;  // "" when not counted per user
  };

  // A slot for a stream of `user` ("": the anonymous caller of a plaintext listener, counted in
  // the total only); RESOURCE_EXHAUSTED naming the limit when none is left.
  absl::StatusOr<Slot> Acquire(const std::string& user);

  int per_user() const { return per_user_; }
  int total() const { return total_; }

 private:
  void Release(const std::string& user);

  const int per_user_;
  const int total_;
  absl::Mutex mu_;
  int open_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> open_by_user_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_AUTH_STREAM_LIMITER_H_
