// Rank logs on disk are capped and rotated (RankLogFile), through the rank supervisor's write path
// (a real child that prints more than the cap) and through the rank manager (a failing chatty
// rank whose failure message still quotes its last line); and the --rank-log-max-bytes setting.
#include "worker/daemon/rank_log_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/daemon/outbound_queue.h"
#include "worker/daemon/rank_manager.h"
#include "worker/daemon/rank_supervisor.h"
#include "worker/daemon/worker_config.h"
#include "worker/daemon/worker_metrics.h"

namespace dropless {
namespace {

namespace v1 = dropless::v1;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

bool EndsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Lines of random printable text of random lengths, different on every run.
std::vector<std::string> FreshLines(int count, std::mt19937_64* rng) {
  std::uniform_int_distribution<int> length(0, 120);
  std::uniform_int_distribution<int> letter('!', '~');
  std::vector<std::string> lines;
  for (int i = 0; i < count; ++i) {
    std::string line = absl::StrCat("line ", i, " ");
    for (int n = length(*rng); n > 0; --n) line.push_back(static_cast<char>(letter(*rng)));
    lines.push_back(line + "\n");
  }
  return lines;
}

class RankLogFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/dropless-rank-log-test-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(system(absl::StrCat("rm -rf '", dir_, "' && mkdir -p '", dir_, "'").c_str()), 0);
    path_ = dir_ + "/rank-0.log";
  }
  void TearDown() override {
    ASSERT_EQ(system(absl::StrCat("rm -rf '", dir_, "'").c_str()), 0);
  }

  // <path>.1 then <path> must be the end of `written`, each at most `cap` bytes, <path> ending
  // with the newest bytes.
  void ExpectNewestKept(const std::string& written, int64_t cap) {
    const std::string newest = ReadFile(path_);
    const std::string older = ReadFile(path_ + ".1");
    EXPECT_LE(static_cast<int64_t>(newest.size()), cap);
    EXPECT_LE(static_cast<int64_t>(older.size()), cap);
    EXPECT_FALSE(newest.empty());
    EXPECT_TRUE(EndsWith(written, older + newest))
        << "rank-0.log.1 + rank-0.log is not the end of the output";
  }

  std::string dir_;
  std::string path_;
};

// Output arriving in chunks of whole lines (as a rank that flushes per line writes it): each
// rotation cuts at a line end, so both files hold whole lines.
TEST_F(RankLogFileTest, RotatesAtLineEndsAndKeepsTheNewestOutput) {
  std::mt19937_64 rng(std::random_device{}());
  const int64_t cap = 4096;
  absl::StatusOr<std::unique_ptr<RankLogFile>> log = RankLogFile::Open(path_, cap);
  ASSERT_TRUE(log.ok()) << log.status();
  const std::vector<std::string> lines = FreshLines(2000, &rng);
  std::string written;
  std::uniform_int_distribution<int> lines_per_chunk(1, 80);  // up to about twice the cap
  for (size_t i = 0; i < lines.size();) {
    std::string chunk;
    for (int n = lines_per_chunk(rng); n > 0 && i < lines.size(); --n) chunk += lines[i++];
    (*log)->Append(chunk);
    written += chunk;
  }
  ExpectNewestKept(written, cap);
  const std::string newest = ReadFile(path_);
  const std::string older = ReadFile(path_ + ".1");
  EXPECT_EQ(older.back(), '\n');
  EXPECT_EQ(older.rfind("line ", 0), 0u) << older.substr(0, 40);
  EXPECT_EQ(newest.rfind("line ", 0), 0u) << newest.substr(0, 40);
  EXPECT_TRUE(EndsWith(newest, lines.back()));
  EXPECT_GT((*log)->rotations(), 10);
  EXPECT_EQ((*log)->dropped_bytes(), 0);
  EXPECT_EQ((*log)->size(), static_cast<int64_t>(newest.size()));
  // Everything written is on disk or counted as discarded.
  EXPECT_EQ((*log)->discarded_bytes() + static_cast<int64_t>(older.size() + newest.size()),
            static_cast<int64_t>(written.size()));
}

