// Where the rank process image lives: dropless-worker-rank in the directory of the running
// dropless-worker (see worker/rank/rank_main.cc for why it is a separate image).
#ifndef DROPLESS_WORKER_DAEMON_RANK_BINARY_H_
#define DROPLESS_WORKER_DAEMON_RANK_BINARY_H_

#include <string>

#include "absl/status/statusor.h"

namespace dropless {

inline constexpr char kRankBinaryName[] = "dropless-worker-rank";

// Path of dropless-worker-rank next to /proc/self/exe; NotFound naming the path looked at.
absl::StatusOr<std::string> FindRankBinary();

}  // namespace dropless

#endif  // DROPLESS_WORKER_DAEMON_RANK_BINARY_H_
