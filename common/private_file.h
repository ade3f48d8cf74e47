// Files that hold secrets a process reads at start (the coordinator's tokens file, a user's
// token file) must be readable and writable by their owner only, and owned by the reader (or
// root), as ssh requires of a private key: anyone else who can read one can act as its users, and
// anyone who can write one can make themselves a user.
#ifndef DROPLESS_COMMON_PRIVATE_FILE_H_
#define DROPLESS_COMMON_PRIVATE_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace dropless {

// The contents of the file at `path`, read from the one descriptor whose mode and owner were
// checked (so a file swapped in between cannot slip past the check). Symbolic links are followed,
// as open() does: the file checked is the target (a Kubernetes Secret volume's files are links
// into its ..data folder). Refused with FailedPrecondition, naming the mode or the owner and the
// fix, when its group or others may read or write it (chmod 600 PATH), or when it belongs to
// neither the effective user nor root (chown). NotFound when it cannot be opened or read, with the
// reason. The messages do not repeat the path before the problem: callers prefix the setting it
// came from.
absl::StatusOr<std::string> ReadPrivateFile(const std::string& path);

}  // namespace dropless

#endif  // DROPLESS_COMMON_PRIVATE_FILE_H_
