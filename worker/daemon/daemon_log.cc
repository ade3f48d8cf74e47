#include "worker/daemon/daemon_log.h"

#include <cstdio>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dropless {

void DaemonLog(absl::string_view message) {
  std::string line = absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
      " dropless-worker: ", message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);  // one write per line keeps threads apart
  std::fflush(stderr);
}

}  // namespace dropless
