#include "worker/daemon/outbound_journal.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <string.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace dropless {
namespace {

namespace v1 = dropless::v1;

constexpr char kBoot = 'B';
constexpr char kHostBoot = 'H';
constexpr char kMessage = 'M';
constexpr char kAck = 'A';
constexpr char kDrop = 'D';
// kind (1) + sequence (8) + payload length (4)
constexpr size_t kHeaderBytes = 13;
constexpr uint32_t kMaxPayloadBytes = 64u << 20;
// Rewrite once the file is this large and at least half of it is dead records.
constexpr uint64_t kRewriteMinBytes = 1u << 20;

bool WriteAll(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

uint64_t ReadU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

uint32_t ReadU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

std::string OutboundJournal::Record(char kind, uint64_t sequence, const std::string& payload) {
  std::string out(kHeaderBytes, '\0');
  out[0] = kind;
  const uint32_t length = static_cast<uint32_t>(payload.size());
  std::memcpy(&out[1], &sequence, sizeof sequence);
  std::memcpy(&out[9], &length, sizeof length);
  out += payload;
  return out;
}

std::string OutboundJournal::HostBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!(in >> id)) return "";
  return id;
}

absl::StatusOr<std::unique_ptr<OutboundJournal>> OutboundJournal::Open(
    const std::string& path, const std::string& new_boot_id, const std::string& host_boot_id,
    Recovered* recovered) {
  *recovered = Recovered{};
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::unique_ptr<OutboundJournal> journal(new OutboundJournal(path));
  const std::string lock_path = path + ".lock";
  journal->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (journal->lock_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("outbound journal: cannot open ", lock_path, ": ",
                                               strerror(errno)));
  }
  if (::flock(journal->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "outbound journal ", path, " is in use by another process (another dropless-worker with "
        "the same work_dir?)"));
  }
  std::string content;
  {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::stringstream buffer;
      buffer << in.rdbuf();
      content = buffer.str();
    }
  }
  std::map<uint64_t, v1::WorkerMessage> pending;
  std::string written_in_host_boot;
  // Where the replay stopped and, for a record that is there but cannot be read, why.
  size_t offset = 0;
  std::string corruption;
  while (offset < content.size()) {
    const size_t left = content.size() - offset;
    const char kind = content[offset];
    if (kind != kBoot && kind != kHostBoot && kind != kMessage && kind != kAck && kind != kDrop) {
      corruption =
          absl::StrCat("unknown record kind ", static_cast<int>(static_cast<uint8_t>(kind)));
      break;
    }
    if (left < kHeaderBytes) break;  // torn
    const uint64_t sequence = ReadU64(&content[offset + 1]);
    const uint32_t length = ReadU32(&content[offset + 9]);
    if (length > kMaxPayloadBytes) {
      corruption = absl::StrCat("record length ", length);
      break;
    }
    if (kHeaderBytes + length > left) break;  // torn
    const std::string payload = content.substr(offset + kHeaderBytes, length);
    if (kind == kBoot) {
      recovered->boot_id = payload;
    } else if (kind == kHostBoot) {
      written_in_host_boot = payload;
    } else if (kind == kMessage) {
      v1::WorkerMessage message;
      if (!message.ParseFromString(payload)) {
        corruption = absl::StrCat("message ", sequence, " does not parse");
        break;
      }
      if (sequence > recovered->acknowledged) pending[sequence] = std::move(message);
      recovered->last_sequence = std::max(recovered->last_sequence, sequence);
    } else if (kind == kAck) {
      recovered->acknowledged = std::max(recovered->acknowledged, sequence);
      pending.erase(pending.begin(), pending.upper_bound(sequence));
      recovered->last_sequence = std::max(recovered->last_sequence, sequence);
    } else {
      pending.erase(sequence);
    }
    offset += kHeaderBytes + length;
  }
  if (offset != content.size() && corruption.empty()) {
    LogInfo(absl::StrCat("outbound journal ", path, ": ignoring ", content.size() - offset,
                         " bytes of a record cut at its end (by a crash?)"));
  }
  for (auto& [sequence, message] : pending) {
    recovered->pending.emplace_back(sequence, std::move(message));
  }
  if (!written_in_host_boot.empty() && !host_boot_id.empty() &&
      written_in_host_boot != host_boot_id) {
    const size_t discarded = recovered->pending.size();
    *recovered = Recovered{};
    recovered->discarded_after_host_boot = discarded;
  } else if (!corruption.empty()) {
    // What came after the record is lost: acknowledgements (the coordinator has a higher sequence
    // of this boot than the file), messages, rank ends. Numbering on in this boot would have the
    // coordinator drop new messages as resends; and a lost STARTING would let it resend an
    // Assignment this run may have started. So a new boot, as after a host reboot, which the
    // coordinator handles as a new run of the daemon (numbering from 1, no resent Assignments of
    // the old run). What was unacknowledged before the record goes again in it, renumbered in
    // order: at least once, as after any coordinator restart (a message whose acknowledgement was
    // lost is stored twice), and rank ends are not lost (the Hello lists them ended).
    LogWarning(absl::StrCat("outbound journal ", path, ": record at offset ", offset, " of ",
                            content.size(), " bytes is unreadable (", corruption,
                            "); the rest is lost. Beginning a new boot (", new_boot_id, ", was ",
                            recovered->boot_id.empty() ? "none" : recovered->boot_id,
                            "): ", recovered->pending.size(),
                            " unacknowledged message(s) read before it are sent again, "
                            "numbered from 1; the file is kept as ",
                            path, ".corrupt"));
    // A second name for the bad file (the rewrite below replaces the first one atomically).
    ::unlink((path + ".corrupt").c_str());
    (void)::link(path.c_str(), (path + ".corrupt").c_str());
    std::vector<std::pair<uint64_t, v1::WorkerMessage>> renumbered;
    renumbered.reserve(recovered->pending.size());
    for (auto& [sequence, message] : recovered->pending) {
      renumbered.emplace_back(renumbered.size() + 1, std::move(message));
    }
    *recovered = Recovered{};
    recovered->corrupt_at = static_cast<int64_t>(offset);
    recovered->last_sequence = renumbered.size();
    recovered->pending = std::move(renumbered);
    recovered->boot_id = new_boot_id;
  }
  if (recovered->boot_id.empty()) recovered->boot_id = new_boot_id;

  // Start from a compact file: the boot ids, the acknowledgement and what is still pending.
  journal->boot_id_ = recovered->boot_id;
  journal->host_boot_id_ = host_boot_id;
  journal->acknowledged_ = recovered->acknowledged;
  std::vector<std::pair<uint64_t, const v1::WorkerMessage*>> live;
  for (const auto& [sequence, message] : recovered->pending) live.emplace_back(sequence, &message);
  if (absl::Status s = journal->RewriteFile(live); !s.ok()) {
    // What was recovered is still delivered, from memory; the old file goes, or a later run would
    // replay it in this boot below the numbers this one goes on to use.
    journal->Disable(absl::StrCat("cannot rewrite it at start: ", s.message()));
  }
  return journal;
}

