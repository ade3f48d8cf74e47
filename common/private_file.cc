#include "common/private_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dropless {
namespace {

// Closes the descriptor on every way out.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  const int fd_;
};

absl::Status CheckModeAndOwner(const struct stat& st, const std::string& path) {
  const mode_t mode = st.st_mode & 07777;
  std::vector<std::string> who;
  for (const auto& [bits, name] : {std::pair<mode_t, const char*>{S_IRGRP, "group read"},
                                   {S_IWGRP, "group write"},
                                   {S_IROTH, "others read"},
                                   {S_IWOTH, "others write"}}) {
    if ((mode & bits) != 0) who.push_back(name);
  }
  if (!who.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "mode %04o gives others than its owner access (%s); a file of bearer tokens must be "
        "readable by its owner only: chmod 600 %s",
        mode, absl::StrJoin(who, ", "), path));
  }
  // As ssh: the owner of a file nobody else may read is the one who could have changed it.
  const uid_t euid = geteuid();
  if (st.st_uid != euid && st.st_uid != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "owned by uid %d, neither this process's user (uid %d) nor root; a file of bearer "
        "tokens must belong to the user who reads it: chown %d %s",
        st.st_uid, euid, euid, path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadPrivateFile(const std::string& path) {
  // open, not O_NOFOLLOW: a link's target is what is read, and what is checked (fstat below).
  FileDescriptor fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open (", std::strerror(errno), ")"));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot examine (", std::strerror(errno), ")"));
  }
  if (absl::Status s = CheckModeAndOwner(st, path); !s.ok()) return s;
  std::string text;
  char buffer[8192];
  for (;;) {
    const ssize_t n = read(fd.get(), buffer, sizeof(buffer));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::NotFoundError(absl::StrCat("cannot read (", std::strerror(errno), ")"));
    }
    text.append(buffer, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace dropless
