// The rank process's report pipe to its worker daemon (fd 3): the ready line, step lines and phase
// lines. Every line is written whole under one process-wide lock: the engine's thread (steps) and
// the phase reporter's thread write to the same pipe, and a step line (with up to 1024 experts'
// token counts) is longer than PIPE_BUF, so a single write of it is not atomic.
#ifndef DROPLESS_WORKER_RANK_REPORT_PIPE_H_
#define DROPLESS_WORKER_RANK_REPORT_PIPE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dropless {

// Writes `line` and a newline to `fd` (nothing when fd < 0). Unavailable naming the fd when the
// write fails (the daemon's end is closed: SIGPIPE is ignored in the rank process).
absl::Status WriteReportLine(int fd, absl::string_view line);

}  // namespace dropless

#endif  // DROPLESS_WORKER_RANK_REPORT_PIPE_H_
