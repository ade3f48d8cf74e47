#include "cli/reconnect.h"

#include <unistd.h>

#include <iostream>

#include "absl/time/clock.h"
#include "cli/output/terminal_text.h"

namespace dropless::cli {

bool Reconnection::LostCoordinator(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

bool Reconnection::Retry(const grpc::Status& status, const std::function<void()>& on_first_loss) {
  if (lost_since_ == absl::InfiniteFuture()) {
    lost_since_ = absl::Now();
    if (on_first_loss) on_first_loss();
    std::cerr << command_ << ": lost the coordinator ("
              << ForDisplay(status.error_message(), STDERR_FILENO) << "); reconnecting\n";
  }
  if (absl::Now() - lost_since_ > kWindow) return false;
  absl::SleepFor(absl::Seconds(1));
  return true;
}

}  // namespace dropless::cli
