// OutboundJournal: the worker daemon's outbound queue on disk (<work_dir>/outbound.journal), so
// that a restart of the daemon (an upgrade, an OOM kill, kill -9) on the same work dir keeps what
// the coordinator has not acknowledged yet (a rank's final status, its last step metrics and log
// lines) and keeps the numbering: the restarted daemon says Hello with the same boot_id, its last
// acknowledged sequence and the messages after it, so the coordinator stores each message once
// and a rank that ended just before the restart is known to have ended. (On Kubernetes the work
// dir is the pod's emptyDir: a restart of its container, not a new pod; deploy/README.md.)
//
// An append-only file of records (boot id, host boot id, message, acknowledgement, drop), each one
// write(2): it survives the process, not the host (no fsync, as the coordinator's log and metrics
// rows). So a journal written before the host last booted (its host boot id is not the kernel's
// now) is not replayed: its tail may be lost (a rank's STARTING, a final status), and going on with
// its boot id would let the coordinator resend an Assignment whose rank this host already started
// once; the daemon begins a new boot, whose Hello tells the coordinator that the old one's ranks
// are gone. A record cut short at the end of the file (a crash mid-write) ends the replay. A
// complete record that cannot be read (an unknown kind, an impossible length, a message that does
// not parse) is corruption: the acknowledgements and messages after it are lost, so the daemon
// begins a new boot as well, and sends what was unacknowledged before it again, renumbered from 1
// (logged as a warning with the offset; the bad file is kept as <path>.corrupt). The file is
// rewritten (temporary file + rename) with only the unacknowledged messages once it is mostly
// acknowledged ones. A failing disk turns the journal off (logged once) and removes the file, so
// that a restart begins a new boot rather than renumbering from the file's last record; the queue
// goes on in memory. That includes the rewrite at start: what was recovered is still delivered.
//
// Not thread-safe: OutboundQueue calls it under its own lock.
#ifndef DROPLESS_WORKER_DAEMON_OUTBOUND_JOURNAL_H_
#define DROPLESS_WORKER_DAEMON_OUTBOUND_JOURNAL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dropless/v1/worker_service.pb.h"

namespace dropless {

class OutboundJournal {
 public:
  // What a previous run of the daemon left.
  struct Recovered {
    std::string boot_id;         // empty: no journal yet (first start)
    // Messages of a journal written before the host last booted, not replayed (then boot_id is
    // the new one and nothing else is recovered).
    size_t discarded_after_host_boot = 0;
    // Offset of the first unreadable complete record of a corrupt journal, -1 when none. Then
    // boot_id is the new one and pending what was unacknowledged before it, numbered from 1.
    int64_t corrupt_at = -1;
    uint64_t acknowledged = 0;   // the highest sequence the coordinator acknowledged
    uint64_t last_sequence = 0;  // the highest sequence ever numbered
    // Unacknowledged messages, oldest first.
    std::vector<std::pair<uint64_t, dropless::v1::WorkerMessage>> pending;
  };

  // Opens `path` (creating it and its directory), replays it into *recovered and, when it held no
  // boot id or was written before the host last booted, records `new_boot_id` (then
  // recovered->boot_id is that one). `host_boot_id`: the kernel's boot id
  // (/proc/sys/kernel/random/boot_id, HostBootId()); empty when unknown, and a journal that
  // records none (written by an older daemon) is replayed. The journal is locked
  // (flock on <path>.lock) while this object lives: FailedPrecondition when another process holds
  // it (a second daemon on the same work dir); other errors are Unavailable. When the journal was
  // read but cannot be rewritten (a full or failing disk) the journal is returned turned off
  // (enabled() false, the file removed) with *recovered filled: its messages go from memory.
  static absl::StatusOr<std::unique_ptr<OutboundJournal>> Open(const std::string& path,
                                                               const std::string& new_boot_id,
                                                               const std::string& host_boot_id,
                                                               Recovered* recovered);
  // The kernel's boot id (changes with every boot of the host); empty when it cannot be read.
  static std::string HostBootId();
  ~OutboundJournal();

  void Appended(uint64_t sequence, const dropless::v1::WorkerMessage& message);
  // Every message up to `sequence` is acknowledged.
  void Acknowledged(uint64_t sequence);
  // One message left the queue unacknowledged (the queue was full).
  void Dropped(uint64_t sequence);

  // The file is mostly acknowledged or dropped messages: Rewrite would shrink it.
  bool WantsRewrite() const;
  // Replaces the file with the boot id, the acknowledgement and `pending` (the queue's content).
  void Rewrite(const std::vector<std::pair<uint64_t, const dropless::v1::WorkerMessage*>>& pending);

  const std::string& path() const { return path_; }
  bool enabled() const { return fd_ >= 0; }

 private:
  explicit OutboundJournal(std::string path) : path_(std::move(path)) {}
  // Writes the compact file and appends to it from then on.
  absl::Status RewriteFile(
      const std::vector<std::pair<uint64_t, const dropless::v1::WorkerMessage*>>& pending);
  void Write(char kind, uint64_t sequence, const std::string& payload);
  void Disable(const std::string& why);
  static std::string Record(char kind, uint64_t sequence, const std::string& payload);

  const std::string path_;
  int lock_fd_ = -1;
  int fd_ = -1;
  bool off_ = false;  // Disable()d: never written again
  std::string boot_id_;
  std::string host_boot_id_;
  uint64_t acknowledged_ = 0;
  uint64_t file_bytes_ = 0;
  uint64_t live_bytes_ = 0;
  std::map<uint64_t, uint64_t> live_;  // sequence -> record bytes, unacknowledged messages
};

}  // namespace dropless

#endif  // DROPLESS_WORKER_DAEMON_OUTBOUND_JOURNAL_H_
