#include "coordinator/controller/unstored_writes.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"

namespace dropless::coordinator {

void UnstoredWrites::Keep(std::vector<AttemptRecord> attempts, std::vector<WorkerRecord> workers,
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
  for (WorkerRecord& worker : workers) {
    auto same = std::find_if(workers_.begin(), workers_.end(), [&](const WorkerRecord& w) {
      return w.info.id() == worker.info.id();
    });
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

void UnstoredWrites::KeepForgotten(const std::vector<std::string>& worker_ids,
                                   int64_t last_worker_number) {
  for (const std::string& id : worker_ids) {
    workers_.erase(std::remove_if(workers_.begin(), workers_.end(),
                                  [&](const WorkerRecord& w) { return w.info.id() == id; }),
                   workers_.end());
    if (std::find(forgotten_workers_.begin(), forgotten_workers_.end(), id) ==
        forgotten_workers_.end()) {
      forgotten_workers_.push_back(id);
    }
  }
  last_worker_number_ = std::max(last_worker_number_, last_worker_number);
}

void UnstoredWrites::PrependTo(StoreWrite& write) const {
  write.attempts.insert(write.attempts.begin(), attempts_.begin(), attempts_.end());
  write.workers.insert(write.workers.begin(), workers_.begin(), workers_.end());
  // Deleted after every upsert of the write (JobStore::Commit), whatever their order here.
  write.forgotten_workers.insert(write.forgotten_workers.begin(), forgotten_workers_.begin(),
                                 forgotten_workers_.end());
  write.last_worker_number = std::max(write.last_worker_number, last_worker_number_);
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
  forgotten_workers_.clear();
  last_worker_number_ = 0;
  events_.clear();
  dropped_events_ = 0;
  first_dropped_time_ms_ = 0;
}

}  // namespace dropless::coordinator
