#include "cli/reconnect.h"

#include <iostream>

#include "absl/time/clock.h"

namespace dropless::cli {

bool Reconnection::Retry(const grpc::Status& status, const std::function<void()>& on_first_loss) {
  if (lost_since_ == absl::InfiniteFuture()) {
    lost_since_ = absl::Now();
    if (on_first_loss) on_first_loss();
    std::cerr << command_ << ": lost the coordinator (" << status.error_message()
              << "); reconnecting\n";
  }
  if (absl::Now() - lost_since_ > kWindow) return false;
  absl::SleepFor(absl::Seconds(1));
  return true;
}

}  // namespace dropless::cli
