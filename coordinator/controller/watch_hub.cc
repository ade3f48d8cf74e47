#include "coordinator/controller/watch_hub.h"

#include <algorithm>

namespace dropless::coordinator {

std::shared_ptr<Mailbox<v1::JobUpdate>> WatchHub::Watch(const std::string& job_id) {
  auto updates = std::make_shared<Mailbox<v1::JobUpdate>>(update_capacity_, update_bytes_);
  absl::MutexLock lock(&mu_);
  jobs_[job_id].watchers.push_back(updates);
  return updates;
}

void WatchHub::EndWatch(const std::string& job_id,
                        const std::shared_ptr<Mailbox<v1::JobUpdate>>& updates) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  auto& watchers = it->second.watchers;
  watchers.erase(std::remove(watchers.begin(), watchers.end(), updates), watchers.end());
  if (it->second.empty()) jobs_.erase(it);
}

std::shared_ptr<Mailbox<v1::LogLine>> WatchHub::FollowLogs(const std::string& job_id,
                                                           std::optional<int32_t> rank) {
  auto live = std::make_shared<Mailbox<v1::LogLine>>(log_capacity_, log_bytes_);
  absl::MutexLock lock(&mu_);
  jobs_[job_id].logs.emplace_back(rank, live);
  return live;
}

void WatchHub::EndLogs(const std::string& job_id,
                       const std::shared_ptr<Mailbox<v1::LogLine>>& live) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  auto& logs = it->second.logs;
  logs.erase(std::remove_if(logs.begin(), logs.end(),
                            [&](const auto& follower) { return follower.second == live; }),
             logs.end());
  if (it->second.empty()) jobs_.erase(it);
}

bool WatchHub::Watched(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it != jobs_.end() && !it->second.watchers.empty();
}

void WatchHub::Publish(const std::string& job_id, v1::JobUpdate update) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  auto& watchers = it->second.watchers;
  for (size_t i = 0; i < watchers.size(); ++i) {
    if (i + 1 == watchers.size()) {
      watchers[i]->Push(std::move(update));
    } else {
      watchers[i]->Push(update);
    }
  }
}

void WatchHub::PublishLog(const v1::LogLine& line) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(line.job_id());
  if (it == jobs_.end()) return;
  for (auto& [rank, follower] : it->second.logs) {
    if (!rank.has_value() || *rank == line.rank()) follower->Push(line);
  }
}

void WatchHub::Close(Subscribers& subscribers) {
  for (auto& watcher : subscribers.watchers) watcher->Close();
  for (auto& [rank, follower] : subscribers.logs) follower->Close();
}

void WatchHub::CloseJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Close(it->second);
  jobs_.erase(it);
}

void WatchHub::CloseAll() {
  absl::MutexLock lock(&mu_);
  for (auto& [job_id, subscribers] : jobs_) Close(subscribers);
  jobs_.clear();
}

}  // namespace dropless::coordinator
