#include "worker/engine/checkpoint/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/job_error.h"
#include "worker/engine/checkpoint/crc32c.h"

namespace dropless::engine {
namespace {

absl::Status ErrnoStatus(const std::string& what, const std::string& path) {
  const int error = errno;
  const std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(error));
  if (error == ENOENT) return absl::NotFoundError(message);
  // A component of the path is a file: the configured path's property, not the moment's.
  if (error == ENOTDIR) return absl::FailedPreconditionError(message);
  return absl::InternalError(message);
}

}  // namespace

absl::Status MakeDirectories(const std::string& dir) { return MakeDirectories(dir, SyncDirectory); }

absl::Status MakeDirectories(const std::string& dir, DirectorySync sync_directory) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (prefix.back() == '/') continue;  // an empty component ("a//b", a trailing slash)
    if (mkdir(prefix.c_str(), 0755) == 0) {
      // The new directory's entry lives in its parent, which the renames of the files written
      // into it later do not sync.
      if (absl::Status s = sync_directory(DirectoryOf(prefix)); !s.ok()) return s;
      continue;
    }
    if (errno != EEXIST) return ErrnoStatus("mkdir", prefix);
    // Another rank may have created it a moment ago and not synced its parent yet, and which
    // rank won cannot be told: sync the parent too. Not one this process may not read: a rank of
    // its job that created the entry could not have synced it either (it fails above), so the
    // entry predates the job (/shared/<user> under a 0711 /shared), and refusing would fail
    // every save there.
    const std::string parent = DirectoryOf(prefix);
    if (faccessat(AT_FDCWD, parent.c_str(), R_OK, AT_EACCESS) != 0 && errno == EACCES) continue;
    if (absl::Status s = sync_directory(parent); !s.ok()) return s;
  }
  struct stat info;
  if (stat(dir.c_str(), &info) != 0) return ErrnoStatus("stat", dir);
  if (!S_ISDIR(info.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open", dir);
  // EINVAL: the filesystem cannot sync a directory (some FUSE and 9p mounts); its renames are
  // then as durable as it makes them, and refusing every save there would help no one.
  const int result = fsync(fd);
  absl::Status status =
      result == 0 || errno == EINVAL ? absl::OkStatus() : ErrnoStatus("fsync", dir);
  close(fd);
  return status;
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), temp_(TempPath(path_)) {}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    close(fd_);
    unlink(temp_.c_str());
  }
}

absl::Status AtomicFileWriter::Open() {
  if (fd_ >= 0) return absl::FailedPreconditionError(absl::StrCat(temp_, " is already open"));
  fd_ = open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return ErrnoStatus("open", temp_);
  size_ = 0;
  crc32c_ = 0;
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Append(const void* data, size_t bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(temp_, " is not open"));
  crc32c_ = Crc32cExtend(crc32c_, data, bytes);
  size_ += bytes;
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("write", temp_);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(temp_, " is not open"));
  if (fsync(fd_) != 0) return ErrnoStatus("fsync", temp_);
  const int fd = std::exchange(fd_, -1);
  if (close(fd) != 0) {
    unlink(temp_.c_str());
    return ErrnoStatus("close", temp_);
  }
  if (rename(temp_.c_str(), path_.c_str()) != 0) {
    absl::Status status = ErrnoStatus("rename", temp_);
    unlink(temp_.c_str());
    return status;
  }
  return SyncDirectory(DirectoryOf(path_));
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) close(fd_);
}

ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

ReadOnlyFile& ReadOnlyFile::operator=(ReadOnlyFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
  }
  return *this;
}

absl::StatusOr<ReadOnlyFile> ReadOnlyFile::Open(const std::string& path) {
  ReadOnlyFile file;
  file.path_ = path;
  // O_NONBLOCK: a FIFO put where a checkpoint file belongs is refused below instead of blocking
  // the open until a writer comes (reads of regular files ignore the flag).
  file.fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (file.fd_ < 0) return ErrnoStatus("open", path);
  struct stat info;
  if (fstat(file.fd_, &info) != 0) return ErrnoStatus("stat", path);
  if (!S_ISREG(info.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  file.size_ = static_cast<uint64_t>(info.st_size);
  return file;
}

absl::Status ReadOnlyFile::ReadAt(uint64_t offset, void* data, size_t bytes) const {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = pread(fd_, p, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("read", path_);
    }
    if (n == 0) return absl::DataLossError(absl::StrCat(path_, " is truncated"));
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes) {
  absl::StatusOr<ReadOnlyFile> file = ReadOnlyFile::Open(path);
  if (!file.ok()) return file.status();
  if (file->size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", file->size(), " bytes, more than the ", max_bytes, " expected"));
  }
  std::string content(file->size(), '\0');
  if (absl::Status s = file->ReadAt(0, content.data(), content.size()); !s.ok()) return s;
  return content;
}

absl::Status AsCheckpointJobError(absl::Status status) {
  if (absl::IsDataLoss(status) || absl::IsInvalidArgument(status) ||
      absl::IsFailedPrecondition(status)) {
    return MarkJobError(std::move(status));
  }
  return status;
}

}  // namespace dropless::engine
