// UnstoredWrites: what failed job store commits could not store and the next commit that succeeds
// writes first (JobController::Commit): the rows of attempts that ended, worker rows, the
// workers forgotten and events.
// The jobs' own rows are not here: a failed commit leaves its jobs dirty, and the next commit
// writes their latest state.
//
// Bounded for as long as the store fails (a full disk for hours, workers reconnecting every few
// seconds): rows are upserts, so only the latest row of each (job, attempt) and of each worker is
// kept, and at most max_events events: beyond that the oldest are dropped and one event
// (EventsDropped) says how many, in their place.
//
// Not thread-safe: its owner serializes calls (the JobController).
#ifndef DROPLESS_COORDINATOR_CONTROLLER_UNSTORED_WRITES_H_
#define DROPLESS_COORDINATOR_CONTROLLER_UNSTORED_WRITES_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "coordinator/store/job_store.h"
#include "dropless/v1/types.pb.h"

namespace dropless::coordinator {

class UnstoredWrites {
 public:
  static constexpr size_t kMaxEvents = 10000;

  explicit UnstoredWrites(size_t max_events = kMaxEvents)
      : max_events_(max_events > 0 ? max_events : 1) {}

  bool empty() const {
    return attempts_.empty() && workers_.empty() && forgotten_workers_.empty() &&
           last_worker_number_ == 0 && events_.empty() && dropped_events_ == 0;
  }
  // Keeps the attempts, workers and events of a write whose commit failed: newer than what is
  // kept, so a row replaces the kept row of the same attempt or worker, and events come after.
  void Keep(std::vector<AttemptRecord> attempts, std::vector<WorkerRecord> workers,
            std::vector<v1::Event> events);
  // Keeps the workers a failed commit forgot (their kept rows go: a forgotten id is never given
  // again) and the highest worker number it recorded.
  void KeepForgotten(const std::vector<std::string>& worker_ids, int64_t last_worker_number);
  // Puts what is kept before the rows and events of `write` (which are newer), with the event
  // that counts the dropped ones first, where they were.
  void PrependTo(StoreWrite& write) const;
  // The write that PrependTo filled is stored.
  void Clear();

  size_t attempts() const { return attempts_.size(); }
  size_t workers() const { return workers_.size(); }
  size_t forgotten_workers() const { return forgotten_workers_.size(); }
  size_t events() const { return events_.size(); }
  int64_t dropped_events() const { return dropped_events_; }

 private:
  const size_t max_events_;
  std::vector<AttemptRecord> attempts_;  // one per (job, attempt)
  std::vector<WorkerRecord> workers_;    // one per worker id
  std::vector<std::string> forgotten_workers_;  // each once
  int64_t last_worker_number_ = 0;
  std::deque<v1::Event> events_;         // oldest first, at most max_events_
  int64_t dropped_events_ = 0;           // the oldest, beyond max_events_
  int64_t first_dropped_time_ms_ = 0;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_CONTROLLER_UNSTORED_WRITES_H_
