// POSIX file plumbing of the checkpoint writers and readers: atomic replacement of a file (temp
// file, fsync, rename, directory fsync), positional reads, errno as absl::Status, and which of
// those errors are the checkpoint directory's own.
#ifndef DROPLESS_WORKER_ENGINE_CHECKPOINT_FILE_IO_H_
#define DROPLESS_WORKER_ENGINE_CHECKPOINT_FILE_IO_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dropless::engine {

// fsync of a directory, making the renames and unlinks inside it durable.
absl::Status SyncDirectory(const std::string& dir);

// Creates `dir` and its missing parents. After each directory it creates, syncs the directory
// that holds it (`sync_directory`: SyncDirectory, or a test's observer), so that a crash cannot
// drop the new directory's entry, and with it a checkpoint committed inside later; an error of
// that sync is returned. A directory that exists already (mkdir's EEXIST) has its parent synced
// too: another rank creating it at the same moment may not have synced it yet. Only a parent
// this process may not read (EACCES) is left unsynced there: no rank of its job made an entry
// in it through here, as that rank could not have synced it either.
using DirectorySync = absl::FunctionRef<absl::Status(const std::string& dir)>;
absl::Status MakeDirectories(const std::string& dir);
absl::Status MakeDirectories(const std::string& dir, DirectorySync sync_directory);

// The directory part of `path` ("." when it has none).
std::string DirectoryOf(const std::string& path);

// Writes `path` so that readers see either its previous content or the complete new one: the
// bytes go to TempPath(path), which Commit fsyncs, renames over `path`, then fsyncs the directory.
// A leftover temp file of an earlier attempt is overwritten; destroying the writer before Commit
// removes the temp file. Tracks the size and CRC-32C of what was written.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  static std::string TempPath(const std::string& path) { return path + ".tmp"; }

  absl::Status Open();
  absl::Status Append(const void* data, size_t bytes);
  absl::Status Commit();

  uint64_t size() const { return size_; }
  uint32_t crc32c() const { return crc32c_; }

 private:
  std::string path_;
  std::string temp_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint32_t crc32c_ = 0;
};

// A file opened for reading. Open is NotFound when the file does not exist.
class ReadOnlyFile {
 public:
  ReadOnlyFile() = default;
  ~ReadOnlyFile();
  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&& other) noexcept;

  static absl::StatusOr<ReadOnlyFile> Open(const std::string& path);

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  // Reads exactly `bytes` at `offset`; DataLoss when the file ends first.
  absl::Status ReadAt(uint64_t offset, void* data, size_t bytes) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The whole content of a file of at most `max_bytes` (InvalidArgument when larger).
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes);

// `status` marked as a job error (common/job_error.h) when it is a property of the checkpoint
// directory, which every retry of the job would meet again: damage (DataLoss), a file too large or
// of another job or format (InvalidArgument), something other than a regular file or directory
// where one belongs (FailedPrecondition). Other errors (NotFound, I/O) are returned as they are.
absl::Status AsCheckpointJobError(absl::Status status);

}  // namespace dropless::engine

#endif  // DROPLESS_WORKER_ENGINE_CHECKPOINT_FILE_IO_H_
