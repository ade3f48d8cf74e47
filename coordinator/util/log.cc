#include "coordinator/util/log.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dropless::coordinator {
namespace {

void Write(char level, absl::string_view message) {
  std::string line = absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()), " ",
      absl::string_view(&level, 1), " ", message, "\n");
  size_t done = 0;
  while (done < line.size()) {
    ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n <= 0) return;  // nowhere left to report a failing stderr
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void LogInfo(absl::string_view message) { Write('I', message); }
void LogWarning(absl::string_view message) { Write('W', message); }
void LogError(absl::string_view message) { Write('E', message); }

}  // namespace dropless::coordinator
