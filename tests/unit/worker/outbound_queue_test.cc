#include "worker/daemon/outbound_queue.h"

#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace dropless {
namespace {

namespace v1 = dropless::v1;

v1::WorkerMessage Status(int rank) {
  v1::WorkerMessage m;
  m.mutable_rank_status()->set_rank(rank);
  return m;
}

v1::WorkerMessage Metrics(int step) {
  v1::WorkerMessage m;
  m.mutable_metrics()->set_step(step);
  return m;
}

v1::LogLine Line(const std::string& text) {
  v1::LogLine l;
  l.set_text(text);
  return l;
}

// Drains the queue, popping everything ready within a short wait.
std::vector<v1::WorkerMessage> Drain(OutboundQueue& q,
                                     absl::Duration wait = absl::Milliseconds(10)) {
  std::vector<v1::WorkerMessage> out;
  while (auto e = q.Peek(wait)) {
    out.push_back(e->message);
    q.Pop(e->sequence);
  }
  return out;
}

// The acknowledging protocol: a written message stays until acknowledged; a new session (Rewind)
// sends every unacknowledged one again, with its sequence, before anything newer.
TEST(OutboundQueueTest, UnacknowledgedMessagesGoAgainAfterRewind) {
  OutboundQueue q;
  q.Push(Status(1));
  q.Push(Metrics(2));
  q.Push(Metrics(3));
  auto a = q.Peek(absl::ZeroDuration());
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->message.rank_status().rank(), 1);
  q.MarkSent(a->sequence);
  auto b = q.Peek(absl::ZeroDuration());
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->message.metrics().step(), 2);
  q.MarkSent(b->sequence);
  q.Acknowledge(a->sequence);  // the coordinator stored the first only
  EXPECT_EQ(q.size(), 2u);
  auto c = q.Peek(absl::ZeroDuration());
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->message.metrics().step(), 3);  // the next one not yet written

  q.Rewind();  // the session broke before 2 was acknowledged
  auto again = q.Peek(absl::ZeroDuration());
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->sequence, b->sequence);  // the same message, the same sequence
  EXPECT_EQ(again->message.metrics().step(), 2);
  q.MarkSent(again->sequence);
  auto last = q.Peek(absl::ZeroDuration());
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->message.metrics().step(), 3);
  q.MarkSent(last->sequence);
  EXPECT_FALSE(q.Peek(absl::Milliseconds(5)).has_value());  // all written, none acknowledged
  EXPECT_EQ(q.size(), 2u);
  q.Acknowledge(last->sequence);
  EXPECT_EQ(q.size(), 0u);
}

TEST(OutboundQueueTest, PendingRankStatusesKeepTheLatestPerRankUntilAcknowledged) {
  auto status = [](const std::string& job, int rank, v1::RankState state) {
    v1::WorkerMessage m;
    m.mutable_rank_status()->set_job_id(job);
    m.mutable_rank_status()->set_attempt(1);
    m.mutable_rank_status()->set_rank(rank);
    m.mutable_rank_status()->set_state(state);
    return m;
  };
  OutboundQueue q;
  q.Push(status("j", 0, v1::RANK_STATE_RUNNING));
  q.Push(Metrics(5));
  q.Push(status("j", 1, v1::RANK_STATE_RUNNING));
  q.Push(status("j", 0, v1::RANK_STATE_SUCCEEDED));
  std::vector<v1::RankStatus> pending = q.PendingRankStatuses();
  ASSERT_EQ(pending.size(), 2u);
  EXPECT_EQ(pending[0].rank(), 0);
  EXPECT_EQ(pending[0].state(), v1::RANK_STATE_SUCCEEDED);  // the latest of rank 0
  EXPECT_EQ(pending[1].rank(), 1);
  EXPECT_EQ(pending[1].state(), v1::RANK_STATE_RUNNING);
  auto first = q.Peek(absl::ZeroDuration());
  ASSERT_TRUE(first.has_value());
  q.Acknowledge(first->sequence + 2);  // rank 0 RUNNING, the metrics, rank 1 RUNNING stored
  pending = q.PendingRankStatuses();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].state(), v1::RANK_STATE_SUCCEEDED);
}

