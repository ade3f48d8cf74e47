// Retention in the job store (JobStore::DeleteJobsEndedBefore, DeleteClusterEventsBefore;
// job_store_retention.cc): finished jobs that ended before a given time go with every row that
// belongs to them, in bounded batches; unfinished and recently finished jobs stay; ids are never
// reused; cluster-wide events as old go too. The time is the test's (the coordinator passes its
// clock's now minus --job-retention).
#include <stdlib.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/store/job_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using ::testing::UnorderedElementsAre;

constexpr int64_t kDay = 24 * 3600 * 1000;
// "Now" as the test's clock says; jobs end before or after it.
constexpr int64_t kNow = 100 * kDay;

std::string TempDbPath() {
  std::string dir = ::testing::TempDir();
  std::string pattern =
      absl::StrCat(dir, dir.empty() || dir.back() != '/' ? "/" : "", "job_retention_test_XXXXXX");
  EXPECT_NE(mkdtemp(pattern.data()), nullptr);
  return pattern + "/dropless.db";
}

// A job in `state`; a finished one ended at end_time_ms.
JobRecord MakeJob(JobStore& store, v1::JobState state, int64_t end_time_ms,
                  const std::string& owner = "") {
  JobRecord record;
  record.job.set_id(store.NextJobId(&record.seq));
  record.job.set_name(record.job.id());
  record.job.set_state(state);
  record.job.set_spec_yaml("name: x\n");
  record.job.set_world_size(1);
  record.job.set_backend("cpu");
  record.job.set_create_time_ms(1);
  record.job.set_owner(owner);
  if (IsTerminal(state)) record.job.set_end_time_ms(end_time_ms);
  record.queued_time_ms = 1;
  return record;
}

absl::Status Store(JobStore& store, const std::vector<JobRecord>& jobs) {
  StoreWrite write;
  write.jobs = jobs;
  for (const JobRecord& job : jobs) {
    v1::Event event;
    event.set_job_id(job.job.id());
    event.set_type("Submitted");
    write.events.push_back(event);
  }
  return store.Commit(write);
}

// Rows in every table the job store keeps for `job_id` (each table with a job_id column), read
// from the file while no store holds it.
std::map<std::string, int64_t> RowsOfJob(const std::string& path, const std::string& job_id) {
  std::map<std::string, int64_t> rows;
  absl::StatusOr<std::unique_ptr<SqliteDb>> db = SqliteDb::Open(path);
  EXPECT_TRUE(db.ok()) << db.status();
  if (!db.ok()) return rows;
  std::vector<std::string> tables;
  {
    absl::StatusOr<SqliteStatement> st = (*db)->Prepare(
        "SELECT m.name FROM sqlite_master m, pragma_table_info(m.name) c "
        "WHERE m.type = 'table' AND c.name = 'job_id' ORDER BY m.name");
    EXPECT_TRUE(st.ok()) << st.status();
    while (st.ok() && *st->Step()) tables.push_back(st->ColumnText(0));
  }
  for (const std::string& table : tables) {
    absl::StatusOr<SqliteStatement> count =
        (*db)->Prepare(absl::StrCat("SELECT COUNT(*) FROM ", table, " WHERE job_id = ?1"));
    EXPECT_TRUE(count.ok()) << count.status();
    count->Bind(1, job_id);
    EXPECT_TRUE(*count->Step());
    rows[table] = count->ColumnInt(0);
  }
  absl::StatusOr<SqliteStatement> job = (*db)->Prepare("SELECT COUNT(*) FROM jobs WHERE id = ?1");
  job->Bind(1, job_id);
  EXPECT_TRUE(*job->Step());
  rows["jobs"] = job->ColumnInt(0);
  return rows;
}

std::vector<std::string> Ids(const std::vector<v1::Job>& jobs) {
  std::vector<std::string> ids;
  for (const v1::Job& job : jobs) ids.push_back(job.id());
  return ids;
}

