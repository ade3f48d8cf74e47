// RunRankProcess: `dropless-worker rank ...`. Parses the job spec, joins the attempt's groups
// through the coordinator's rendezvous service, builds the engine, runs every step and reports
// each one to the daemon (worker/rank/step_report.h) over --report-fd. Progress lines go to
// stdout, errors to stderr (both become the rank's log).
#ifndef DROPLESS_WORKER_RANK_RANK_PROCESS_H_
#define DROPLESS_WORKER_RANK_RANK_PROCESS_H_

#include "worker/rank/rank_options.h"

namespace dropless {

// Process exit code: 0 when every step ran, 1 on any error (printed as one "error: ..." line),
// 2 on bad options.
int RunRankProcess(const RankOptions& options);

}  // namespace dropless

#endif  // DROPLESS_WORKER_RANK_RANK_PROCESS_H_
