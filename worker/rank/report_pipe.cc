#include "worker/rank/report_pipe.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include <string>

#include "absl/base/const_init.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace dropless {
namespace {

ABSL_CONST_INIT absl::Mutex report_mu(absl::kConstInit);

}  // namespace

absl::Status WriteReportLine(int fd, absl::string_view line) {
  if (fd < 0) return absl::OkStatus();
  const std::string text = absl::StrCat(line, "\n");
  absl::MutexLock lock(&report_mu);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::UnavailableError(absl::StrCat("report pipe (fd ", fd, "): ", strerror(errno),
                                                 "; is the worker daemon gone?"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace dropless