// The old finished job has a row in every per-job table; after the deletion it has none, and
// the jobs that must stay keep theirs.
TEST(JobRetentionTest, OldFinishedJobsGoWithEveryRowTheRestStays) {
  const std::string path = TempDbPath();
  std::string old_done, old_failed, old_cancelled, recent_done, old_running, old_pending;
  {
    auto opened = JobStore::Open(path);
    ASSERT_TRUE(opened.ok()) << opened.status();
    JobStore& store = **opened;
    JobRecord done = MakeJob(store, v1::JOB_STATE_SUCCEEDED, kNow - 40 * kDay, "alice");
    JobRecord failed = MakeJob(store, v1::JOB_STATE_FAILED, kNow - 31 * kDay);
    JobRecord cancelled = MakeJob(store, v1::JOB_STATE_CANCELLED, kNow - 30 * kDay - 1);
    JobRecord recent = MakeJob(store, v1::JOB_STATE_SUCCEEDED, kNow - 29 * kDay);
    // Unfinished for 99 days: never touched whatever its age.
    JobRecord running = MakeJob(store, v1::JOB_STATE_RUNNING, 0);
    JobRecord pending = MakeJob(store, v1::JOB_STATE_PENDING, 0);
    old_done = done.job.id();
    old_failed = failed.job.id();
    old_cancelled = cancelled.job.id();
    recent_done = recent.job.id();
    old_running = running.job.id();
    old_pending = pending.job.id();
    ASSERT_TRUE(Store(store, {done, failed, cancelled, recent, running, pending}).ok());

    // Every kind of row the old job and the recent one can have.
    for (const std::string& id : {old_done, recent_done}) {
      StoreWrite write;
      // An attempt ended, and one whose row a crash left active, with its rendezvous secret.
      AttemptRecord ended{id, 1, v1::JOB_STATE_FAILED, 10, 20, "rank 0 failed", {}};
      ended.ranks.push_back({0, "worker-0001", "node-a", 0, v1::RANK_STATE_FAILED, 1, "boot"});
      AttemptRecord active{id, 2, v1::JOB_STATE_RUNNING, 30, 0, "", {}};
      active.ranks.push_back({0, "worker-0001", "node-a", 0, v1::RANK_STATE_RUNNING, 0, "boot"});
      active.rendezvous_secret = "secret";
      write.attempts = {ended, active};
      write.submit_requests = {SubmitRequestRecord{"alice", "request-" + id, id}};
      ASSERT_TRUE(store.Commit(write).ok());
      ASSERT_TRUE(store.PutRendezvousKey(id, 2, "nccl_unique_id", "bytes").ok());
      v1::StepMetrics metrics;
      metrics.set_job_id(id);
      metrics.set_attempt(2);
      metrics.set_step(1);
      ASSERT_TRUE(store.PutStepMetrics(metrics).ok());
      v1::LogLine line;
      line.set_job_id(id);
      line.set_attempt(2);
      line.set_text("step 1");
      ASSERT_TRUE(store.AppendLogs({line, line}).ok());
    }
  }
  // Before: the old job has rows in every table with a job_id column (a table added later must
  // be filled here, and then deleted with its job).
  const std::map<std::string, int64_t> before = RowsOfJob(path, old_done);
  for (const auto& [table, rows] : before) EXPECT_GT(rows, 0) << table;
  const std::map<std::string, int64_t> recent_before = RowsOfJob(path, recent_done);

  {
    auto opened = JobStore::Open(path);
    ASSERT_TRUE(opened.ok()) << opened.status();
    JobStore& store = **opened;
    absl::StatusOr<std::vector<std::string>> deleted =
        store.DeleteJobsEndedBefore(kNow - 30 * kDay);
    ASSERT_TRUE(deleted.ok()) << deleted.status();
    // Oldest end first.
    EXPECT_THAT(*deleted, ElementsAre(old_done, old_failed, old_cancelled));
    absl::StatusOr<std::vector<std::string>> again = store.DeleteJobsEndedBefore(kNow - 30 * kDay);
    ASSERT_TRUE(again.ok());
    EXPECT_THAT(*again, IsEmpty());

    for (const std::string& id : *deleted) {
      EXPECT_TRUE(absl::IsNotFound(store.GetJob(id).status())) << id;
      EXPECT_THAT(*store.ListEvents(id, 0), IsEmpty());
      EXPECT_THAT(*store.ListLogs(id, std::nullopt, 0), IsEmpty());
      EXPECT_THAT(*store.LatestStepMetrics(id), IsEmpty());
      EXPECT_THAT(*store.ListAttempts(id), IsEmpty());
    }
    EXPECT_FALSE(store.FindSubmitRequest("alice", "request-" + old_done)->has_value());
    EXPECT_TRUE(store.FindSubmitRequest("alice", "request-" + recent_done)->has_value());
    EXPECT_THAT(Ids(*store.ListJobs({}, 0)), ElementsAre(recent_done, old_running, old_pending));
    std::map<v1::JobState, int64_t> counts = *store.CountJobsByState();
    EXPECT_EQ(counts[v1::JOB_STATE_SUCCEEDED], 1);
    EXPECT_EQ(counts[v1::JOB_STATE_FAILED], 0);
    EXPECT_EQ(counts[v1::JOB_STATE_CANCELLED], 0);
    // The restart snapshot still has the unfinished ones.
    absl::StatusOr<ActiveState> active = store.LoadActive();
    ASSERT_TRUE(active.ok());
    std::vector<std::string> active_ids;
    for (const JobRecord& job : active->jobs) active_ids.push_back(job.job.id());
    EXPECT_THAT(active_ids, ElementsAre(old_running, old_pending));
  }
  for (const auto& [table, rows] : RowsOfJob(path, old_done)) EXPECT_EQ(rows, 0) << table;
  for (const std::string& id : {old_failed, old_cancelled}) {
    for (const auto& [table, rows] : RowsOfJob(path, id)) EXPECT_EQ(rows, 0) << id << " " << table;
  }
  EXPECT_EQ(RowsOfJob(path, recent_done), recent_before);
  EXPECT_EQ(RowsOfJob(path, old_running)["jobs"], 1);
  EXPECT_EQ(RowsOfJob(path, old_pending)["jobs"], 1);
}