// Pipe reads cut output anywhere: whatever the chunks, the files stay within the cap and hold the
// end of the output.
TEST_F(RankLogFileTest, ChunksCutAnywhereKeepTheCapAndTheNewestBytes) {
  std::mt19937_64 rng(std::random_device{}());
  const int64_t cap = 4096;
  absl::StatusOr<std::unique_ptr<RankLogFile>> log = RankLogFile::Open(path_, cap);
  ASSERT_TRUE(log.ok()) << log.status();
  std::string written;
  for (const std::string& line : FreshLines(2000, &rng)) written += line;
  std::uniform_int_distribution<size_t> chunk(1, 3 * cap);
  for (size_t at = 0; at < written.size();) {
    const size_t n = std::min(chunk(rng), written.size() - at);
    (*log)->Append(absl::string_view(written).substr(at, n));
    at += n;
  }
  ExpectNewestKept(written, cap);
  EXPECT_EQ((*log)->dropped_bytes(), 0);
  EXPECT_EQ((*log)->discarded_bytes() + static_cast<int64_t>(ReadFile(path_ + ".1").size() +
                                                             ReadFile(path_).size()),
            static_cast<int64_t>(written.size()));
}

TEST_F(RankLogFileTest, ALineLongerThanTheCapIsCutAtTheCap) {
  const int64_t cap = 100;
  absl::StatusOr<std::unique_ptr<RankLogFile>> log = RankLogFile::Open(path_, cap);
  ASSERT_TRUE(log.ok()) << log.status();
  std::string written;
  for (int i = 0; i < 250; ++i) written.push_back(static_cast<char>('a' + i % 26));
  (*log)->Append(written);
  EXPECT_EQ(ReadFile(path_), written.substr(200));
  EXPECT_EQ(ReadFile(path_ + ".1"), written.substr(100, 100));
  EXPECT_EQ((*log)->rotations(), 2);
  EXPECT_EQ((*log)->discarded_bytes(), 100);
}

TEST_F(RankLogFileTest, WhatTheFileHeldCountsAgainstTheCapAndAnOlderRotationIsReplaced) {
  std::ofstream(path_) << std::string(979, 'x') << "\n";
  std::ofstream(path_ + ".1") << "from an earlier run\n";
  absl::StatusOr<std::unique_ptr<RankLogFile>> log = RankLogFile::Open(path_, 1000);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ((*log)->size(), 980);
  (*log)->Append("first line\nsecond line\n");  // the first fits, the second does not
  EXPECT_EQ(ReadFile(path_ + ".1"), std::string(979, 'x') + "\nfirst line\n");
  EXPECT_EQ(ReadFile(path_), "second line\n");
  EXPECT_EQ((*log)->rotations(), 1);
  EXPECT_EQ((*log)->discarded_bytes(), 20);
}

TEST_F(RankLogFileTest, ZeroMeansNoCap) {
  absl::StatusOr<std::unique_ptr<RankLogFile>> log = RankLogFile::Open(path_, 0);
  ASSERT_TRUE(log.ok()) << log.status();
  const std::string chunk(64 * 1024, 'z');
  for (int i = 0; i < 32; ++i) (*log)->Append(chunk);
  EXPECT_EQ(ReadFile(path_).size(), 32 * chunk.size());
  EXPECT_FALSE(Exists(path_ + ".1"));
  EXPECT_EQ((*log)->rotations(), 0);
  EXPECT_FALSE(RankLogFile::Open(path_, -1).ok());
}

// A disk that fails writes (/dev/full: ENOSPC) drops output without an error; once the file can
// be written again (here: the link to /dev/full replaced by a plain file) it is written again.
TEST_F(RankLogFileTest, AFailingWriteDropsOutputAndTheFileIsTriedAgain) {
  ASSERT_EQ(symlink("/dev/full", path_.c_str()), 0);
  absl::StatusOr<std::unique_ptr<RankLogFile>> log =
      RankLogFile::Open(path_, 1000, absl::Milliseconds(50));
  ASSERT_TRUE(log.ok()) << log.status();
  (*log)->Append("lost 1\n");
  (*log)->Append("lost 2\n");  // within the retry interval: not even tried
  EXPECT_EQ((*log)->dropped_bytes(), 14);
  ASSERT_EQ(unlink(path_.c_str()), 0);
  absl::SleepFor(absl::Milliseconds(100));
  (*log)->Append("kept\n");
  EXPECT_EQ(ReadFile(path_), "kept\n");
  EXPECT_EQ((*log)->dropped_bytes(), 14);
}

