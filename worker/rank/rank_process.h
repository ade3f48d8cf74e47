// RunRankProcess: `dropless-worker rank ...`. Parses the job spec, joins the attempt's groups
// through the coordinator's rendezvous service, builds the engine, runs every step and reports
// each one to the daemon (worker/rank/step_report.h) over --report-fd. Progress lines go to
// stdout, errors to stderr (both become the rank's log).
#ifndef DROPLESS_WORKER_RANK_RANK_PROCESS_H_
#define DROPLESS_WORKER_RANK_RANK_PROCESS_H_

#include "worker/rank/rank_options.h"

namespace dropless {

// Process exit code: 0 when every step ran, 2 on bad options. On any other error (printed as one
// "error: ..." line), RankExitCodeFor's (common/job_error.h): 78 (kRankExitJobError) for an error
// of the job itself, which the coordinator does not retry; 79 (kRankExitDeviceTooSmall) when the
// job needs more memory than its GPU has; 1 otherwise.
int RunRankProcess(const RankOptions& options);

}  // namespace dropless

#endif  // DROPLESS_WORKER_RANK_RANK_PROCESS_H_