TEST(OutboundQueueTest, PeekWaitsForAnUnsentMessage) {
  OutboundQueue q;
  q.Push(Status(1));
  auto a = q.Peek(absl::ZeroDuration());
  ASSERT_TRUE(a.has_value());
  q.MarkSent(a->sequence);
  std::thread pusher([&q] {
    absl::SleepFor(absl::Milliseconds(50));
    q.Push(Metrics(9));
  });
  auto b = q.Peek(absl::Seconds(5));
  pusher.join();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->message.metrics().step(), 9);
  EXPECT_GT(b->sequence, a->sequence);
}

TEST(OutboundQueueTest, KeepsOrderAndPeekDoesNotRemove) {
  OutboundQueue q;
  q.Push(Status(1));
  q.Push(Metrics(2));
  auto first = q.Peek(absl::ZeroDuration());
  ASSERT_TRUE(first.has_value());
  auto again = q.Peek(absl::ZeroDuration());
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(first->sequence, again->sequence);
  EXPECT_EQ(again->message.rank_status().rank(), 1);
  q.Pop(first->sequence);
  q.Pop(first->sequence);  // a second pop of the same entry does nothing
  std::vector<v1::WorkerMessage> rest = Drain(q);
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].metrics().step(), 2);
  EXPECT_FALSE(q.Peek(absl::Milliseconds(1)).has_value());
}

TEST(OutboundQueueTest, LogLinesAreBatchedAndSealedBeforeTheNextMessage) {
  OutboundQueue q;
  q.PushLogLine(Line("a"));
  q.PushLogLine(Line("b"));
  q.Push(Status(0));  // the rank's exit comes after its last lines
  q.PushLogLine(Line("c"));
  std::vector<v1::WorkerMessage> got = Drain(q, OutboundQueue::kLogBatchDelay * 2);
  ASSERT_EQ(got.size(), 3u);
  ASSERT_TRUE(got[0].has_logs());
  ASSERT_EQ(got[0].logs().lines_size(), 2);
  EXPECT_EQ(got[0].logs().lines(0).text(), "a");
  EXPECT_EQ(got[0].logs().lines(1).text(), "b");
  EXPECT_TRUE(got[1].has_rank_status());
  ASSERT_TRUE(got[2].has_logs());
  EXPECT_EQ(got[2].logs().lines(0).text(), "c");
}

TEST(OutboundQueueTest, YoungLogBatchWaitsForItsDelay) {
  OutboundQueue q;
  const absl::Time start = absl::Now();
  q.PushLogLine(Line("x"));
  EXPECT_FALSE(q.Peek(absl::ZeroDuration()).has_value());
  auto e = q.Peek(absl::Seconds(5));
  ASSERT_TRUE(e.has_value());
  EXPECT_GE(absl::Now() - start, OutboundQueue::kLogBatchDelay);
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
}

TEST(OutboundQueueTest, FullBatchGoesAtOnce) {
  OutboundQueue q;
  for (int i = 0; i < OutboundQueue::kMaxLogBatchLines; ++i) q.PushLogLine(Line(absl::StrCat(i)));
  auto e = q.Peek(absl::ZeroDuration());
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->message.logs().lines_size(), OutboundQueue::kMaxLogBatchLines);
}

TEST(OutboundQueueTest, PeekWakesOnPush) {
  OutboundQueue q;
  std::thread producer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    q.Push(Metrics(9));
  });
  const absl::Time start = absl::Now();
  auto e = q.Peek(absl::Seconds(10));
  producer.join();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->message.metrics().step(), 9);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(OutboundQueueTest, BoundedDropsOldestMetricsBeforeStatuses) {
  OutboundQueue q(4);
  q.Push(Status(0));
  q.Push(Metrics(1));
  q.Push(Metrics(2));
  q.Push(Status(3));
  q.Push(Metrics(4));  // drops Metrics(1)
  q.Push(Metrics(5));  // drops Metrics(2)
  EXPECT_EQ(q.dropped(), 2);
  std::vector<v1::WorkerMessage> got = Drain(q);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].rank_status().rank(), 0);
  EXPECT_EQ(got[1].rank_status().rank(), 3);
  EXPECT_EQ(got[2].metrics().step(), 4);
  EXPECT_EQ(got[3].metrics().step(), 5);
}

