// Where a job's checkpoint.dir may be on a worker: the daemon's --checkpoint-roots, which it
// passes to its ranks in DROPLESS_CHECKPOINT_ROOTS. Without roots a rank writes its checkpoints
// wherever the spec says and the rank may write (a development setup); with them, a spec cannot
// make a rank write outside them (the node's work volume, /dev/shm, /tmp: docs/security.md).
#ifndef DROPLESS_WORKER_RANK_CHECKPOINT_ROOTS_H_
#define DROPLESS_WORKER_RANK_CHECKPOINT_ROOTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dropless {

inline constexpr char kCheckpointRootsEnv[] = "DROPLESS_CHECKPOINT_ROOTS";

// "/a,/b" -> {"/a", "/b"} ("" -> none): each absolute, without "." or ".." components, "/"
// excluded (it would allow everything); trailing slashes dropped. InvalidArgument naming
// `field` otherwise.
absl::StatusOr<std::vector<std::string>> ParseCheckpointRoots(absl::string_view text,
                                                              absl::string_view field);
std::string JoinCheckpointRoots(const std::vector<std::string>& roots);

// OK when `dir` is one of `roots` or below one, both as written (no "." or ".." component) and
// as the filesystem resolves it now (its deepest existing directory through realpath: a symbolic
// link out of a root is refused). InvalidArgument naming checkpoint.dir and the roots otherwise.
// No roots: OK.
absl::Status CheckCheckpointDirInRoots(const std::string& dir,
                                       const std::vector<std::string>& roots);

}  // namespace dropless

#endif  // DROPLESS_WORKER_RANK_CHECKPOINT_ROOTS_H_
