#include "worker/daemon/outbound_queue.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"

namespace dropless {
namespace {

// What dropped() counts for a message that is dropped or refused: its lines, or the message.
int64_t DroppedCount(const dropless::v1::WorkerMessage& message) {
  return message.has_logs() ? message.logs().lines_size() : 1;
}

// What a refused message was, for its log line.
std::string Describe(const dropless::v1::WorkerMessage& message) {
  if (message.has_metrics()) {
    const dropless::v1::StepMetrics& m = message.metrics();
    return absl::StrCat("step metrics of job ", m.job_id(), " attempt ", m.attempt(), " rank ",
                        m.rank(), " step ", m.step());
  }
  if (message.has_rank_status()) {
    const dropless::v1::RankStatus& s = message.rank_status();
    return absl::StrCat("rank status of job ", s.job_id(), " attempt ", s.attempt(), " rank ",
                        s.rank());
  }
  if (message.has_logs()) {
    return absl::StrCat("log batch of ", message.logs().lines_size(), " line(s)");
  }
  return "message";
}

}  // namespace

OutboundQueue::OutboundQueue(size_t max_messages, size_t max_bytes)
    : max_messages_(max_messages > 0 ? max_messages : 1), max_bytes_(max_bytes) {}

void OutboundQueue::SetDropObserver(std::function<void(int64_t)> observer) {
  absl::MutexLock lock(&mu_);
  drop_observer_ = std::move(observer);
}

void OutboundQueue::CountDropped(int64_t count) {
  dropped_ += count;
  if (drop_observer_) drop_observer_(count);
  const absl::Time now = absl::Now();
  if (now - drop_logged_at_ < absl::Minutes(1)) return;
  LogWarning(absl::StrFormat(
      "outbound queue full (%d messages, %.1f MiB) while the coordinator does not take them: "
      "%d more message(s) or log line(s) dropped, oldest step metrics and log lines first "
      "(%d in all; rank statuses are kept)",
      messages_.size(), static_cast<double>(bytes_) / (1 << 20), dropped_ - dropped_logged_,
      dropped_));
  dropped_logged_ = dropped_;
  drop_logged_at_ = now;
}

void OutboundQueue::Append(dropless::v1::WorkerMessage message) {
  const size_t bytes = message.ByteSizeLong();
  bool dropped_any = false;
  while (!messages_.empty() && Full(bytes)) {
    // A rank status is never dropped: the coordinator would not learn that the rank ended, and
    // could send its Assignment again (the rank would start twice). They are bounded by the
    // ranks this daemon runs; the bound is kept by dropping the oldest messages of other kinds,
    // or, when only statuses are queued, by refusing a new message of another kind.
    auto victim = std::find_if(messages_.begin(), messages_.end(),
                               [](const Entry& e) { return !e.message.has_rank_status(); });
    if (victim == messages_.end()) break;
    CountDropped(DroppedCount(victim->message));
    if (journal_ != nullptr) journal_->Dropped(victim->sequence);
    bytes_ -= victim->bytes;
    messages_.erase(victim);
    dropped_any = true;
  }
  if (Full(bytes) && !messages_.empty() && !message.has_rank_status()) {
    CountDropped(DroppedCount(message));
    return;
  }
  messages_.push_back(Entry{next_sequence_++, std::move(message), bytes});
  bytes_ += bytes;
  if (journal_ != nullptr) {
    journal_->Appended(messages_.back().sequence, messages_.back().message);
    // Through an outage the drops, not acknowledgements, are what leaves the journal.
    if (dropped_any) CompactJournal();
  }
}

void OutboundQueue::Restore(std::unique_ptr<OutboundJournal> journal,
                            OutboundJournal::Recovered recovered) {
  absl::MutexLock lock(&mu_);
  for (auto& [sequence, message] : recovered.pending) {
    const size_t bytes = message.ByteSizeLong();
    messages_.push_back(Entry{sequence, std::move(message), bytes});
    bytes_ += bytes;
  }
  next_sequence_ = std::max(next_sequence_, recovered.last_sequence + 1);
  journal_ = std::move(journal);
}

void OutboundQueue::AcknowledgeLocked(uint64_t sequence) {
  while (!messages_.empty() && messages_.front().sequence <= sequence) {
    bytes_ -= messages_.front().bytes;
    messages_.pop_front();
  }
  if (journal_ == nullptr) return;
  journal_->Acknowledged(sequence);
  CompactJournal();
}

void OutboundQueue::CompactJournal() {
  if (journal_ == nullptr || !journal_->WantsRewrite()) return;
  std::vector<std::pair<uint64_t, const dropless::v1::WorkerMessage*>> pending;
  pending.reserve(messages_.size());
  for (const Entry& entry : messages_) pending.emplace_back(entry.sequence, &entry.message);
  journal_->Rewrite(pending);
}

void OutboundQueue::SealLogBatch() {
  if (open_batch_.lines_size() == 0) return;
  dropless::v1::WorkerMessage message;
  message.mutable_logs()->Swap(&open_batch_);
  open_batch_.Clear();
  open_batch_bytes_ = 0;
  Append(std::move(message));
}

void OutboundQueue::Push(dropless::v1::WorkerMessage message) {
  absl::MutexLock lock(&mu_);
  SealLogBatch();
  Append(std::move(message));
}

void OutboundQueue::PushLogLine(dropless::v1::LogLine line) {
  absl::MutexLock lock(&mu_);
  if (open_batch_.lines_size() == 0) open_batch_since_ = absl::Now();
  open_batch_bytes_ += line.text().size() + 64;
  *open_batch_.add_lines() = std::move(line);
  if (open_batch_.lines_size() >= kMaxLogBatchLines || open_batch_bytes_ >= kMaxLogBatchBytes) {
    SealLogBatch();
  }
}

std::optional<OutboundQueue::Entry> OutboundQueue::Peek(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + timeout;
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return HasUnsent() ||
           (open_batch_.lines_size() > 0 && absl::Now() - open_batch_since_ >= kLogBatchDelay);
  };
  while (!ready()) {
    absl::Time wake = deadline;
    if (open_batch_.lines_size() > 0) wake = std::min(wake, open_batch_since_ + kLogBatchDelay);
    if (absl::Now() >= deadline) break;
    mu_.AwaitWithDeadline(absl::Condition(this, &OutboundQueue::HasUnsent), wake);
  }
  if (!HasUnsent() && ready()) SealLogBatch();
  if (!HasUnsent()) return std::nullopt;
  // Sequences increase along the queue: the first unsent one by binary search (many may be sent
  // and waiting for their acknowledgement).
  auto first_unsent =
      std::upper_bound(messages_.begin(), messages_.end(), sent_through_,
                       [](uint64_t sent, const Entry& entry) { return sent < entry.sequence; });
  if (first_unsent == messages_.end()) return std::nullopt;
  return *first_unsent;
}