// <path>.1 that cannot be replaced (a directory stands there): the file starts over instead, so
// the cap still holds and the newest output is still in <path>.
TEST_F(RankLogFileTest, ARenameThatFailsStartsTheFileOver) {
  ASSERT_EQ(mkdir((path_ + ".1").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((path_ + ".1/busy").c_str(), 0755), 0);
  absl::StatusOr<std::unique_ptr<RankLogFile>> log = RankLogFile::Open(path_, 100);
  ASSERT_TRUE(log.ok()) << log.status();
  std::string written;
  for (int i = 0; i < 50; ++i) written += absl::StrCat("line ", i, "\n");
  (*log)->Append(written);
  const std::string newest = ReadFile(path_);
  EXPECT_LE(newest.size(), 100u);
  EXPECT_TRUE(EndsWith(written, newest));
  EXPECT_TRUE(EndsWith(newest, "line 49\n"));
  EXPECT_GT((*log)->rotations(), 0);
  EXPECT_EQ((*log)->dropped_bytes(), 0);
  EXPECT_EQ((*log)->discarded_bytes() + static_cast<int64_t>(newest.size()),
            static_cast<int64_t>(written.size()));
}

// The supervisor's write path with a real child printing far more than the cap and the pipe's
// buffer, as fast as it can: it never blocks, every line still reaches on_output in order, and
// the log keeps only the newest output, capped.
TEST_F(RankLogFileTest, AChattyChildIsCappedAndNeverBlocks) {
  std::mt19937_64 rng(std::random_device{}());
  const std::string token = absl::StrCat(rng());
  absl::Mutex mu;
  std::vector<std::string> lines;
  bool exited = false;
  ChildExit exit;
  RankSupervisor::Callbacks callbacks;
  callbacks.on_output = [&](RankSupervisor::ChildId, absl::string_view line) {
    absl::MutexLock lock(&mu);
    lines.emplace_back(line);
  };
  callbacks.on_exit = [&](RankSupervisor::ChildId, const ChildExit& e) {
    absl::MutexLock lock(&mu);
    exit = e;
    exited = true;
  };
  RankSupervisor supervisor(callbacks);
  const int kLines = 60000;  // ~2.5 MB, 40 times the cap
  const int64_t cap = 64 * 1024;
  ChildSpec spec;
  spec.path = "/bin/sh";
  spec.argv = {"sh", "-c",
               absl::StrCat("i=0; while [ $i -lt ", kLines, " ]; do echo \"line $i ", token,
                            "\"; i=$((i+1)); done; echo 'last words' >&2; exit 3")};
  spec.log_path = path_;
  spec.log_max_bytes = cap;
  ASSERT_TRUE(supervisor.Start(1, spec).ok());
  {
    // A child blocked on a full pipe would never get here.
    absl::MutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&exited), absl::Seconds(60)));
  }
  EXPECT_EQ(exit.exit_code, 3);
  std::string written;
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(lines.size(), static_cast<size_t>(kLines + 1));
    for (int i = 0; i < kLines; ++i) {
      ASSERT_EQ(lines[i], absl::StrCat("line ", i, " ", token));
      written += lines[i] + "\n";
    }
    // What the rank manager quotes in a failure message: the last line, after all rotations.
    EXPECT_EQ(lines.back(), "last words");
    written += "last words\n";
  }
  ExpectNewestKept(written, cap);
  EXPECT_TRUE(EndsWith(ReadFile(path_), absl::StrCat("line ", kLines - 1, " ", token,
                                                     "\nlast words\n")));
}

