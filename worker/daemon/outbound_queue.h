// OutboundQueue: messages from the worker daemon to the coordinator, kept while the session is
// down and sent in order once it is back. Bounded in messages and in bytes: when full, the oldest
// message that is not a rank status is dropped; a rank status is never dropped (the coordinator
// would not learn that the rank ended and could start it again), so with only statuses queued a
// new message of another kind is refused, and statuses (bounded by the ranks the daemon runs) may
// exceed the bound. Drops are counted (dropped(), and the observer the daemon turns into
// dropless_worker_outbound_dropped_total) and logged, at most once a minute.
//
// Log lines are batched: they collect into one LogBatch until it holds kMaxLogBatchLines lines
// (or about kMaxLogBatchBytes) or its first line is kLogBatchDelay old, and any other message seals
// the open batch first, so a rank's last lines go out before its exit status.
//
// One consumer (the session writer) uses Peek / MarkSent / Acknowledge: Peek returns the oldest
// message not yet sent on this session, and a message leaves the queue only when the coordinator
// acknowledges it (or, with a coordinator that does not acknowledge, once written: Pop). Rewind at
// the start of a session sends every unacknowledged message again, so a message in flight when
// the coordinator died is not lost; its sequence lets the coordinator store it once. With a
// journal (Restore) the queue also survives a restart of the daemon (outbound_journal.h); the
// open log batch, at most kLogBatchDelay of lines, does not.
//
// A message the coordinator refuses as malformed (SessionEnded with InvalidArgument) is dropped
// rather than sent again: it would be refused on every session, and everything behind it with it.
#ifndef DROPLESS_WORKER_DAEMON_OUTBOUND_QUEUE_H_
#define DROPLESS_WORKER_DAEMON_OUTBOUND_QUEUE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dropless/v1/worker_service.pb.h"
#include "worker/daemon/outbound_journal.h"

namespace dropless {

class OutboundQueue {
 public:
  static constexpr int kMaxLogBatchLines = 200;
  static constexpr size_t kMaxLogBatchBytes = 512 * 1024;
  static constexpr absl::Duration kLogBatchDelay = absl::Milliseconds(200);

  // max_bytes counts the messages' serialized sizes.
  explicit OutboundQueue(size_t max_messages = 10000, size_t max_bytes = size_t{256} << 20);

  // Called (under the queue's lock: it must not call back into the queue) with how many messages
  // or log lines each drop or refusal lost.
  void SetDropObserver(std::function<void(int64_t)> observer);

  // Before any other call: takes the messages a previous run left (sequences continue after
  // recovered.last_sequence) and records every change in `journal` from now on.
  void Restore(std::unique_ptr<OutboundJournal> journal, OutboundJournal::Recovered recovered);

  void Push(dropless::v1::WorkerMessage message);
  void PushLogLine(dropless::v1::LogLine line);

  struct Entry {
    uint64_t sequence = 0;
    dropless::v1::WorkerMessage message;
    size_t bytes = 0;  // message.ByteSizeLong() when queued
  };
  // A copy of the oldest message not yet sent on this session, waiting up to `timeout` for one
  // (an open log batch counts once it is kLogBatchDelay old). nullopt when none is ready in time.
  std::optional<Entry> Peek(absl::Duration timeout);
  // The entry Peek returned was written: Peek moves on to the next one.
  void MarkSent(uint64_t sequence);
  // The coordinator stored every message up to `sequence`: they leave the queue.
  void Acknowledge(uint64_t sequence);
  // Written and done with (a coordinator that does not acknowledge): MarkSent + Acknowledge.
  void Pop(uint64_t sequence);
  // A new session: every message still queued is sent again, oldest first.
  void Rewind();
  // The session ended with `status` (the coordinator's status of the stream, after every message
  // it sent was read) and `refused_seq` (its trailing kRefusedSeqMetadata, common/api_metadata.h).
  // InvalidArgument with a seq is the coordinator refusing that message as malformed (e.g. step
  // metrics with more expert_tokens than a spec can have experts): it would be refused again on
  // every resend, holding up everything queued behind it, so it is dropped (logged once with the
  // reason, counted in refused()) and the rest go on the next session. Only that message: one
  // already gone (dropped for room, acknowledged) drops nothing, and so does a refusal without a
  // seq (the Hello) or any other status (Unavailable, DeadlineExceeded, Cancelled, a lost
  // connection), which keeps every message for the next session. Returns the dropped sequence.
  std::optional<uint64_t> SessionEnded(const absl::Status& status,
                                       std::optional<uint64_t> refused_seq);
  // The latest queued (unacknowledged) RankStatus of every (job, attempt, rank), oldest first.
  // The next Hello lists the ended ones next to the live ranks: a rank that exited while the
  // session was down is then known to have ended before the coordinator reconciles the Hello.
  std::vector<dropless::v1::RankStatus> PendingRankStatuses() const;

  size_t size() const;
  // Serialized bytes of the queued messages (the open log batch not counted).
  size_t bytes() const;
  // Messages (or log lines) dropped or refused because the queue was full.
  int64_t dropped() const;
  // Messages dropped because the coordinator refused them (SessionEnded).
  int64_t refused() const;

 private:
  void SealLogBatch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasUnsent() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !messages_.empty() && messages_.back().sequence > sent_through_;
  }
  void Append(dropless::v1::WorkerMessage message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Full(size_t incoming_bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return messages_.size() >= max_messages_ || bytes_ + incoming_bytes > max_bytes_;
  }
  void CountDropped(int64_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AcknowledgeLocked(uint64_t sequence) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rewrites the journal when it is mostly acknowledged or dropped messages.
  void CompactJournal() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_messages_;
  const size_t max_bytes_;
  mutable absl::Mutex mu_;
  std::deque<Entry> messages_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t sent_through_ ABSL_GUARDED_BY(mu_) = 0;  // highest sequence written this session
  dropless::v1::LogBatch open_batch_ ABSL_GUARDED_BY(mu_);
  absl::Time open_batch_since_ ABSL_GUARDED_BY(mu_);
  size_t open_batch_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_logged_ ABSL_GUARDED_BY(mu_) = 0;  // dropped_ as the last warning said
  absl::Time drop_logged_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::function<void(int64_t)> drop_observer_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<OutboundJournal> journal_ ABSL_GUARDED_BY(mu_);  // null: memory only
};

}  // namespace dropless

#endif  // DROPLESS_WORKER_DAEMON_OUTBOUND_QUEUE_H_
