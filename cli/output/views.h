// Views: API messages turned into the CLI's documented output objects (see cli/README.md, "Output
// schema") and the small text formats the tables use. State names drop the proto prefix:
// JOB_STATE_RUNNING prints as RUNNING.
#ifndef DROPLESS_CLI_OUTPUT_VIEWS_H_
#define DROPLESS_CLI_OUTPUT_VIEWS_H_

#include <cstdint>
#include <string>

#include "cli/output/value.h"
#include "dropless/v1/job_service.pb.h"
#include "dropless/v1/types.pb.h"

namespace dropless::cli {

std::string JobStateName(v1::JobState state);      // PENDING, ..., CANCELLED; UNKNOWN otherwise
std::string WorkerStateName(v1::WorkerState state);  // READY, LOST; UNKNOWN otherwise
bool IsTerminal(v1::JobState state);

Value JobView(const v1::Job& job);
Value WorkerView(const v1::Worker& worker);
Value EventView(const v1::Event& event);
Value MetricsView(const v1::StepMetrics& metrics);
// One `watch -o json` line: the job's id/name/state/attempt/steps, the metrics of this update (or
// the job's latest when the update has none) flattened in, and the event when there is one.
Value WatchUpdateView(const v1::JobUpdate& update);

int64_t NowMs();
// "2024-05-01T12:00:00.123Z"; null Value / "-" for 0 (not set).
Value TimeValue(int64_t unix_ms);
std::string TimeText(int64_t unix_ms);
// Compact age of a past instant, e.g. "45s", "12m", "3h", "2d"; "-" when not set.
std::string AgeText(int64_t since_ms, int64_t now_ms);
// A duration for humans: "0.123s" below 10s, then "42s", "3m05s", "1h02m".
std::string DurationText(double seconds);
// "12/40", or "-/40" before the first step.
std::string StepText(const v1::Job& job);
// One line of `logs` text output: "[rank R] " when with_rank, the rank's text and a newline unless
// it ends with one. terminal_safe: the text made TerminalSafe (output/terminal_text.h), for a
// terminal; else its bytes as the rank wrote them.
std::string LogLineText(const v1::LogLine& line, bool with_rank, bool terminal_safe);

}  // namespace dropless::cli

#endif  // DROPLESS_CLI_OUTPUT_VIEWS_H_