// A log whose directory disappears mid-run (an operator cleaning up) costs the log, not the rank.
TEST_F(RankLogFileTest, ALogDirectoryRemovedMidRunDoesNotStopTheChild) {
  absl::Mutex mu;
  int count = 0;
  bool exited = false;
  ChildExit exit;
  RankSupervisor::Callbacks callbacks;
  callbacks.on_output = [&](RankSupervisor::ChildId, absl::string_view) {
    absl::MutexLock lock(&mu);
    ++count;
  };
  callbacks.on_exit = [&](RankSupervisor::ChildId, const ChildExit& e) {
    absl::MutexLock lock(&mu);
    exit = e;
    exited = true;
  };
  RankSupervisor supervisor(callbacks);
  const std::string go = dir_ + "-go";
  unlink(go.c_str());
  ChildSpec spec;
  spec.path = "/bin/sh";
  spec.argv = {"sh", "-c",
               absl::StrCat("echo started; while [ ! -e '", go, "' ]; do sleep 0.01; done; ",
                            "i=0; while [ $i -lt 20000 ]; do echo \"line $i\"; i=$((i+1)); done")};
  spec.log_path = path_;
  spec.log_max_bytes = 4096;
  ASSERT_TRUE(supervisor.Start(1, spec).ok());
  {
    absl::MutexLock lock(&mu);
    auto started = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return count > 0; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&started), absl::Seconds(30)));
  }
  ASSERT_EQ(system(absl::StrCat("rm -rf '", dir_, "'").c_str()), 0);
  std::ofstream(go) << "go";
  {
    absl::MutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&exited), absl::Seconds(60)));
    EXPECT_EQ(count, 20001);
  }
  EXPECT_TRUE(exit.success());
  unlink(go.c_str());
  ASSERT_EQ(system(absl::StrCat("mkdir -p '", dir_, "'").c_str()), 0);
}

// The rank manager's failure message quotes the rank's last line, and its log on disk keeps the
// newest output under the daemon's cap (RankManagerOptions::rank_log_max_bytes, which
// --rank-log-max-bytes sets).
constexpr char kChattyRank[] = R"SH(#!/bin/sh
[ "$1" = rank ] || exit 9
shift
while [ $# -gt 0 ]; do
  case "$1" in --rank) rank=$2 ;; esac
  shift 2
done
echo ready >&3
i=0
while [ $i -lt 8000 ]; do echo "warning: step $i of rank $rank $TOKEN"; i=$((i+1)); done
echo "error: out of patience on rank $rank $TOKEN" >&2
exit 4
)SH";

TEST_F(RankLogFileTest, TheFailureMessageQuotesTheLastLineAcrossRotations) {
  std::mt19937_64 rng(std::random_device{}());
  const std::string token = absl::StrCat(rng());
  const int64_t cap = 64 * 1024;
  const std::string script = dir_ + "/chatty-rank";
  std::ofstream(script) << kChattyRank;
  ASSERT_EQ(chmod(script.c_str(), 0755), 0);
  absl::StatusOr<std::unique_ptr<WorkerMetrics>> metrics =
      WorkerMetrics::Create("node-a", "127.0.0.1", 0);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  OutboundQueue queue;
  RankManagerOptions o;
  o.rank_binary = script;
  o.coordinator = "127.0.0.1:7070";
  o.node = "node-a";
  o.advertise_address = "127.0.0.1";
  o.work_dir = dir_ + "/work";
  o.slot_kind = "cpu";
  o.slots = 1;
  o.channel_env = {absl::StrCat("TOKEN=", token)};
  o.rank_log_max_bytes = cap;
  RankManager manager(o, &queue, metrics->get());
  v1::Assignment a;
  a.set_job_id("chatty");
  a.set_attempt(1);
  a.set_world_size(1);
  a.set_spec_yaml("name: chatty\n");
  v1::RankAssignment* r = a.add_ranks();
  r->set_rank(0);
  r->set_slot(0);
  manager.HandleAssignment(a);

  std::string failed;
  int log_lines = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (failed.empty() && absl::Now() < deadline) {
    auto e = queue.Peek(absl::Milliseconds(50));
    if (!e) continue;
    queue.Pop(e->sequence);
    if (e->message.has_logs()) log_lines += e->message.logs().lines_size();
    if (e->message.has_rank_status() &&
        e->message.rank_status().state() == v1::RANK_STATE_FAILED) {
      failed = e->message.rank_status().message();
    }
  }
  EXPECT_EQ(failed, absl::StrCat("exit code 4: error: out of patience on rank 0 ", token));
  EXPECT_EQ(log_lines, 8001);  // every line still forwarded to the coordinator

  const std::string log_path = o.work_dir + "/jobs/chatty/attempt-1/rank-0.log";
  const std::string newest = ReadFile(log_path);
  const std::string older = ReadFile(log_path + ".1");
  EXPECT_LE(static_cast<int64_t>(newest.size()), cap);
  EXPECT_LE(static_cast<int64_t>(older.size()), cap);
  EXPECT_GT(older.size(), 0u);
  EXPECT_TRUE(EndsWith(newest, absl::StrCat("warning: step 7999 of rank 0 ", token,
                                            "\nerror: out of patience on rank 0 ", token, "\n")));
  // The two files hold consecutive lines: .1 ends where rank-0.log begins.
  std::vector<std::string> kept = absl::StrSplit(older + newest, '\n', absl::SkipEmpty());
  ASSERT_GT(kept.size(), 2u);
  int previous = -1;
  for (size_t i = 0; i + 1 < kept.size(); ++i) {
    int step = -1;
    ASSERT_EQ(sscanf(kept[i].c_str(), "warning: step %d of rank 0", &step), 1) << kept[i];
    if (previous >= 0) EXPECT_EQ(step, previous + 1) << kept[i];
    previous = step;
  }
  EXPECT_EQ(previous, 7999);
}