OutboundJournal::~OutboundJournal() {
  if (fd_ >= 0) ::close(fd_);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

void OutboundJournal::Disable(const std::string& why) {
  if (off_) return;
  off_ = true;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  // The file stops short of the numbers this run goes on to use. Kept, it would give a restarted
  // daemon this boot id with a lower last sequence, and the coordinator would take the messages
  // it numbers again for ones already stored. Without it the next run is a new boot: a numbering
  // of its own. (unlink needs no free space, the usual reason to be here.)
  const bool removed =
      ::unlink(path_.c_str()) == 0 || errno == ENOENT || ::truncate(path_.c_str(), 0) == 0;
  ::unlink((path_ + ".tmp").c_str());
  LogWarning(absl::StrCat("outbound journal ", path_, " off (", why, "); ",
                          removed
                              ? "removed, so a restart begins a new boot; "
                              : absl::StrCat("and could not be removed or emptied (",
                                             strerror(errno), "): remove it before restarting; "),
                          "unacknowledged messages will not survive a restart"));
}

void OutboundJournal::Write(char kind, uint64_t sequence, const std::string& payload) {
  if (fd_ < 0) return;
  const std::string record = Record(kind, sequence, payload);
  if (!WriteAll(fd_, record)) {
    Disable(absl::StrCat("write failed: ", strerror(errno)));
    return;
  }
  file_bytes_ += record.size();
  if (kind == kMessage) {
    live_[sequence] = record.size();
    live_bytes_ += record.size();
  }
}

void OutboundJournal::Appended(uint64_t sequence, const v1::WorkerMessage& message) {
  Write(kMessage, sequence, message.SerializeAsString());
}

void OutboundJournal::Acknowledged(uint64_t sequence) {
  if (sequence <= acknowledged_) return;
  acknowledged_ = sequence;
  Write(kAck, sequence, "");
  for (auto it = live_.begin(); it != live_.end() && it->first <= sequence;) {
    live_bytes_ -= it->second;
    it = live_.erase(it);
  }
}

void OutboundJournal::Dropped(uint64_t sequence) {
  Write(kDrop, sequence, "");
  auto it = live_.find(sequence);
  if (it == live_.end()) return;
  live_bytes_ -= it->second;
  live_.erase(it);
}

bool OutboundJournal::WantsRewrite() const {
  return fd_ >= 0 && file_bytes_ >= kRewriteMinBytes && file_bytes_ >= 2 * live_bytes_;
}

void OutboundJournal::Rewrite(
    const std::vector<std::pair<uint64_t, const v1::WorkerMessage*>>& pending) {
  if (fd_ < 0) return;
  if (absl::Status s = RewriteFile(pending); !s.ok()) Disable(std::string(s.message()));
}

absl::Status OutboundJournal::RewriteFile(
    const std::vector<std::pair<uint64_t, const v1::WorkerMessage*>>& pending) {
  const std::string tmp = path_ + ".tmp";
  std::string bytes = Record(kBoot, 0, boot_id_) + Record(kAck, acknowledged_, "");
  if (!host_boot_id_.empty()) bytes += Record(kHostBoot, 0, host_boot_id_);
  std::map<uint64_t, uint64_t> live;
  uint64_t live_bytes = 0;
  for (const auto& [sequence, message] : pending) {
    std::string record = Record(kMessage, sequence, message->SerializeAsString());
    live[sequence] = record.size();
    live_bytes += record.size();
    bytes += record;
  }
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot create ", tmp, ": ", strerror(errno)));
  const bool written = WriteAll(fd, bytes);
  ::close(fd);
  if (!written || ::rename(tmp.c_str(), path_.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot write ", path_, ": ", strerror(errno)));
  }
  const int appender = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (appender < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open ", path_, ": ", strerror(errno)));
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = appender;
  file_bytes_ = bytes.size();
  live_ = std::move(live);
  live_bytes_ = live_bytes;
  return absl::OkStatus();
}

}  // namespace dropless
