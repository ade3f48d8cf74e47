#include "worker/rank/checkpoint_roots.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace dropless {
namespace {

// Whether `path` (absolute) has an empty, "." or ".." component (a trailing slash aside).
bool HasDotComponent(absl::string_view path) {
  std::vector<absl::string_view> parts = absl::StrSplit(path.substr(1), '/');
  if (!parts.empty() && parts.back().empty()) parts.pop_back();
  for (absl::string_view part : parts) {
    if (part.empty() || part == "." || part == "..") return true;
  }
  return false;
}

std::string WithoutTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

bool IsAtOrBelow(const std::string& path, const std::string& root) {
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

// `path` as the filesystem resolves it now: realpath of its deepest existing ancestor (itself
// included), followed by the components that do not exist yet.
std::string Resolved(const std::string& path) {
  std::string existing = path, rest;
  struct stat st;
  while (existing.size() > 1 && stat(existing.c_str(), &st) != 0) {
    const size_t slash = existing.rfind('/');
    rest = existing.substr(slash) + rest;
    existing = slash == 0 ? "/" : existing.substr(0, slash);
  }
  std::unique_ptr<char, decltype(&free)> real(realpath(existing.c_str(), nullptr), &free);
  if (real == nullptr) return path;  // unreadable: as written (the lexical check still holds)
  std::string out = real.get();
  if (out == "/" && !rest.empty()) return rest;
  return out + rest;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseCheckpointRoots(absl::string_view text,
                                                              absl::string_view field) {
  std::vector<std::string> roots;
  if (text.empty()) return roots;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::string root = WithoutTrailingSlashes(std::string(part));
    if (root.empty() || root[0] != '/' || root == "/" || HasDotComponent(root)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": each root must be an absolute directory other than /, without "
                              ". or .. components (got '", part, "')"));
    }
    roots.push_back(std::move(root));
  }
  return roots;
}

std::string JoinCheckpointRoots(const std::vector<std::string>& roots) {
  return absl::StrJoin(roots, ",");
}

absl::Status CheckCheckpointDirInRoots(const std::string& dir,
                                       const std::vector<std::string>& roots) {
  if (roots.empty()) return absl::OkStatus();
  const std::string written = WithoutTrailingSlashes(dir);
  if (!written.empty() && written[0] == '/' && !HasDotComponent(written)) {
    const std::string resolved = Resolved(written);
    for (const std::string& root : roots) {
      if (IsAtOrBelow(written, root) && IsAtOrBelow(resolved, Resolved(root))) {
        return absl::OkStatus();
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "checkpoint.dir: ", dir, " is not inside this worker's checkpoint roots (",
      JoinCheckpointRoots(roots), ", the daemon's --checkpoint-roots; symbolic links resolved)"));
}

}  // namespace dropless