void OutboundQueue::MarkSent(uint64_t sequence) {
  absl::MutexLock lock(&mu_);
  sent_through_ = std::max(sent_through_, sequence);
}

void OutboundQueue::Acknowledge(uint64_t sequence) {
  absl::MutexLock lock(&mu_);
  AcknowledgeLocked(sequence);
}

void OutboundQueue::Pop(uint64_t sequence) {
  absl::MutexLock lock(&mu_);
  sent_through_ = std::max(sent_through_, sequence);
  AcknowledgeLocked(sequence);
}

void OutboundQueue::Rewind() {
  absl::MutexLock lock(&mu_);
  sent_through_ = 0;
}

std::optional<uint64_t> OutboundQueue::SessionEnded(const absl::Status& status,
                                                    std::optional<uint64_t> refused_seq) {
  if (!absl::IsInvalidArgument(status) || !refused_seq.has_value()) return std::nullopt;
  absl::MutexLock lock(&mu_);
  // Sequences increase along the queue.
  auto refused = std::lower_bound(
      messages_.begin(), messages_.end(), *refused_seq,
      [](const Entry& entry, uint64_t sequence) { return entry.sequence < sequence; });
  if (refused == messages_.end() || refused->sequence != *refused_seq) return std::nullopt;
  const uint64_t sequence = refused->sequence;
  // A rank status goes too, though none is ever dropped for want of room (and the coordinator
  // refuses none today): kept, it would hold up everything behind it for good; dropped, a rank
  // that ended is in neither list of the next heartbeat, so the coordinator still ends it
  // ("ended without a final status reaching the coordinator").
  LogError(absl::StrCat("the coordinator refused message ", sequence, " (",
                        Describe(refused->message), ") as malformed: ", status.message(),
                        "; dropped it rather than send it again, sending the rest"));
  ++refused_;
  bytes_ -= refused->bytes;
  messages_.erase(refused);
  if (journal_ != nullptr) {
    journal_->Dropped(sequence);
    CompactJournal();
  }
  return sequence;
}

std::vector<dropless::v1::RankStatus> OutboundQueue::PendingRankStatuses() const {
  absl::MutexLock lock(&mu_);
  std::vector<dropless::v1::RankStatus> latest;
  for (const Entry& entry : messages_) {
    if (!entry.message.has_rank_status()) continue;
    const dropless::v1::RankStatus& status = entry.message.rank_status();
    auto same = std::find_if(latest.begin(), latest.end(), [&](const dropless::v1::RankStatus& s) {
      return s.job_id() == status.job_id() && s.attempt() == status.attempt() &&
             s.rank() == status.rank();
    });
    if (same == latest.end()) {
      latest.push_back(status);
    } else {
      *same = status;
    }
  }
  return latest;
}

size_t OutboundQueue::size() const {
  absl::MutexLock lock(&mu_);
  return messages_.size() + (open_batch_.lines_size() > 0 ? 1 : 0);
}

size_t OutboundQueue::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

int64_t OutboundQueue::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

int64_t OutboundQueue::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

}  // namespace dropless
