#include "coordinator/controller/hang_watchdog.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_format.h"

namespace dropless::coordinator {

void StepTimes::Add(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return;
  recent_.push_back(seconds);
  if (recent_.size() > kWindow) recent_.pop_front();
}

std::optional<double> StepTimes::Median() const {
  if (recent_.empty()) return std::nullopt;
  std::vector<double> sorted(recent_.begin(), recent_.end());
  const size_t mid = sorted.size() / 2;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(mid), sorted.end());
  return sorted[mid];
}

std::optional<int64_t> StallLimitMs(const HangWatchdogOptions& options,
                                    std::optional<double> median_step_seconds) {
  if (options.step_multiple <= 0) return std::nullopt;
  if (!median_step_seconds.has_value()) {
    return std::max(options.min_stall_ms, options.first_step_ms);
  }
  const double scaled_ms = options.step_multiple * *median_step_seconds * 1000.0;
  return std::max(options.min_stall_ms,
                  static_cast<int64_t>(std::min(scaled_ms, 1e15)));
}

std::tuple<int64_t, bool, int64_t> BlameKey(int64_t step, const std::string& phase,
                                            int64_t since_ms) {
  const bool waits_for_peers = phase == "dispatch" || phase == "combine" || phase == "optimizer";
  return {step, waits_for_peers, since_ms};
}

std::string DescribeStallLimit(const HangWatchdogOptions& options,
                               std::optional<double> median_step_seconds) {
  if (!median_step_seconds.has_value()) {
    return absl::StrFormat("no step time yet, at least %.1f s",
                           static_cast<double>(std::max(options.min_stall_ms,
                                                        options.first_step_ms)) / 1000.0);
  }
  return absl::StrFormat("%g x median step %.3f s, at least %.1f s", options.step_multiple,
                         *median_step_seconds, static_cast<double>(options.min_stall_ms) / 1000.0);
}

}  // namespace dropless::coordinator
