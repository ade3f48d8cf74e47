// The outbound queue's journal: what the coordinator has not acknowledged, and the numbering,
// survive a restart of the daemon (a new OutboundQueue on the same file).
#include "worker/daemon/outbound_journal.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <fstream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/daemon/outbound_queue.h"

namespace dropless {
namespace {

namespace v1 = dropless::v1;

std::string TempJournalPath() {
  std::string dir = absl::StrCat(getenv("TMPDIR") != nullptr ? getenv("TMPDIR") : "/tmp",
                                 "/journal-test-XXXXXX");
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  return dir + "/outbound.journal";
}

v1::WorkerMessage Metrics(int step) {
  v1::WorkerMessage m;
  m.mutable_metrics()->set_step(step);
  m.mutable_metrics()->set_job_id(std::string(100, 'j'));
  return m;
}

// One daemon run: a queue restored from the journal at `path`.
struct DaemonRun {
  explicit DaemonRun(const std::string& path, const std::string& boot_id = "boot-new",
                     size_t max_messages = 10000, const std::string& host_boot_id = "host-boot-1")
      : queue(max_messages) {
    absl::StatusOr<std::unique_ptr<OutboundJournal>> journal =
        OutboundJournal::Open(path, boot_id, host_boot_id, &recovered);
    EXPECT_TRUE(journal.ok()) << journal.status();
    if (journal.ok()) queue.Restore(*std::move(journal), recovered);
  }
  OutboundJournal::Recovered recovered;
  OutboundQueue queue;
};

TEST(OutboundJournalTest, UnacknowledgedMessagesAndTheNumberingSurviveARestart) {
  const std::string path = TempJournalPath();
  {
    DaemonRun first(path, "boot-1");
    EXPECT_EQ(first.recovered.boot_id, "boot-1");
    EXPECT_TRUE(first.recovered.pending.empty());
    for (int step = 1; step <= 5; ++step) first.queue.Push(Metrics(step));
    first.queue.Acknowledge(2);
  }  // the daemon dies
  {
    DaemonRun second(path, "boot-2");
    EXPECT_EQ(second.recovered.boot_id, "boot-1");  // the same numbering goes on
    EXPECT_EQ(second.recovered.acknowledged, 2u);
    EXPECT_EQ(second.recovered.last_sequence, 5u);
    ASSERT_EQ(second.queue.size(), 3u);
    auto next = second.queue.Peek(absl::ZeroDuration());
    ASSERT_TRUE(next.has_value());
    EXPECT_EQ(next->sequence, 3u);
    EXPECT_EQ(next->message.metrics().step(), 3);
    second.queue.Push(Metrics(6));
    second.queue.Acknowledge(5);
    auto fresh = second.queue.Peek(absl::ZeroDuration());
    ASSERT_TRUE(fresh.has_value());
    EXPECT_EQ(fresh->sequence, 6u);  // after the old run's last, never reusing one
  }

  DaemonRun third(path);
  EXPECT_EQ(third.recovered.acknowledged, 5u);
  ASSERT_EQ(third.recovered.pending.size(), 1u);
  EXPECT_EQ(third.recovered.pending[0].first, 6u);
}

// A message the coordinator refused is gone for good: a restarted daemon does not send it again.
TEST(OutboundJournalTest, ARefusedMessageIsNotReplayedAfterARestart) {
  const std::string path = TempJournalPath();
  {
    DaemonRun first(path, "boot-1");
    for (int step = 1; step <= 3; ++step) first.queue.Push(Metrics(step));
    while (auto e = first.queue.Peek(absl::ZeroDuration())) first.queue.MarkSent(e->sequence);
    first.queue.Acknowledge(1);
    ASSERT_EQ(first.queue.SessionEnded(absl::InvalidArgumentError("malformed"), 2), 2u);
  }
  DaemonRun second(path);
  EXPECT_EQ(second.recovered.acknowledged, 1u);
  ASSERT_EQ(second.recovered.pending.size(), 1u);
  EXPECT_EQ(second.recovered.pending[0].first, 3u);
}

TEST(OutboundJournalTest, ARecordCutByACrashEndsTheReplay) {
  const std::string path = TempJournalPath();
  { DaemonRun first(path, "boot-1"); first.queue.Push(Metrics(1)); first.queue.Push(Metrics(2)); }
  {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    out << "M\x03";  // half a header
  }
  {
    DaemonRun second(path);
    EXPECT_EQ(second.recovered.boot_id, "boot-1");
    EXPECT_EQ(second.recovered.pending.size(), 2u);
    second.queue.Push(Metrics(3));  // appends after the compact rewrite, not after the torn bytes
  }
  DaemonRun third(path);
  EXPECT_EQ(third.recovered.pending.size(), 3u);
}

// A journal record as OutboundJournal writes it: kind, sequence, payload length, payload.
std::string JournalRecord(char kind, uint64_t sequence, const std::string& payload) {
  std::string out(1, kind);
  const uint32_t length = static_cast<uint32_t>(payload.size());
  out.append(reinterpret_cast<const char*>(&sequence), sizeof sequence);
  out.append(reinterpret_cast<const char*>(&length), sizeof length);
  return out + payload;
}

v1::WorkerMessage RankEnded(int rank) {
  v1::WorkerMessage m;
  m.mutable_rank_status()->set_job_id("job-1");
  m.mutable_rank_status()->set_attempt(1);
  m.mutable_rank_status()->set_rank(rank);
  m.mutable_rank_status()->set_state(v1::RANK_STATE_SUCCEEDED);
  return m;
}

// A complete record that cannot be read is corruption, not a crash-torn tail: what came after it
// (here the acknowledgement of 2..4, as the coordinator stored them) is lost, so going on in the
// same boot from sequence 4 would have the coordinator drop the new messages as resends. The
// daemon begins a new boot and sends what was unacknowledged before the bad record again,
// renumbered from 1 in that boot; the rank end among them is not lost.
TEST(OutboundJournalTest, AnUnreadableRecordBeginsANewBootWithWhatCameBeforeIt) {
  for (const std::string& bad : {JournalRecord('M', 5, "\xff\xff\xff"),  // does not parse
                                 JournalRecord('Z', 5, "junk")}) {       // an unknown kind
    const std::string path = TempJournalPath();
    {
      DaemonRun first(path, "boot-1");
      first.queue.Push(Metrics(1));
      first.queue.Push(Metrics(2));
      first.queue.Push(RankEnded(0));
      first.queue.Push(Metrics(3));
      first.queue.Acknowledge(1);
    }
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    {
      std::ofstream out(path, std::ios::binary | std::ios::app);
      out << bad << JournalRecord('A', 4, "");
    }
    {
      DaemonRun second(path, "boot-2");
      EXPECT_EQ(second.recovered.boot_id, "boot-2");
      EXPECT_EQ(second.recovered.corrupt_at, static_cast<int64_t>(st.st_size));
      EXPECT_EQ(second.recovered.acknowledged, 0u);
      EXPECT_EQ(second.recovered.last_sequence, 3u);
      ASSERT_EQ(second.recovered.pending.size(), 3u);
      EXPECT_EQ(second.recovered.pending[0].first, 1u);
      EXPECT_EQ(second.recovered.pending[0].second.metrics().step(), 2);
      EXPECT_EQ(second.recovered.pending[1].first, 2u);
      EXPECT_TRUE(second.recovered.pending[1].second.has_rank_status());
      EXPECT_EQ(second.recovered.pending[2].first, 3u);
      EXPECT_EQ(second.queue.PendingRankStatuses().size(), 1u);  // the next Hello lists it ended
      auto next = second.queue.Peek(absl::ZeroDuration());
      ASSERT_TRUE(next.has_value());
      EXPECT_EQ(next->sequence, 1u);
      second.queue.Push(Metrics(4));
      EXPECT_EQ(stat((path + ".corrupt").c_str(), &st), 0) << "the bad file was not kept";
    }
    DaemonRun third(path, "boot-3");  // the new boot goes on, its journal readable
    EXPECT_EQ(third.recovered.boot_id, "boot-2");
    EXPECT_EQ(third.recovered.corrupt_at, -1);
    EXPECT_EQ(third.recovered.pending.size(), 4u);
    EXPECT_EQ(third.recovered.last_sequence, 4u);
  }
}

TEST(OutboundJournalTest, DroppedMessagesStayDroppedAndAcknowledgedOnesAreCompactedAway) {
  const std::string path = TempJournalPath();
  {
    DaemonRun first(path, "boot-1", /*max_messages=*/2);
    for (int step = 1; step <= 4; ++step) first.queue.Push(Metrics(step));  // 1 and 2 dropped
  }
  {
    DaemonRun second(path);
    ASSERT_EQ(second.recovered.pending.size(), 2u);
    EXPECT_EQ(second.recovered.pending[0].second.metrics().step(), 3);
    // Many messages, each acknowledged: the file is rewritten instead of growing without end.
    for (int step = 5; step < 20005; ++step) {
      second.queue.Push(Metrics(step));
      second.queue.Acknowledge(static_cast<uint64_t>(step));
    }
  }
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_LT(st.st_size, 2 << 20);
  DaemonRun third(path);
  EXPECT_TRUE(third.recovered.pending.empty());
  EXPECT_EQ(third.recovered.last_sequence, 20004u);
}

// Through an outage nothing is acknowledged: the queue stays within its bound by dropping the
// oldest messages, and the journal is compacted on those drops, so the file follows the bound, not
// the outage's length (before, it grew by every message until the coordinator came back).
TEST(OutboundJournalTest, AJournalThroughAnOutageStaysNearTheQueuesBound) {
  const std::string path = TempJournalPath();
  {
    DaemonRun run(path, "boot-1", /*max_messages=*/100);
    for (int step = 1; step <= 50000; ++step) run.queue.Push(Metrics(step));
    EXPECT_EQ(run.queue.dropped(), 49900);
  }
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_LT(st.st_size, 3 << 20);  // 50 000 records of ~110 bytes would be ~6 MiB
  DaemonRun after(path);
  ASSERT_EQ(after.recovered.pending.size(), 100u);
  EXPECT_EQ(after.recovered.pending.front().second.metrics().step(), 49901);
  EXPECT_EQ(after.recovered.pending.back().second.metrics().step(), 50000);
}

TEST(OutboundJournalTest, OneProcessAtATimeHoldsAJournal) {
  const std::string path = TempJournalPath();
  OutboundJournal::Recovered recovered;
  absl::StatusOr<std::unique_ptr<OutboundJournal>> first =
      OutboundJournal::Open(path, "boot-1", "host-boot-1", &recovered);
  ASSERT_TRUE(first.ok()) << first.status();
  // flock is per open file description: a second Open in this process stands for another daemon.
  absl::StatusOr<std::unique_ptr<OutboundJournal>> second =
      OutboundJournal::Open(path, "boot-2", "host-boot-1", &recovered);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("work_dir"), absl::string_view::npos);
  first->reset();
  EXPECT_TRUE(OutboundJournal::Open(path, "boot-2", "host-boot-1", &recovered).ok());
  EXPECT_EQ(recovered.boot_id, "boot-1");
}

// A write that fails (here: the file size limit, as a full disk would) turns the journal off while
// the queue numbers on in memory. The file is removed: kept, it would restart this boot's numbering
// below what the coordinator already stored, and those messages would be dropped as resends.
TEST(OutboundJournalTest, AJournalThatFailsIsRemovedSoARestartIsANewBoot) {
  const std::string path = TempJournalPath();
  {
    DaemonRun first(path, "boot-1");
    for (int step = 1; step <= 3; ++step) first.queue.Push(Metrics(step));
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    struct rlimit old_limit;
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
    struct rlimit limit = old_limit;
    limit.rlim_cur = static_cast<rlim_t>(st.st_size) + 16;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
    first.queue.Push(Metrics(4));  // its record does not fit under the limit
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old_limit), 0);
    signal(SIGXFSZ, old_handler);
    for (int step = 5; step <= 6; ++step) first.queue.Push(Metrics(step));
    EXPECT_EQ(first.queue.size(), 6u);  // the queue goes on in memory
    EXPECT_NE(stat(path.c_str(), &st), 0) << "the journal was left behind";
  }  // the daemon dies
  DaemonRun second(path, "boot-2");
  EXPECT_EQ(second.recovered.boot_id, "boot-2");
  EXPECT_EQ(second.recovered.last_sequence, 0u);
  EXPECT_TRUE(second.recovered.pending.empty());
}