// A rank status is never dropped, even when the queue holds nothing else: the coordinator would
// not learn that the rank ended and could send its Assignment again. A message of another kind is
// refused instead, and statuses go beyond the bound (they are bounded by the daemon's ranks).
TEST(OutboundQueueTest, BoundedNeverDropsARankStatus) {
  OutboundQueue q(2);
  q.Push(Status(0));
  q.Push(Status(1));
  q.Push(Metrics(2));  // refused: only statuses are queued
  q.PushLogLine(Line("refused too"));
  q.Push(Status(3));  // kept beyond the bound
  EXPECT_EQ(q.dropped(), 2);
  std::vector<v1::WorkerMessage> got = Drain(q);
  ASSERT_EQ(got.size(), 3u);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(got[i].has_rank_status()) << i;
  EXPECT_EQ(got[0].rank_status().rank(), 0);
  EXPECT_EQ(got[1].rank_status().rank(), 1);
  EXPECT_EQ(got[2].rank_status().rank(), 3);
}

// Bounded in bytes as well as messages: large messages (log batches reach 512 KiB) drop the oldest
// others until the new one fits, every loss reaches the drop observer (the daemon's
// dropless_worker_outbound_dropped_total), and rank statuses still stay.
TEST(OutboundQueueTest, BoundedInBytesDropsTheOldestUntilTheNewOneFits) {
  OutboundQueue q(/*max_messages=*/1000, /*max_bytes=*/3000);
  int64_t observed = 0;
  q.SetDropObserver([&](int64_t count) { observed += count; });
  q.Push(Status(0));
  for (int step = 1; step <= 5; ++step) {
    v1::WorkerMessage m = Metrics(step);
    m.mutable_metrics()->set_job_id(std::string(1000, 'j'));
    q.Push(m);
    EXPECT_LE(q.bytes(), 3000u) << step;
  }
  EXPECT_EQ(q.dropped(), 3);
  EXPECT_EQ(observed, 3);
  std::vector<v1::WorkerMessage> got = Drain(q);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(got[0].has_rank_status());
  EXPECT_EQ(got[1].metrics().step(), 4);
  EXPECT_EQ(got[2].metrics().step(), 5);
  EXPECT_EQ(q.bytes(), 0u);
}

TEST(OutboundQueueTest, PopAfterTheEntryWasDroppedKeepsTheNewFront) {
  OutboundQueue q(1);
  q.Push(Metrics(1));
  auto e = q.Peek(absl::ZeroDuration());
  ASSERT_TRUE(e.has_value());
  q.Push(Metrics(2));  // drops the peeked entry
  q.Pop(e->sequence);
  std::vector<v1::WorkerMessage> got = Drain(q);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].metrics().step(), 2);
}

// Sends what the queue has ready on "a session", as the session's writer does.
std::vector<uint64_t> SendAll(OutboundQueue& q) {
  std::vector<uint64_t> sent;
  while (auto e = q.Peek(absl::ZeroDuration())) {
    q.MarkSent(e->sequence);
    sent.push_back(e->sequence);
  }
  return sent;
}

// The coordinator ends the session with InvalidArgument at a message it refuses as malformed
// (after acknowledging those before it) and would refuse it again on every resend: the queue
// drops it, once, and the next session delivers the rest.
TEST(OutboundQueueTest, ARefusedMessageIsDroppedAndTheNextOneDelivered) {
  OutboundQueue q;
  q.Push(Metrics(1));
  v1::WorkerMessage bad = Metrics(2);
  for (int i = 0; i < 1025; ++i) bad.mutable_metrics()->add_expert_tokens(i);
  q.Push(bad);
  q.Push(Metrics(3));
  q.Push(Status(4));
  ASSERT_EQ(SendAll(q).size(), 4u);
  q.Acknowledge(1);  // stored; the session ends at the next one
  const std::optional<uint64_t> dropped = q.SessionEnded(
      absl::InvalidArgumentError(
          "metrics.expert_tokens: at most 1024 entries (one per expert; a spec has at most that "
          "many experts), got 1025"),
      2);
  ASSERT_TRUE(dropped.has_value());
  EXPECT_EQ(*dropped, 2u);
  EXPECT_EQ(q.refused(), 1);
  EXPECT_EQ(q.dropped(), 0);  // not a drop for want of room
  EXPECT_EQ(q.size(), 2u);

  q.Rewind();  // the next session
  auto next = q.Peek(absl::ZeroDuration());
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->sequence, 3u);
  EXPECT_EQ(next->message.metrics().step(), 3);
  q.MarkSent(next->sequence);
  auto last = q.Peek(absl::ZeroDuration());
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->message.rank_status().rank(), 4);
  q.MarkSent(last->sequence);
  q.Acknowledge(last->sequence);
  EXPECT_EQ(q.size(), 0u);
  EXPECT_EQ(q.refused(), 1);
}

