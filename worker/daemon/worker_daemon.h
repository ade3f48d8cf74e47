// RunWorkerDaemon: `dropless-worker` without a subcommand. Plans the slots (GPUs found through the
// driver, or CPU slots), serves /metrics, keeps the coordinator session, supervises rank processes,
// and on SIGTERM or SIGINT stops its ranks (SIGTERM, SIGKILL after the grace period), reports
// their end if the session is up, and returns; a second SIGTERM or SIGINT meanwhile SIGKILLs the
// ranks at once and cuts the rest short (daemon_stop.h).
#ifndef DROPLESS_WORKER_DAEMON_WORKER_DAEMON_H_
#define DROPLESS_WORKER_DAEMON_WORKER_DAEMON_H_

#include "worker/daemon/worker_config.h"

namespace dropless {

// Must be called before the process starts any thread (it blocks SIGTERM/SIGINT in every thread
// and waits for them on the calling one). Returns the process exit code.
int RunWorkerDaemon(const WorkerConfig& config, const HostFacts& host);

}  // namespace dropless

#endif  // DROPLESS_WORKER_DAEMON_WORKER_DAEMON_H_
