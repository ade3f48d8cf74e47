// PhaseReporter: the rank side of the hang watchdog. It listens to the engine's phase hook
// (common/step_phase.h) and a thread of its own writes the latest phase to the report pipe as a
// phase line, only when it changed and at most every kInterval, so the line rate stays bounded
// however short the steps are, while the time a phase was entered is exact.
//
// Test hook: DROPLESS_TEST_STALL="phase=gemm,step=3,rank=1,attempt=1,seconds=60" makes the
// engine's thread sleep once when it enters that phase (rank, step and attempt optional: any);
// the integration tests stall a CPU rank with it to see the watchdog abort the attempt.
#ifndef DROPLESS_WORKER_RANK_PHASE_REPORTER_H_
#define DROPLESS_WORKER_RANK_PHASE_REPORTER_H_

#include <cstdint>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace dropless {

class PhaseReporter {
 public:
  static constexpr absl::Duration kInterval = absl::Milliseconds(100);

  // One per process. report_fd < 0: phases are tracked but not written (manual runs).
  // InvalidArgument when DROPLESS_TEST_STALL is set but malformed.
  static absl::Status Start(int report_fd, int rank, int attempt);
  // Removes the listener and stops the thread (also at exit).
  static void Stop();
  // The step the phases entered from now on belong to.
  static void SetStep(int64_t step);
};

}  // namespace dropless

#endif  // DROPLESS_WORKER_RANK_PHASE_REPORTER_H_
