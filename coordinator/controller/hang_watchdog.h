// Hang watchdog policy: how long a rank may stay in one phase of its step before its attempt is
// declared hung. Ranks report the phase they entered last and when (heartbeats carry it); a rank
// that stays in one phase for more than step_multiple x the job's median step time (and at least
// min_stall_ms) is stuck, e.g. in an all-to-all whose peer died or deadlocked. Before any step
// time is known (start-up, the first step, a resumed attempt's first step) the limit is
// first_step_ms. The Coordinator aborts the attempt (rank processes stopped), records a
// RankStuck event naming the rank, node and phase, and retries per max_attempts.
#ifndef DROPLESS_COORDINATOR_CONTROLLER_HANG_WATCHDOG_H_
#define DROPLESS_COORDINATOR_CONTROLLER_HANG_WATCHDOG_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <tuple>

namespace dropless::coordinator {

struct HangWatchdogOptions {
  double step_multiple = 20;        // 0 turns the watchdog off
  int64_t min_stall_ms = 60000;     // never less than this
  int64_t first_step_ms = 600000;   // while no step time is known
};

// The most recent step times of a job (any rank, any attempt: the shape does not change).
class StepTimes {
 public:
  static constexpr size_t kWindow = 64;
  void Add(double seconds);
  std::optional<double> Median() const;

 private:
  std::deque<double> recent_;
};

// How long a rank may stay in one phase; nullopt when the watchdog is off.
std::optional<int64_t> StallLimitMs(const HangWatchdogOptions& options,
                                    std::optional<double> median_step_seconds);

// Which of an attempt's stuck ranks to blame: the smallest key. The rank furthest behind (lowest
// step); at the same step, one busy on its own (forward, gemm, backward, checkpoint) before one
// waiting for its peers in a collective (dispatch, combine, and the optimizer's gradient
// reductions), since those wait for the first; then the one that entered its phase first.
std::tuple<int64_t, bool, int64_t> BlameKey(int64_t step, const std::string& phase,
                                            int64_t since_ms);

// "20 x median step 0.052 s, at least 60 s" or "no step time yet".
std::string DescribeStallLimit(const HangWatchdogOptions& options,
                               std::optional<double> median_step_seconds);

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_CONTROLLER_HANG_WATCHDOG_H_
