#include "coordinator/controller/unstored_writes.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"

namespace dropless::coordinator {

void UnstoredWrites::Keep(std::vector<AttemptRecord> attempts, std::vector<v1::Worker> workers,
                          std::vector<v1::Event> events) {
  for (AttemptRecord& attempt : attempts) {
    auto same = std::find_if(attempts_.begin(), attempts_.end(), [&](const AttemptRecord& a) {
      return a.job_id == attempt.job_id && a.attempt == attempt.attempt;
    });
    if (same != attempts_.end()) {
      *same = std::move(attempt);
    } else {
      attempts_.push_back(std::move(attempt));
    }
  }
  for (v1::Worker& worker : workers) {
    auto same = std::find_if(workers_.begin(), workers_.end(),
                             [&](const v1::Worker& w) { return w.id() == worker.id(); });
    if (same != workers_.end()) {
      *same = std::move(worker);
    } else {
      workers_.push_back(std::move(worker));
    }
  }
  for (v1::Event& event : events) {
    if (events_.size() >= max_events_) {
      if (dropped_events_ == 0) first_dropped_time_ms_ = events_.front().time_ms();
      ++dropped_events_;
      events_.pop_front();
    }
    events_.push_back(std::move(event));
  }
}

void UnstoredWrites::PrependTo(StoreWrite& write) const {
  write.attempts.insert(write.attempts.begin(), attempts_.begin(), attempts_.end());
  write.workers.insert(write.workers.begin(), workers_.begin(), workers_.end());
  write.events.insert(write.events.begin(), events_.begin(), events_.end());
  if (dropped_events_ > 0) {
    v1::Event summary;
    summary.set_time_ms(first_dropped_time_ms_);
    summary.set_type("EventsDropped");
    summary.set_message(absl::StrFormat(
        "%d events were dropped while the job store failed to commit (the oldest: at most %d "
        "are kept until it takes them)",
        dropped_events_, max_events_));
    write.events.insert(write.events.begin(), std::move(summary));
  }
}

void UnstoredWrites::Clear() {
  attempts_.clear();
  workers_.clear();
  events_.clear();
  dropped_events_ = 0;
  first_dropped_time_ms_ = 0;
}

}  // namespace dropless::coordinator