// The compact rewrite at start fails (here: the file size limit, as a full disk would). What was
// read is still delivered, from memory, in the same boot; the old file is removed, or a later run
// would replay it in this boot below the numbers this one went on to use.
TEST(OutboundJournalTest, AJournalThatCannotBeRewrittenAtStartIsDeliveredAndRemoved) {
  const std::string path = TempJournalPath();
  {
    DaemonRun first(path, "boot-1");
    first.queue.Push(Metrics(1));
    first.queue.Push(RankEnded(0));
    first.queue.Push(Metrics(2));
    first.queue.Acknowledge(1);
  }
  struct rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
  struct rlimit limit = old_limit;
  limit.rlim_cur = 16;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  OutboundJournal::Recovered recovered;
  absl::StatusOr<std::unique_ptr<OutboundJournal>> journal =
      OutboundJournal::Open(path, "boot-2", "host-boot-1", &recovered);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  signal(SIGXFSZ, old_handler);
  ASSERT_TRUE(journal.ok()) << journal.status();
  EXPECT_FALSE((*journal)->enabled());
  EXPECT_EQ(recovered.boot_id, "boot-1");
  EXPECT_EQ(recovered.last_sequence, 3u);
  ASSERT_EQ(recovered.pending.size(), 2u);
  EXPECT_TRUE(recovered.pending[0].second.has_rank_status());
  struct stat st;
  EXPECT_NE(stat(path.c_str(), &st), 0) << "the journal was left behind to be replayed";
  {
    OutboundQueue queue;
    queue.Restore(*std::move(journal), recovered);
    auto next = queue.Peek(absl::ZeroDuration());
    ASSERT_TRUE(next.has_value());
    EXPECT_EQ(next->sequence, 2u);
    EXPECT_TRUE(next->message.has_rank_status());
    queue.Push(Metrics(3));
    EXPECT_EQ(queue.size(), 3u);
  }  // the daemon dies
  DaemonRun second(path, "boot-3");
  EXPECT_EQ(second.recovered.boot_id, "boot-3");
  EXPECT_TRUE(second.recovered.pending.empty());
}