// A large backlog goes a bounded batch per call, oldest first: at most max_expired_jobs jobs,
// and no job past the first once their log lines, step metrics and events exceed
// max_expired_rows.
TEST(JobRetentionTest, BacklogIsDeletedInBoundedBatches) {
  JobStore::Limits limits;
  limits.max_expired_jobs = 2;
  limits.max_expired_rows = 10;
  auto opened = JobStore::Open(TempDbPath(), limits);
  ASSERT_TRUE(opened.ok()) << opened.status();
  JobStore& store = **opened;
  std::vector<JobRecord> jobs;
  for (int i = 0; i < 5; ++i) {
    // Ended in reverse submission order: the last submitted is the oldest.
    jobs.push_back(MakeJob(store, v1::JOB_STATE_SUCCEEDED, kDay - i));
  }
  ASSERT_TRUE(Store(store, jobs).ok());  // one event each
  auto deleted = [&] {
    absl::StatusOr<std::vector<std::string>> batch = store.DeleteJobsEndedBefore(kNow);
    EXPECT_TRUE(batch.ok()) << batch.status();
    return batch.ok() ? *batch : std::vector<std::string>{};
  };
  EXPECT_THAT(deleted(), ElementsAre(jobs[4].job.id(), jobs[3].job.id()));
  EXPECT_THAT(deleted(), ElementsAre(jobs[2].job.id(), jobs[1].job.id()));

  // Job 0 holds 20 log lines: alone past the row budget, it still goes, in a batch of its own;
  // the next job then waits for the next batch.
  std::vector<v1::LogLine> lines(20);
  for (v1::LogLine& line : lines) line.set_job_id(jobs[0].job.id());
  ASSERT_TRUE(store.AppendLogs(lines).ok());
  JobRecord later = MakeJob(store, v1::JOB_STATE_FAILED, kDay + 1);
  ASSERT_TRUE(Store(store, {later}).ok());
  EXPECT_THAT(deleted(), ElementsAre(jobs[0].job.id()));
  EXPECT_THAT(deleted(), ElementsAre(later.job.id()));
  EXPECT_THAT(deleted(), IsEmpty());
  EXPECT_THAT(*store.ListJobs({}, 0), IsEmpty());
}

// Deleting the newest jobs does not give their ids out again, in this run or after a restart.
TEST(JobRetentionTest, IdsOfDeletedJobsAreNeverReused) {
  const std::string path = TempDbPath();
  std::string newest;
  {
    auto opened = JobStore::Open(path);
    ASSERT_TRUE(opened.ok());
    JobStore& store = **opened;
    JobRecord first = MakeJob(store, v1::JOB_STATE_PENDING, 0);
    JobRecord second = MakeJob(store, v1::JOB_STATE_CANCELLED, kDay);
    JobRecord third = MakeJob(store, v1::JOB_STATE_SUCCEEDED, kDay);
    newest = third.job.id();
    EXPECT_EQ(newest, "job-000003");
    ASSERT_TRUE(Store(store, {first, second, third}).ok());
    absl::StatusOr<std::vector<std::string>> deleted = store.DeleteJobsEndedBefore(kNow);
    ASSERT_TRUE(deleted.ok());
    EXPECT_THAT(*deleted, UnorderedElementsAre(second.job.id(), newest));
  }
  // Only job-000001 is left; a restart continues after the highest id ever given.
  auto reopened = JobStore::Open(path);
  ASSERT_TRUE(reopened.ok());
  JobStore& store = **reopened;
  EXPECT_TRUE(absl::IsNotFound(store.GetJob(newest).status()));
  JobRecord fourth = MakeJob(store, v1::JOB_STATE_SUCCEEDED, kDay);
  EXPECT_EQ(fourth.job.id(), "job-000004");
  ASSERT_TRUE(Store(store, {fourth}).ok());
  // Deleted too: the next restart still knows where ids stopped.
  ASSERT_THAT(*store.DeleteJobsEndedBefore(kNow), ElementsAre("job-000004"));
  reopened->reset();
  auto again = JobStore::Open(path);
  ASSERT_TRUE(again.ok()) << again.status();
  int64_t seq = 0;
  EXPECT_EQ((*again)->NextJobId(&seq), "job-000005");
  EXPECT_EQ(seq, 5);
}

