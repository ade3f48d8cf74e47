// WatchHub: the fan-out of a job's updates and log lines to the streams that follow it (WatchJob,
// GetLogs --follow), one bounded mailbox per stream. The Coordinator decides what is published
// and when a job's streams end; the hub only holds the subscribers.
//
// Thread-safe, with a lock of its own: a stream that ends unsubscribes without the
// Coordinator's lock. The Coordinator calls in while holding its own lock (never the reverse), so
// a Subscribe made after checking that the job is active cannot miss that job's CloseJob.
#ifndef DROPLESS_COORDINATOR_CONTROLLER_WATCH_HUB_H_
#define DROPLESS_COORDINATOR_CONTROLLER_WATCH_HUB_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/util/mailbox.h"
#include "dropless/v1/job_service.pb.h"

namespace dropless::coordinator {

class WatchHub {
 public:
  // Each stream's mailbox holds at most *_capacity items and *_bytes serialized bytes (a reader
  // that does not read, e.g. a paused `logs -f | less`, pins no more); past them it overflows.
  WatchHub(size_t update_capacity, size_t log_capacity, size_t update_bytes = kUpdateBytes,
           size_t log_bytes = kLogBytes)
      : update_capacity_(update_capacity),
        log_capacity_(log_capacity),
        update_bytes_(update_bytes),
        log_bytes_(log_bytes) {}
  static constexpr size_t kUpdateBytes = size_t{8} << 20;
  static constexpr size_t kLogBytes = size_t{8} << 20;

  std::shared_ptr<Mailbox<v1::JobUpdate>> Watch(const std::string& job_id);
  void EndWatch(const std::string& job_id, const std::shared_ptr<Mailbox<v1::JobUpdate>>& updates);
  // rank unset: every rank's lines.
  std::shared_ptr<Mailbox<v1::LogLine>> FollowLogs(const std::string& job_id,
                                                   std::optional<int32_t> rank);
  void EndLogs(const std::string& job_id, const std::shared_ptr<Mailbox<v1::LogLine>>& live);

  // Whether anyone watches the job (updates nobody reads need not be built).
  bool Watched(const std::string& job_id) const;
  void Publish(const std::string& job_id, v1::JobUpdate update);
  void PublishLog(const v1::LogLine& line);

  // The job is over: its streams get what is queued, then end.
  void CloseJob(const std::string& job_id);
  // Shutdown: every stream ends.
  void CloseAll();

 private:
  struct Subscribers {
    std::vector<std::shared_ptr<Mailbox<v1::JobUpdate>>> watchers;
    std::vector<std::pair<std::optional<int32_t>, std::shared_ptr<Mailbox<v1::LogLine>>>> logs;
    bool empty() const { return watchers.empty() && logs.empty(); }
  };
  void Close(Subscribers& subscribers);

  const size_t update_capacity_;
  const size_t log_capacity_;
  const size_t update_bytes_;
  const size_t log_bytes_;
  mutable absl::Mutex mu_;
  std::map<std::string, Subscribers> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_CONTROLLER_WATCH_HUB_H_