// Transient ends (the coordinator down or restarting, a deadline, a lost connection, the daemon
// cancelling) drop nothing: every unacknowledged message goes again on the next session.
TEST(OutboundQueueTest, ATransientEndOfTheSessionKeepsEveryMessageForTheNext) {
  for (const absl::Status& end :
       {absl::UnavailableError("connection reset"), absl::DeadlineExceededError("deadline"),
        absl::CancelledError("cancelled"), absl::UnknownError("stream removed"),
        absl::InternalError("RST_STREAM"), absl::AbortedError("superseded"),
        absl::ResourceExhaustedError("too many streams"), absl::OkStatus()}) {
    OutboundQueue q;
    q.Push(Metrics(1));
    q.Push(Metrics(2));
    ASSERT_EQ(SendAll(q).size(), 2u);
    EXPECT_FALSE(q.SessionEnded(end, std::nullopt).has_value()) << end;
    EXPECT_FALSE(q.SessionEnded(end, 1).has_value()) << end;  // only InvalidArgument refuses
    EXPECT_EQ(q.refused(), 0) << end;
    EXPECT_EQ(q.size(), 2u) << end;
    q.Rewind();
    auto again = q.Peek(absl::ZeroDuration());
    ASSERT_TRUE(again.has_value()) << end;
    EXPECT_EQ(again->sequence, 1u) << end;  // the same message, the same sequence
    EXPECT_EQ(again->message.metrics().step(), 1) << end;
  }
}

// A refusal that names no queued message (the coordinator refused the Hello) is not about the
// queue, and one that names a message no longer queued (dropped for room meanwhile, or
// acknowledged) drops nothing else: only the message the coordinator named ever goes.
TEST(OutboundQueueTest, OnlyTheMessageTheCoordinatorNamesIsDropped) {
  OutboundQueue q;
  q.Push(Metrics(1));
  q.Push(Status(2));
  ASSERT_EQ(SendAll(q).size(), 2u);
  EXPECT_FALSE(q.SessionEnded(absl::InvalidArgumentError("hello: ..."), std::nullopt).has_value());
  EXPECT_FALSE(q.SessionEnded(absl::InvalidArgumentError("refused"), 7).has_value());
  EXPECT_EQ(q.size(), 2u);
  EXPECT_EQ(q.refused(), 0);
  q.Acknowledge(1);
  EXPECT_FALSE(q.SessionEnded(absl::InvalidArgumentError("refused"), 1).has_value());
  EXPECT_EQ(q.size(), 1u);
  // The named message is dropped wherever it stands, a rank status behind it kept.
  q.Push(Metrics(3));
  q.Push(Metrics(4));
  ASSERT_EQ(SendAll(q).size(), 2u);
  ASSERT_EQ(q.SessionEnded(absl::InvalidArgumentError("refused"), 4), 4u);
  EXPECT_EQ(q.size(), 2u);
  q.Rewind();
  auto next = q.Peek(absl::ZeroDuration());
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->message.rank_status().rank(), 2);
}

// The refused message dropped for room before the session's end was seen: the message behind it
// (sent, not acknowledged, never handled by the coordinator) stays queued.
TEST(OutboundQueueTest, ARefusedMessageAlreadyDroppedForRoomTakesNothingWithIt) {
  OutboundQueue q(/*max_messages=*/3, /*max_bytes=*/1 << 20);
  q.Push(Metrics(1));
  q.Push(Status(2));
  q.Push(Metrics(3));
  ASSERT_EQ(SendAll(q).size(), 3u);
  q.Push(Metrics(4));  // full: the oldest non-status message (1, the refused one) goes
  EXPECT_EQ(q.dropped(), 1);
  EXPECT_FALSE(q.SessionEnded(absl::InvalidArgumentError("refused"), 1).has_value());
  EXPECT_EQ(q.size(), 3u);
  EXPECT_EQ(q.refused(), 0);
}

}  // namespace
}  // namespace dropless