// Cluster-wide events (job_id "") go once older than the cutoff, oldest first, at most
// max_expired_rows a call; the events of jobs, however old, are left to their jobs' retention.
TEST(JobRetentionTest, OldClusterWideEventsGoInBoundedBatches) {
  const std::string path = TempDbPath();
  JobStore::Limits limits;
  limits.max_expired_rows = 2;
  std::string pending_id;
  {
    auto opened = JobStore::Open(path, limits);
    ASSERT_TRUE(opened.ok()) << opened.status();
    JobStore& store = **opened;
    JobRecord pending = MakeJob(store, v1::JOB_STATE_PENDING, 0);
    pending_id = pending.job.id();
    StoreWrite write;
    write.jobs = {pending};
    // Stored out of time order: the deletion goes by time, not by id.
    for (int64_t day : {5, 1, 40, 3, 2}) {
      v1::Event event;
      event.set_time_ms(kNow - day * kDay);
      event.set_type(absl::StrCat("WorkerLost-", day));
      write.events.push_back(event);
    }
    v1::Event old_of_job;
    old_of_job.set_job_id(pending_id);
    old_of_job.set_time_ms(kDay);
    old_of_job.set_type("Submitted");
    write.events.push_back(old_of_job);
    ASSERT_TRUE(store.Commit(write).ok());
  }
  // A file that lacks the index (written before it existed) gains it when opened.
  {
    auto db = SqliteDb::Open(path);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->Exec("DROP INDEX events_of_cluster_by_time").ok());
  }
  auto opened = JobStore::Open(path, limits);
  ASSERT_TRUE(opened.ok()) << opened.status();
  JobStore& store = **opened;
  auto types = [&] {
    absl::StatusOr<std::vector<v1::Event>> events = store.ListEvents("", 0);
    EXPECT_TRUE(events.ok()) << events.status();
    std::vector<std::string> out;
    for (const v1::Event& event : *events) out.push_back(event.type());
    return out;
  };
  auto deleted = [&] {
    absl::StatusOr<int64_t> batch = store.DeleteClusterEventsBefore(kNow - 2 * kDay);
    EXPECT_TRUE(batch.ok()) << batch.status();
    return batch.ok() ? *batch : -1;
  };
  EXPECT_EQ(deleted(), 2);  // 40 and 5 days old
  EXPECT_THAT(types(), ElementsAre("WorkerLost-1", "WorkerLost-3", "WorkerLost-2", "Submitted"));
  EXPECT_EQ(deleted(), 1);  // 3 days; 2 days is the cutoff itself
  EXPECT_EQ(deleted(), 0);
  EXPECT_THAT(types(), ElementsAre("WorkerLost-1", "WorkerLost-2", "Submitted"));
  EXPECT_THAT(*store.ListEvents(pending_id, 0), SizeIs(1));
}

// A file of schema version 3 (no end_time_ms column) opens: its finished jobs get their end time
// from their rows and expire by it.
TEST(JobRetentionTest, VersionThreeFileGainsEndTimes) {
  const std::string path = TempDbPath();
  std::string old_id, recent_id, pending_id;
  {
    auto opened = JobStore::Open(path);
    ASSERT_TRUE(opened.ok());
    JobRecord old_job = MakeJob(**opened, v1::JOB_STATE_FAILED, kDay);
    JobRecord recent = MakeJob(**opened, v1::JOB_STATE_SUCCEEDED, kNow);
    JobRecord pending = MakeJob(**opened, v1::JOB_STATE_PENDING, 0);
    old_id = old_job.job.id();
    recent_id = recent.job.id();
    pending_id = pending.job.id();
    ASSERT_TRUE(Store(**opened, {old_job, recent, pending}).ok());
  }
  {
    auto db = SqliteDb::Open(path);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)
                    ->Exec("DROP INDEX jobs_by_end_time; ALTER TABLE jobs DROP COLUMN "
                           "end_time_ms; DROP TABLE store_counters; ALTER TABLE workers DROP "
                           "COLUMN lost_since_ms; PRAGMA user_version=3")
                    .ok());
  }
  auto opened = JobStore::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  absl::StatusOr<std::vector<std::string>> deleted = (*opened)->DeleteJobsEndedBefore(kDay + 1);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, ElementsAre(old_id));
  EXPECT_THAT(Ids(*(*opened)->ListJobs({}, 0)), ElementsAre(recent_id, pending_id));
}

}  // namespace
}  // namespace dropless::coordinator