TEST(RankLogMaxBytesConfigTest, DefaultFileAndFlag) {
  const HostFacts host{"h", 4, "/tmp"};
  WorkerSettings none;
  none.insecure = true;
  absl::StatusOr<WorkerConfig> c = ResolveWorkerConfig(none, none, host);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rank_log_max_bytes, int64_t{64} << 20);

  absl::StatusOr<WorkerSettings> file = ParseWorkerSettingsYaml("rank_log_max_bytes: 1048576\n");
  ASSERT_TRUE(file.ok()) << file.status();
  file->insecure = true;
  c = ResolveWorkerConfig(*file, none, host);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rank_log_max_bytes, 1048576);

  WorkerSettings flags = none;
  flags.rank_log_max_bytes = 0;  // no cap
  c = ResolveWorkerConfig(*file, flags, host);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rank_log_max_bytes, 0);

  for (int64_t bad : {int64_t{-1}, int64_t{64}, kMinRankLogMaxBytes - 1}) {
    flags.rank_log_max_bytes = bad;
    c = ResolveWorkerConfig(none, flags, host);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.status().message().find("rank_log_max_bytes"), absl::string_view::npos)
        << c.status();
  }
  EXPECT_FALSE(ParseWorkerSettingsYaml("rank_log_max_bytes: 64Mi\n").ok());
}

// The byte budget of finished jobs' directories (RankManagerOptions::retained_job_bytes).
TEST(RetainedJobBytesConfigTest, DefaultFileAndFlag) {
  const HostFacts host{"h", 4, "/tmp"};
  WorkerSettings none;
  none.insecure = true;
  absl::StatusOr<WorkerConfig> c = ResolveWorkerConfig(none, none, host);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->retained_job_bytes, int64_t{8} << 30);
  absl::StatusOr<WorkerSettings> file = ParseWorkerSettingsYaml("retained_job_bytes: 1073741824\n");
  ASSERT_TRUE(file.ok()) << file.status();
  file->insecure = true;
  c = ResolveWorkerConfig(*file, none, host);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->retained_job_bytes, int64_t{1} << 30);
  WorkerSettings flags = none;
  flags.retained_job_bytes = 0;  // by count only
  c = ResolveWorkerConfig(*file, flags, host);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->retained_job_bytes, 0);
  for (int64_t bad : {int64_t{-1}, int64_t{8}, kMinRankLogMaxBytes - 1}) {
    flags.retained_job_bytes = bad;
    c = ResolveWorkerConfig(none, flags, host);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.status().message().find("retained_job_bytes"), absl::string_view::npos)
        << c.status();
  }
}

}  // namespace
}  // namespace dropless
