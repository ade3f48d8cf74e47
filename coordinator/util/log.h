// Coordinator log lines on stderr: "2024-05-01T12:00:00.123Z I message". One line per call; safe
// from any thread (one write(2) per line).
#ifndef DROPLESS_COORDINATOR_UTIL_LOG_H_
#define DROPLESS_COORDINATOR_UTIL_LOG_H_

#include "absl/strings/string_view.h"

namespace dropless::coordinator {

void LogInfo(absl::string_view message);
void LogWarning(absl::string_view message);
void LogError(absl::string_view message);

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_UTIL_LOG_H_
