// One-line diagnostics of the worker daemon on stderr ("2024-05-01T12:00:00.123Z dropless-worker: ...").
#ifndef DROPLESS_WORKER_DAEMON_DAEMON_LOG_H_
#define DROPLESS_WORKER_DAEMON_DAEMON_LOG_H_

#include "absl/strings/string_view.h"

namespace dropless {

void DaemonLog(absl::string_view message);

}  // namespace dropless

#endif  // DROPLESS_WORKER_DAEMON_DAEMON_LOG_H_