// The journal is not synced, so one written before the host last booted may have lost its tail
// (a rank's STARTING): it is not replayed, and the daemon begins a new boot, which the coordinator
// never resends an old boot's Assignments to. A journal without a host boot id (an older daemon's)
// is replayed, and records the host's from then on.
TEST(OutboundJournalTest, AJournalFromBeforeTheHostBootedIsANewBoot) {
  const std::string path = TempJournalPath();
  {
    DaemonRun first(path, "boot-1", 10000, "host-boot-1");
    for (int step = 1; step <= 3; ++step) first.queue.Push(Metrics(step));
    first.queue.Acknowledge(1);
  }  // the daemon dies; the daemon starts again on the same host boot
  {
    DaemonRun same_host(path, "boot-2", 10000, "host-boot-1");
    EXPECT_EQ(same_host.recovered.boot_id, "boot-1");
    EXPECT_EQ(same_host.recovered.pending.size(), 2u);
    EXPECT_EQ(same_host.recovered.discarded_after_host_boot, 0u);
  }  // the host reboots
  {
    DaemonRun rebooted(path, "boot-3", 10000, "host-boot-2");
    EXPECT_EQ(rebooted.recovered.boot_id, "boot-3");
    EXPECT_TRUE(rebooted.recovered.pending.empty());
    EXPECT_EQ(rebooted.recovered.acknowledged, 0u);
    EXPECT_EQ(rebooted.recovered.last_sequence, 0u);
    EXPECT_EQ(rebooted.recovered.discarded_after_host_boot, 2u);
    rebooted.queue.Push(Metrics(10));
  }
  {
    DaemonRun again(path, "boot-4", 10000, "host-boot-2");  // the new boot goes on
    EXPECT_EQ(again.recovered.boot_id, "boot-3");
    EXPECT_EQ(again.recovered.pending.size(), 1u);
  }
  const std::string old_daemons = TempJournalPath();
  {
    DaemonRun unknown_host(old_daemons, "boot-1", 10000, /*host_boot_id=*/"");
    unknown_host.queue.Push(Metrics(1));
  }
  {
    DaemonRun first_known(old_daemons, "boot-2", 10000, "host-boot-2");
    EXPECT_EQ(first_known.recovered.boot_id, "boot-1");
    EXPECT_EQ(first_known.recovered.pending.size(), 1u);
  }
  DaemonRun rebooted(old_daemons, "boot-3", 10000, "host-boot-3");
  EXPECT_EQ(rebooted.recovered.boot_id, "boot-3");
}

TEST(OutboundJournalTest, HostBootIdIsTheKernels) {
  const std::string id = OutboundJournal::HostBootId();
  EXPECT_EQ(id.size(), 36u) << id;  // a UUID
  EXPECT_EQ(id, OutboundJournal::HostBootId());
}

TEST(OutboundJournalTest, AnUnwritableDirectoryIsAnError) {
  OutboundJournal::Recovered recovered;
  EXPECT_FALSE(
      OutboundJournal::Open("/proc/no-such-dir/outbound.journal", "b", "h", &recovered).ok());
}

}  // namespace
}  // namespace dropless
