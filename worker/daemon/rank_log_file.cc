#include "worker/daemon/rank_log_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace dropless {
namespace {

int OpenForAppend(const std::string& path, int extra_flags) {
  int fd;
  do {
    fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | extra_flags, 0644);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

int64_t FileSize(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

void CloseFd(int& fd) {
  if (fd >= 0) {
    close(fd);  // not retried on EINTR: Linux releases the descriptor whatever close returns
    fd = -1;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<RankLogFile>> RankLogFile::Open(std::string path, int64_t max_bytes,
                                                               absl::Duration retry_interval) {
  if (max_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank log ", path, ": cap must be >= 0 (got ", max_bytes, ")"));
  }
  const int fd = OpenForAppend(path, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", strerror(errno)));
  return std::unique_ptr<RankLogFile>(
      new RankLogFile(std::move(path), max_bytes, retry_interval, fd));
}

RankLogFile::RankLogFile(std::string path, int64_t max_bytes, absl::Duration retry_interval,
                         int fd)
    : path_(std::move(path)),
      rotated_path_(path_ + ".1"),
      max_bytes_(max_bytes),
      retry_interval_(retry_interval),
      fd_(fd),
      size_(FileSize(fd)),
      rotated_size_(FileSize(rotated_path_)) {}

RankLogFile::~RankLogFile() {
  CloseFd(fd_);
  if (rotations_ == 0 && dropped_bytes_ == 0) return;
  const std::string summary = absl::StrCat(
      "rank log ", path_, ": rotated ", rotations_, " time(s) at ", max_bytes_,
      " bytes (--rank-log-max-bytes), ", discarded_bytes_, " bytes of older output discarded, ",
      dropped_bytes_, " bytes not written (write, rename or open failed)");
  if (dropped_bytes_ > 0) {
    LogWarning(summary);
  } else {
    LogInfo(summary);
  }
}

void RankLogFile::Append(absl::string_view bytes) {
  while (!bytes.empty()) {
    if (fd_ < 0 && !Reopen()) break;
    absl::string_view now = bytes;
    if (max_bytes_ > 0 && size_ + static_cast<int64_t>(bytes.size()) > max_bytes_) {
      now = bytes.substr(0, static_cast<size_t>(std::max<int64_t>(max_bytes_ - size_, 0)));
      const size_t line_end = now.rfind('\n');
      if (line_end != absl::string_view::npos) {
        now = now.substr(0, line_end + 1);
      } else if (size_ > 0) {
        now = absl::string_view();  // the unfinished line begins the next file
      }  // else: one line longer than the cap, cut at the cap
    }
    if (!now.empty()) {
      const size_t written = Write(now);
      bytes.remove_prefix(written);
      if (written < now.size()) break;
    }
    // Only what did not fit is left: the file is full (and not empty, or `now` took the cap).
    if (!bytes.empty() && !Rotate()) break;
  }
  dropped_bytes_ += static_cast<int64_t>(bytes.size());
}

size_t RankLogFile::Write(absl::string_view bytes) {
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = write(fd_, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Fail("write", n < 0 ? errno : ENOSPC);
      break;
    }
    written += static_cast<size_t>(n);
    size_ += n;
  }
  return written;
}

bool RankLogFile::Rotate() {
  if (rename(path_.c_str(), rotated_path_.c_str()) != 0) {
    const int err = errno;
    // Keep the cap without <path>.1: start this file over.
    if (ftruncate(fd_, 0) != 0) {
      Fail(absl::StrCat("rename to ", rotated_path_, " (", strerror(err), ") and truncate"),
           errno);
      return false;
    }
    if (!failure_logged_) {
      failure_logged_ = true;
      LogWarning(absl::StrCat("rank log ", path_, ": cannot rename it to ", rotated_path_, ": ",
                              strerror(err), "; starting it over at the cap instead (its older "
                              "output is lost)"));
    }
    discarded_bytes_ += size_;
    size_ = 0;
    ++rotations_;
    return true;
  }
  discarded_bytes_ += rotated_size_;
  rotated_size_ = size_;
  size_ = 0;
  if (++rotations_ == 1) {
    LogInfo(absl::StrCat("rank log ", path_, " reached ", max_bytes_,
                         " bytes (--rank-log-max-bytes): rotated to ", rotated_path_,
                         "; from now on each rotation replaces it, discarding the oldest output"));
  }
  const int fd = OpenForAppend(path_, O_TRUNC);
  const int err = errno;
  CloseFd(fd_);
  fd_ = fd;
  if (fd_ < 0) {
    Fail("open", err);
    return false;
  }
  return true;
}

bool RankLogFile::Reopen() {
  if (std::chrono::steady_clock::now() < retry_at_) return false;
  const int fd = OpenForAppend(path_, 0);
  if (fd < 0) {
    Fail("open", errno);
    return false;
  }
  fd_ = fd;
  size_ = FileSize(fd_);
  return true;
}

void RankLogFile::Fail(absl::string_view what, int err) {
  CloseFd(fd_);
  retry_at_ = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(retry_interval_);
  if (failure_logged_) return;
  failure_logged_ = true;
  LogWarning(absl::StrCat("rank log ", path_, ": ", what, ": ", strerror(err),
                          "; the rank's output is still forwarded, but not written here until the "
                          "file can be written again (tried every ",
                          absl::FormatDuration(retry_interval_), ")"));
}

}  // namespace dropless
