#include "coordinator/auth/stream_limiter.h"

#include "absl/strings/str_cat.h"

namespace dropless::coordinator {

absl::StatusOr<StreamLimiter::Slot> StreamLimiter::Acquire(const std::string& user) {
  absl::MutexLock lock(&mu_);
  if (open_ >= total_) {
    return absl::ResourceExhaustedError(absl::StrCat("the coordinator has ", open_,
                                                     " streams open (WatchJob, GetLogs), its limit "
                                                     "(--max-streams ",
                                                     total_, "); try again later"));
  }
  if (!user.empty()) {
    int& mine = open_by_user_[user];
    if (mine >= per_user_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("user ", user, " has ", mine,
                       " streams open (WatchJob, GetLogs), the limit "
                       "per user (--max-streams-per-user ",
                       per_user_, "); end one first"));
    }
    ++mine;
  }
  ++open_;
  return Slot(this, user);
}

void StreamLimiter::Release(const std::string& user) {
  absl::MutexLock lock(&mu_);
  --open_;
  if (user.empty()) return;
  auto it = open_by_user_.find(user);
  if (it != open_by_user_.end() && --it->second <= 0) open_by_user_.erase(it);
}

}  // namespace dropless::coordinator
