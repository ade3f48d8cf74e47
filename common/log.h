// The one log facility of every dropless binary (coordinator, worker daemon; the CLI prints
// user-facing errors instead): one line per call on stderr,
//   2024-05-01T12:00:00.123Z I dropless-coordinator: message
// (UTC time with milliseconds, level I / W / E, the program's name). Each line goes out in one
// write(2), so lines from several threads, or from processes sharing stderr, do not interleave.
#ifndef DROPLESS_COMMON_LOG_H_
#define DROPLESS_COMMON_LOG_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dropless {

void LogInfo(absl::string_view message);
void LogWarning(absl::string_view message);
void LogError(absl::string_view message);

// The line LogInfo/LogWarning/LogError write (with its newline), for tests.
std::string FormatLogLine(absl::Time time, char level, absl::string_view program,
                          absl::string_view message);

}  // namespace dropless

#endif  // DROPLESS_COMMON_LOG_H_
