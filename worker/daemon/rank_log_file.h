// RankLogFile: one rank's output on disk (<work_dir>/jobs/<job>/attempt-<N>/rank-<R>.log), capped.
//
// When the next bytes would take the file past its cap it is renamed to <path>.1 (replacing an
// older <path>.1, whose bytes are discarded) and a fresh <path> begins: the newest output is
// always in <path>, the output just before it in <path>.1, and the two together hold at most
// twice the cap, however long and chatty the rank. A rotation cuts after the last line end that
// fits, so output written in whole lines leaves whole lines in both files (a line longer than the
// cap is cut at the cap). Readers that want the last lines read <path>, then <path>.1 for what
// is missing; `tail -F` (not -f) follows the log across a rotation.
//
// Rank output keeps flowing whatever the disk does: Append never fails and does nothing but
// write(2) to a local file, and rename(2)/open(2) when it rotates. A write, rename or open that
// fails drops output rather than hold anything up (the first failure is logged, the bytes are
// counted, and the file is opened again, in append mode, at most once per retry interval); a
// rename that fails starts <path> over instead (its older output is lost, the cap is kept).
// Not thread-safe: the rank supervisor's thread owns it.
#ifndef DROPLESS_WORKER_DAEMON_RANK_LOG_FILE_H_
#define DROPLESS_WORKER_DAEMON_RANK_LOG_FILE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dropless {

// Default cap of one rank's log file (the daemon's --rank-log-max-bytes): a rank keeps at most
// twice this on disk.
inline constexpr int64_t kDefaultRankLogMaxBytes = int64_t{64} << 20;

class RankLogFile {
 public:
  // How long after a failed write or open the file is tried again (output meanwhile is dropped).
  static constexpr absl::Duration kRetryInterval = absl::Seconds(1);

  // Opens `path` for appending (creating it); what it already holds counts against the cap.
  // `max_bytes` 0: no cap, never rotated. An error only when `path` cannot be opened now.
  static absl::StatusOr<std::unique_ptr<RankLogFile>> Open(
      std::string path, int64_t max_bytes, absl::Duration retry_interval = kRetryInterval);
  // Closes the file; logs what was rotated out or dropped, if anything was.
  ~RankLogFile();
  RankLogFile(const RankLogFile&) = delete;
  RankLogFile& operator=(const RankLogFile&) = delete;

  // Writes `bytes` (rotating first when they would pass the cap), or drops them (see above).
  void Append(absl::string_view bytes);

  const std::string& path() const { return path_; }
  // Bytes in <path> now (as this object wrote or found them).
  int64_t size() const { return size_; }
  int64_t rotations() const { return rotations_; }
  // Bytes of older output deleted to keep the cap: an older <path>.1 replaced by a rotation, or
  // <path> started over because it could not be renamed.
  int64_t discarded_bytes() const { return discarded_bytes_; }
  // Bytes never written: a write, rename or open failed.
  int64_t dropped_bytes() const { return dropped_bytes_; }

 private:
  RankLogFile(std::string path, int64_t max_bytes, absl::Duration retry_interval, int fd);

  // Moves <path> to <path>.1 and opens a fresh <path>; false when no file is open afterwards.
  bool Rotate();
  // Writes `bytes`; returns how many were written (fewer: it failed and closed the file).
  size_t Write(absl::string_view bytes);
  // Opens <path> again after a failure, unless the retry interval has not passed.
  bool Reopen();
  // Closes the file after a failure of `what`; the first one is logged.
  void Fail(absl::string_view what, int err);

  const std::string path_;
  const std::string rotated_path_;  // <path>.1
  const int64_t max_bytes_;
  const absl::Duration retry_interval_;
  int fd_ = -1;
  int64_t size_ = 0;          // bytes in <path>
  int64_t rotated_size_ = 0;  // bytes in <path>.1
  int64_t rotations_ = 0;
  int64_t discarded_bytes_ = 0;
  int64_t dropped_bytes_ = 0;
  bool failure_logged_ = false;
  std::chrono::steady_clock::time_point retry_at_;  // after a failure: no open before this
};

}  // namespace dropless

#endif  // DROPLESS_WORKER_DAEMON_RANK_LOG_FILE_H_
