// RankOptions: the command line of a rank process (docs/architecture.md, "Rank process"):
//   dropless-worker rank --coordinator ADDR --job ID --attempt N --rank R --world-size W
//                        --slot S --spec FILE --host ADDR --node NAME --report-fd 3
#ifndef DROPLESS_WORKER_RANK_RANK_OPTIONS_H_
#define DROPLESS_WORKER_RANK_RANK_OPTIONS_H_

#include <string>

#include "absl/status/status.h"

namespace dropless {

struct RankOptions {
  std::string coordinator;  // host:port of the coordinator (rendezvous service)
  std::string job_id;
  int attempt = 0;          // >= 1
  int rank = -1;            // 0 <= rank < world_size
  int world_size = 0;
  int slot = -1;            // GPU index or CPU slot on the node
  std::string spec_path;    // job spec YAML written by the daemon
  std::string host;         // address this rank listens on for its peers
  std::string node;
  int report_fd = -1;       // pipe to the daemon; -1: no reports (manual runs)
};

// InvalidArgument naming the flag (--rank, --world-size, ...) when a value is missing or out of range.
absl::Status ValidateRankOptions(const RankOptions& options);

}  // namespace dropless

#endif  // DROPLESS_WORKER_RANK_RANK_OPTIONS_H_
