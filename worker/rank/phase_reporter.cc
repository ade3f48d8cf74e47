#include "worker/rank/phase_reporter.h"

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/step_phase.h"
#include "worker/rank/report_pipe.h"

namespace dropless {
namespace {

// A DROPLESS_TEST_STALL request; -1: any.
struct Stall {
  StepPhase phase = StepPhase::kForward;
  int64_t step = -1;
  int rank = -1;
  int attempt = -1;
  absl::Duration length;
};

absl::StatusOr<std::optional<Stall>> ParseStall(const char* text) {
  if (text == nullptr || text[0] == '\0') return std::optional<Stall>();
  Stall stall;
  bool has_phase = false, has_seconds = false;
  for (absl::string_view field : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, '=');
    int64_t number = 0;
    const bool numeric = absl::SimpleAtoi(kv.second, &number) && number >= 0;
    if (kv.first == "phase") {
      std::optional<StepPhase> phase = ParseStepPhase(kv.second);
      if (!phase.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat("DROPLESS_TEST_STALL: phase: unknown '",
                                                       kv.second, "'"));
      }
      stall.phase = *phase;
      has_phase = true;
    } else if (kv.first == "seconds" && numeric) {
      stall.length = absl::Seconds(number);
      has_seconds = true;
    } else if (kv.first == "step" && numeric) {
      stall.step = number;
    } else if (kv.first == "rank" && numeric) {
      stall.rank = static_cast<int>(number);
    } else if (kv.first == "attempt" && numeric) {
      stall.attempt = static_cast<int>(number);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("DROPLESS_TEST_STALL: bad field '", field,
                       "' (phase=P,seconds=N[,step=S][,rank=R][,attempt=A])"));
    }
  }
  if (!has_phase || !has_seconds) {
    return absl::InvalidArgumentError("DROPLESS_TEST_STALL: needs phase=P and seconds=N");
  }
  return std::optional<Stall>(stall);
}

// The process's reporter state; the listener is a plain function, so it lives here.
struct State {
  absl::Mutex mu;
  PhaseReport latest ABSL_GUARDED_BY(mu);
  bool entered ABSL_GUARDED_BY(mu) = false;  // no phase before the first step
  int64_t step ABSL_GUARDED_BY(mu) = 0;
  int fd = -1;
  int rank = -1;
  int attempt = -1;
  std::optional<Stall> stall ABSL_GUARDED_BY(mu);
  absl::Notification stop;
  std::thread writer;
};

State* state = nullptr;

void OnPhase(StepPhase phase) {
  std::optional<absl::Duration> sleep;
  {
    absl::MutexLock lock(&state->mu);
    state->latest = PhaseReport{phase, state->step, absl::ToUnixMillis(absl::Now())};
    state->entered = true;
    const std::optional<Stall>& s = state->stall;
    if (s.has_value() && s->phase == phase && (s->step < 0 || s->step == state->step) &&
        (s->rank < 0 || s->rank == state->rank) &&
        (s->attempt < 0 || s->attempt == state->attempt)) {
      sleep = s->length;
      state->stall.reset();  // once
    }
  }
  if (sleep.has_value()) absl::SleepFor(*sleep);
}

void WriterLoop() {
  PhaseReport written;
  bool any_written = false;
  while (!state->stop.WaitForNotificationWithTimeout(PhaseReporter::kInterval)) {
    PhaseReport now;
    {
      absl::MutexLock lock(&state->mu);
      if (!state->entered) continue;
      now = state->latest;
    }
    if (any_written && now.phase == written.phase && now.step == written.step &&
        now.since_ms == written.since_ms) {
      continue;
    }
    // A failed write (the daemon gone) is the step loop's to report.
    WriteReportLine(state->fd, FormatPhaseLine(now)).IgnoreError();
    written = now;
    any_written = true;
  }
}

}  // namespace

absl::Status PhaseReporter::Start(int report_fd, int rank, int attempt) {
  absl::StatusOr<std::optional<Stall>> stall = ParseStall(std::getenv("DROPLESS_TEST_STALL"));
  if (!stall.ok()) return stall.status();
  if (state != nullptr) return absl::FailedPreconditionError("PhaseReporter already started");
  state = new State;
  state->fd = report_fd;
  state->rank = rank;
  state->attempt = attempt;
  {
    absl::MutexLock lock(&state->mu);
    state->stall = *stall;
  }
  SetStepPhaseListener(&OnPhase);
  if (report_fd >= 0) state->writer = std::thread(WriterLoop);
  return absl::OkStatus();
}

void PhaseReporter::Stop() {
  if (state == nullptr) return;
  SetStepPhaseListener(nullptr);
  state->stop.Notify();
  if (state->writer.joinable()) state->writer.join();
  // The State stays: a listener call that loaded the pointer just before may still run.
}

void PhaseReporter::SetStep(int64_t step) {
  if (state == nullptr) return;
  absl::MutexLock lock(&state->mu);
  state->step = step;
}

}  // namespace dropless
