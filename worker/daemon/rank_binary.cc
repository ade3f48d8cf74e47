#include "worker/daemon/rank_binary.h"

#include <limits.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dropless {

absl::StatusOr<std::string> FindRankBinary() {
  char self[PATH_MAX + 1];
  ssize_t n = readlink("/proc/self/exe", self, PATH_MAX);
  if (n <= 0) return absl::NotFoundError("cannot read /proc/self/exe to find dropless-worker-rank");
  std::string path(self, n);
  // A binary replaced on disk after start reads as "<path> (deleted)"; its directory still counts.
  if (absl::EndsWith(path, " (deleted)")) path.resize(path.size() - 10);
  std::string dir = path.substr(0, path.rfind('/') + 1);
  std::string rank = absl::StrCat(dir, kRankBinaryName);
  if (access(rank.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(rank, " not found or not executable: install ",
                                            kRankBinaryName, " next to dropless-worker"));
  }
  return rank;
}

}  // namespace dropless
