#include "common/log.h"

#include <errno.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dropless {
namespace {

void Write(char level, absl::string_view message) {
  // glibc's short name of argv[0]: "dropless-coordinator", "dropless-worker".
  const std::string line =
      FormatLogLine(absl::Now(), level, program_invocation_short_name, message);
  size_t done = 0;
  while (done < line.size()) {
    ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nowhere left to report a failing stderr
    done += static_cast<size_t>(n);
  }
}

}  // namespace

std::string FormatLogLine(absl::Time time, char level, absl::string_view program,
                          absl::string_view message) {
  return absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone()), " ",
                      absl::string_view(&level, 1), " ", program, ": ", message, "\n");
}

void LogInfo(absl::string_view message) { Write('I', message); }
void LogWarning(absl::string_view message) { Write('W', message); }
void LogError(absl::string_view message) { Write('E', message); }

}  // namespace dropless
