#include "coordinator/store/job_store.h"

#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempDbPath() {
  std::string dir = ::testing::TempDir();
  std::string pattern = absl::StrCat(dir, dir.empty() || dir.back() != '/' ? "/" : "",
                                     "job_store_test_XXXXXX");
  EXPECT_NE(mkdtemp(pattern.data()), nullptr);
  return pattern + "/dropless.db";
}

JobRecord NewJob(JobStore& store, const std::string& name, int32_t priority) {
  JobRecord record;
  record.job.set_id(store.NextJobId(&record.seq));
  record.job.set_name(name);
  record.job.set_priority(priority);
  record.job.set_state(v1::JOB_STATE_PENDING);
  record.job.set_spec_yaml("name: " + name + "\n");
  record.job.set_world_size(2);
  record.job.set_steps(10);
  record.job.set_backend("cpu");
  record.job.set_create_time_ms(1000 + record.seq);
  record.max_attempts = 3;
  record.queued_time_ms = 1000 + record.seq;
  return record;
}

v1::Event MakeEvent(const std::string& job_id, int32_t attempt, const std::string& type) {
  v1::Event event;
  event.set_time_ms(5000);
  event.set_job_id(job_id);
  event.set_attempt(attempt);
  event.set_type(type);
  event.set_message(type + " message");
  return event;
}

WorkerRecord MakeWorker(const std::string& id, const std::string& node, int slots) {
  v1::Worker worker;
  worker.set_id(id);
  worker.set_node(node);
  worker.set_address("10.0.0.1");
  worker.set_slot_kind("cpu");
  worker.set_slots(slots);
  for (int i = 0; i < slots; ++i) worker.add_devices("cpu");
  worker.set_state(v1::WORKER_STATE_READY);
  worker.set_registered_time_ms(42);
  worker.set_metrics_port(9191);
  return WorkerRecord{worker, 0};
}

TEST(JobStoreTest, RestartKeepsJobsAttemptsEventsAndWorkers) {
  const std::string path = TempDbPath();
  std::string pending_id, running_id, done_id;
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    JobRecord pending = NewJob(**store, "pending", 1);
    JobRecord running = NewJob(**store, "running", 0);
    JobRecord done = NewJob(**store, "done", 0);
    pending_id = pending.job.id();
    running_id = running.job.id();
    done_id = done.job.id();

    StoreWrite submit;
    submit.jobs = {pending, running, done};
    submit.events = {MakeEvent(pending_id, 0, "Submitted"), MakeEvent(running_id, 0, "Submitted"),
                     MakeEvent(done_id, 0, "Submitted")};
    submit.workers = {MakeWorker("worker-0001", "node-a", 2), MakeWorker("worker-0002", "node-b", 1)};
    ASSERT_TRUE((*store)->Commit(submit).ok());
    EXPECT_GT(submit.events[0].id(), 0);
    EXPECT_LT(submit.events[0].id(), submit.events[1].id());

    running.job.set_state(v1::JOB_STATE_RUNNING);
    running.job.set_attempt(1);
    AttemptRecord attempt{running_id, 1, v1::JOB_STATE_RUNNING, 2000, 0, "", {}};
    attempt.ranks.push_back({0, "worker-0001", "node-a", 0, v1::RANK_STATE_RUNNING, 0});
    attempt.ranks.push_back({1, "worker-0002", "node-b", 0, v1::RANK_STATE_STARTING, 0});
    done.job.set_state(v1::JOB_STATE_SUCCEEDED);
    done.job.set_attempt(1);
    AttemptRecord done_attempt{done_id, 1, v1::JOB_STATE_SUCCEEDED, 2000, 3000, "ok", {}};
    done_attempt.ranks.push_back({0, "worker-0001", "node-a", 1, v1::RANK_STATE_SUCCEEDED, 0});
    StoreWrite place;
    place.jobs = {running, done};
    place.attempts = {attempt, done_attempt};
    place.events = {MakeEvent(running_id, 1, "Scheduled"), MakeEvent(done_id, 1, "Succeeded")};
    ASSERT_TRUE((*store)->Commit(place).ok());

    v1::StepMetrics metrics;
    metrics.set_job_id(running_id);
    metrics.set_attempt(1);
    metrics.set_rank(0);
    metrics.set_step(3);
    metrics.set_loss(1.5);
    for (int64_t tokens : {30, 0, 12, 86}) metrics.add_expert_tokens(tokens);
    metrics.set_dispatch_bytes(4096);
    ASSERT_TRUE((*store)->PutStepMetrics(metrics).ok());
    v1::LogLine line;
    line.set_job_id(running_id);
    line.set_attempt(1);
    line.set_rank(1);
    line.set_text("hello from rank 1");
    ASSERT_TRUE((*store)->AppendLogs({line}).ok());
  }

  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();

  auto active = (*store)->LoadActive();
  ASSERT_TRUE(active.ok()) << active.status();
  ASSERT_EQ(active->jobs.size(), 2u);
  EXPECT_EQ(active->jobs[0].job.id(), pending_id);
  EXPECT_EQ(active->jobs[0].job.name(), "pending");
  EXPECT_EQ(active->jobs[0].job.priority(), 1);
  EXPECT_EQ(active->jobs[0].max_attempts, 3);
  EXPECT_EQ(active->jobs[0].job.spec_yaml(), "name: pending\n");
  EXPECT_EQ(active->jobs[1].job.id(), running_id);
  EXPECT_EQ(active->jobs[1].job.state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(active->attempts.size(), 1u);
  const AttemptRecord& attempt = active->attempts[0];
  EXPECT_EQ(attempt.job_id, running_id);
  ASSERT_EQ(attempt.ranks.size(), 2u);
  EXPECT_EQ(attempt.ranks[1].worker_id, "worker-0002");
  EXPECT_EQ(attempt.ranks[1].state, v1::RANK_STATE_STARTING);
  ASSERT_EQ(active->workers.size(), 2u);
  EXPECT_EQ(active->workers[0].info.node(), "node-a");
  EXPECT_EQ(active->workers[0].info.devices_size(), 2);
  EXPECT_EQ(active->workers[0].info.metrics_port(), 9191);

  auto job = (*store)->GetJob(running_id);
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->placement_size(), 2);
  EXPECT_EQ(job->placement(1).node(), "node-b");
  EXPECT_EQ(job->latest().step(), 3);
  EXPECT_DOUBLE_EQ(job->latest().loss(), 1.5);
  // The per-expert counts are stored with the step metrics (for `dropless top` / `describe`).
  EXPECT_EQ(std::vector<int64_t>(job->latest().expert_tokens().begin(),
                                 job->latest().expert_tokens().end()),
            (std::vector<int64_t>{30, 0, 12, 86}));
  EXPECT_EQ(job->latest().dispatch_bytes(), 4096);
  auto history = (*store)->StepMetricsHistory(running_id, 10);
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->size(), 1u);
  EXPECT_EQ((*history)[0].expert_tokens_size(), 4);

  auto finished = (*store)->GetAttempt(done_id, 1);
  ASSERT_TRUE(finished.ok());
  EXPECT_EQ(finished->state, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(finished->message, "ok");

  auto events = (*store)->ListEvents(running_id, 0);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].type(), "Submitted");
  EXPECT_EQ((*events)[1].type(), "Scheduled");
  EXPECT_EQ((*events)[1].attempt(), 1);

  auto logs = (*store)->ListLogs(running_id, std::nullopt, 0);
  ASSERT_TRUE(logs.ok());
  ASSERT_EQ(logs->size(), 1u);
  EXPECT_EQ((*logs)[0].text(), "hello from rank 1");

  // Ids continue after a restart instead of being reused.
  int64_t seq = 0;
  std::string next = (*store)->NextJobId(&seq);
  EXPECT_EQ(seq, 4);
  EXPECT_EQ(next, "job-000004");
}

TEST(JobStoreTest, UnknownJobIsNotFoundNamingTheId) {
  auto store = JobStore::Open(TempDbPath());
  ASSERT_TRUE(store.ok());
  auto job = (*store)->GetJob("job-nope");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(job.status().message(), HasSubstr("job-nope"));
}

TEST(JobStoreTest, ListJobsFiltersByStateAndLimitsToTheNewest) {
  auto opened = JobStore::Open(TempDbPath());
  ASSERT_TRUE(opened.ok());
  JobStore& store = **opened;
  StoreWrite write;
  for (int i = 0; i < 5; ++i) {
    JobRecord job = NewJob(store, absl::StrCat("j", i), 0);
    if (i % 2 == 1) job.job.set_state(v1::JOB_STATE_FAILED);
    write.jobs.push_back(job);
  }
  ASSERT_TRUE(store.Commit(write).ok());
  auto all = store.ListJobs({}, 0);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 5u);
  EXPECT_EQ((*all)[0].name(), "j0");
  auto newest = store.ListJobs({}, 2);
  ASSERT_TRUE(newest.ok());
  ASSERT_EQ(newest->size(), 2u);
  EXPECT_EQ((*newest)[0].name(), "j3");
  EXPECT_EQ((*newest)[1].name(), "j4");
  auto failed = store.ListJobs({v1::JOB_STATE_FAILED}, 0);
  ASSERT_TRUE(failed.ok());
  ASSERT_EQ(failed->size(), 2u);
  EXPECT_EQ((*failed)[0].name(), "j1");
  // A page reads only its rows: the first max_rows after after_seq, in submission order.
  std::vector<int64_t> seqs;
  auto page = store.ListJobs({}, 0, 0, &seqs, nullptr, /*max_rows=*/2);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[1].name(), "j1");
  auto next = store.ListJobs({v1::JOB_STATE_PENDING, v1::JOB_STATE_FAILED}, 0, seqs.back(), nullptr,
                             nullptr, /*max_rows=*/2);
  ASSERT_TRUE(next.ok());
  ASSERT_EQ(next->size(), 2u);
  EXPECT_EQ((*next)[0].name(), "j2");
  EXPECT_EQ((*next)[1].name(), "j3");
  // The owner's parameter cannot be reached by the states' (one clear error instead).
  const std::string owner = "alice";
  auto too_many =
      store.ListJobs(std::vector<v1::JobState>(97, v1::JOB_STATE_FAILED), 0, 1, nullptr, &owner, 1);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument) << too_many.status();
  auto counts = store.CountJobsByState();
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ((*counts)[v1::JOB_STATE_PENDING], 3);
  EXPECT_EQ((*counts)[v1::JOB_STATE_FAILED], 2);
}

// GetLogs' `since` and tail_lines are the store's selection: the last `limit` of the lines at or
// after the oldest time, read as such (not the whole log, trimmed afterwards).
TEST(JobStoreTest, ListLogsSelectsTheLastLinesSinceATime) {
  auto opened = JobStore::Open(TempDbPath());
  ASSERT_TRUE(opened.ok());
  JobStore& store = **opened;
  for (int i = 0; i < 10; ++i) {
    v1::LogLine line;
    line.set_job_id("job-000001");
    line.set_rank(i % 2);
    line.set_time_ms(1000 * (i + 1));
    line.set_text(absl::StrCat("line ", i));
    ASSERT_TRUE(store.AppendLogs({line}).ok());
  }
  auto since = store.ListLogs("job-000001", std::nullopt, 0, 0, /*oldest_time_ms=*/7000);
  ASSERT_TRUE(since.ok());
  ASSERT_EQ(since->size(), 4u);
  EXPECT_EQ(since->front().text(), "line 6");
  auto tail = store.ListLogs("job-000001", std::nullopt, 2, 0, 7000);
  ASSERT_TRUE(tail.ok());
  ASSERT_EQ(tail->size(), 2u);
  EXPECT_EQ((*tail)[0].text(), "line 8");
  EXPECT_EQ((*tail)[1].text(), "line 9");
  auto rank0 = store.ListLogs("job-000001", 0, 5, 0, 4000);
  ASSERT_TRUE(rank0.ok());
  ASSERT_EQ(rank0->size(), 3u);  // lines 4, 6, 8
  EXPECT_EQ((*rank0)[0].text(), "line 4");
  auto none = store.ListLogs("job-000001", std::nullopt, 0, 0, 20000);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(JobStoreTest, LogsAndMetricsHistoryAreBoundedPerJob) {
  JobStore::Limits limits;
  limits.max_logs_per_job = 20;
  limits.max_metrics_history_per_job = 10;
  auto opened = JobStore::Open(TempDbPath(), limits);
  ASSERT_TRUE(opened.ok());
  JobStore& store = **opened;
  for (int i = 0; i < 100; ++i) {
    v1::LogLine line;
    line.set_job_id("job-000001");
    line.set_rank(i % 2);
    line.set_text(absl::StrCat("line ", i));
    ASSERT_TRUE(store.AppendLogs({line}).ok());
    v1::StepMetrics m;
    m.set_job_id("job-000001");
    m.set_rank(i % 2);
    m.set_step(i);
    ASSERT_TRUE(store.PutStepMetrics(m).ok());
  }
  auto logs = store.ListLogs("job-000001", std::nullopt, 0);
  ASSERT_TRUE(logs.ok());
  EXPECT_GE(logs->size(), 20u);
  EXPECT_LE(logs->size(), 22u);  // trimmed in batches of a tenth
  EXPECT_EQ(logs->back().text(), "line 99");
  auto rank1 = store.ListLogs("job-000001", 1, 3);
  ASSERT_TRUE(rank1.ok());
  ASSERT_EQ(rank1->size(), 3u);
  EXPECT_EQ((*rank1)[0].text(), "line 95");
  EXPECT_EQ((*rank1)[2].text(), "line 99");
  // Every line carries its seq; a reader resumes strictly after the last one it saw.
  for (size_t i = 1; i < logs->size(); ++i) EXPECT_GT((*logs)[i].seq(), (*logs)[i - 1].seq());
  const int64_t resume = (*logs)[logs->size() - 3].seq();
  auto after = store.ListLogs("job-000001", std::nullopt, 0, resume);
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after->size(), 2u);
  EXPECT_EQ((*after)[0].text(), "line 98");
  EXPECT_EQ((*after)[1].text(), "line 99");
  auto rank1_after = store.ListLogs("job-000001", 1, 0, resume);
  ASSERT_TRUE(rank1_after.ok());
  ASSERT_EQ(rank1_after->size(), 1u);
  EXPECT_EQ((*rank1_after)[0].text(), "line 99");
  // AppendLogs returns the first new line's seq; a batch's lines follow it consecutively.
  v1::LogLine a, b;
  a.set_job_id("job-000001");
  a.set_text("batch a");
  b = a;
  b.set_text("batch b");
  absl::StatusOr<int64_t> first = store.AppendLogs({a, b});
  ASSERT_TRUE(first.ok());
  EXPECT_GT(*first, logs->back().seq());
  auto batch = store.ListLogs("job-000001", std::nullopt, 0, *first - 1);
  ASSERT_TRUE(batch.ok());
  ASSERT_EQ(batch->size(), 2u);
  EXPECT_EQ((*batch)[0].seq(), *first);
  EXPECT_EQ((*batch)[1].seq(), *first + 1);
  EXPECT_EQ((*batch)[1].text(), "batch b");

  auto history = store.StepMetricsHistory("job-000001", 0);
  ASSERT_TRUE(history.ok());
  EXPECT_GE(history->size(), 10u);
  EXPECT_LE(history->size(), 11u);
  EXPECT_EQ(history->back().step(), 99);
  auto latest = store.LatestStepMetrics("job-000001");
  ASSERT_TRUE(latest.ok());
  ASSERT_EQ(latest->size(), 2u);
  EXPECT_EQ((*latest)[0].step(), 98);
  EXPECT_EQ((*latest)[1].step(), 99);
}

TEST(JobStoreTest, ReceiptsAreStoredWithTheirRowsAndSurviveAReopen) {
  const std::string path = TempDbPath();
  {
    auto opened = JobStore::Open(path);
    ASSERT_TRUE(opened.ok()) << opened.status();
    JobStore& store = **opened;
    v1::LogLine line;
    line.set_job_id("job-000001");
    line.set_text("hello");
    const WorkerReceipt first{"worker-0001", "boot-a", 5};
    ASSERT_TRUE(store.AppendLogs({line}, &first).ok());
    v1::StepMetrics m;
    m.set_job_id("job-000001");
    m.set_step(3);
    const WorkerReceipt later{"worker-0001", "boot-a", 9};
    ASSERT_TRUE(store.PutStepMetrics(m, &later).ok());
    const WorkerReceipt other{"worker-0002", "boot-b", 2};
    ASSERT_TRUE(store.AppendLogs({line}, &other).ok());
    ASSERT_TRUE(store.AppendLogs({line}).ok());  // no receipt: nothing about workers changes
  }
  auto reopened = JobStore::Open(path);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  absl::StatusOr<ActiveState> active = (*reopened)->LoadActive();
  ASSERT_TRUE(active.ok()) << active.status();
  ASSERT_EQ(active->receipts.size(), 2u);
  EXPECT_EQ(active->receipts[0].worker_id, "worker-0001");
  EXPECT_EQ(active->receipts[0].boot_id, "boot-a");
  EXPECT_EQ(active->receipts[0].seq, 9u);
  EXPECT_EQ(active->receipts[1].worker_id, "worker-0002");
  EXPECT_EQ(active->receipts[1].seq, 2u);
  auto logs = (*reopened)->ListLogs("job-000001", std::nullopt, 0);
  ASSERT_TRUE(logs.ok());
  EXPECT_EQ(logs->size(), 3u);
}

TEST(JobStoreTest, SecondOpenOfTheSameFileIsRefused) {
  const std::string path = TempDbPath();
  auto first = JobStore::Open(path);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = JobStore::Open(path);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("locked"));
}

TEST(JobStoreTest, RefusesNewerSchema) {
  const std::string path = TempDbPath();
  {
    auto db = SqliteDb::Open(path);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->Exec("PRAGMA user_version=99").ok());
  }
  auto store = JobStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("schema version 99"));
}

// A file of schema version 1 (before jobs had owners) opens: its jobs belong to nobody, new jobs
// record their owner, and listing by owner finds each user's own.
TEST(JobStoreTest, VersionOneFileGainsOwners) {
  const std::string path = TempDbPath();
  {
    auto opened = JobStore::Open(path);
    ASSERT_TRUE(opened.ok()) << opened.status();
    JobRecord old_job = NewJob(**opened, "old", 0);
    StoreWrite write;
    write.jobs = {old_job};
    ASSERT_TRUE((*opened)->Commit(write).ok());
  }
  {
    // Back to version 1 as it shipped: no owner column, no index, no rank boot ids, no end times.
    auto db = SqliteDb::Open(path);
    ASSERT_TRUE(db.ok());
    const char* to_version_1 =
        "DROP INDEX jobs_by_owner; ALTER TABLE jobs DROP COLUMN owner; "
        "ALTER TABLE rank_assignments DROP COLUMN boot_id; DROP INDEX jobs_by_end_time; "
        "ALTER TABLE jobs DROP COLUMN end_time_ms; DROP TABLE store_counters; "
        "ALTER TABLE workers DROP COLUMN lost_since_ms; PRAGMA user_version=1";
    ASSERT_TRUE((*db)->Exec(to_version_1).ok());
  }
  auto opened = JobStore::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  JobStore& store = **opened;
  JobRecord mine = NewJob(store, "mine", 0);
  mine.job.set_owner("alice");
  StoreWrite write;
  write.jobs = {mine};
  ASSERT_TRUE(store.Commit(write).ok());
  auto all = store.ListJobs({}, 0);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].owner(), "");
  EXPECT_EQ((*all)[1].owner(), "alice");
  const std::string alice = "alice", nobody = "";
  auto alices = store.ListJobs({}, 1, 0, nullptr, &alice);
  ASSERT_TRUE(alices.ok()) << alices.status();
  ASSERT_EQ(alices->size(), 1u);
  EXPECT_EQ((*alices)[0].name(), "mine");
  auto nobodys = store.ListJobs({v1::JOB_STATE_PENDING}, 0, 0, nullptr, &nobody);
  ASSERT_TRUE(nobodys.ok());
  ASSERT_EQ(nobodys->size(), 1u);
  EXPECT_EQ((*nobodys)[0].name(), "old");
}

TEST(JobStoreTest, AttemptUpsertReplacesRankStates) {
  auto opened = JobStore::Open(TempDbPath());
  ASSERT_TRUE(opened.ok());
  JobStore& store = **opened;
  AttemptRecord attempt{"job-000001", 2, v1::JOB_STATE_SCHEDULED, 1, 0, "", {}};
  attempt.ranks.push_back({0, "w1", "n1", 0, v1::RANK_STATE_UNSPECIFIED, 0});
  StoreWrite first;
  first.attempts = {attempt};
  ASSERT_TRUE(store.Commit(first).ok());
  attempt.state = v1::JOB_STATE_FAILED;
  attempt.ranks[0].state = v1::RANK_STATE_FAILED;
  attempt.ranks[0].exit_code = 3;
  StoreWrite second;
  second.attempts = {attempt};
  second.durable = false;
  ASSERT_TRUE(store.Commit(second).ok());
  auto read = store.ListAttempts("job-000001");
  ASSERT_TRUE(read.ok());
  ASSERT_EQ(read->size(), 1u);
  EXPECT_EQ((*read)[0].attempt, 2);
  EXPECT_EQ((*read)[0].state, v1::JOB_STATE_FAILED);
  ASSERT_EQ((*read)[0].ranks.size(), 1u);
  EXPECT_EQ((*read)[0].ranks[0].exit_code, 3);
  EXPECT_EQ((*read)[0].ranks[0].state, v1::RANK_STATE_FAILED);
}

// Each rank keeps the worker daemon run it was assigned to (schema 3); the ranks of a version-2
// file have none, so their Assignments are never sent again.
TEST(JobStoreTest, RanksKeepTheDaemonRunTheyWereAssignedTo) {
  const std::string path = TempDbPath();
  AttemptRecord attempt{"job-000001", 1, v1::JOB_STATE_SCHEDULED, 1, 0, "", {}};
  attempt.ranks.push_back({0, "w1", "n1", 0, v1::RANK_STATE_UNSPECIFIED, 0, "boot-a"});
  {
    auto opened = JobStore::Open(path);
    ASSERT_TRUE(opened.ok());
    StoreWrite write;
    write.attempts = {attempt};
    ASSERT_TRUE((*opened)->Commit(write).ok());
    auto read = (*opened)->GetAttempt("job-000001", 1);
    ASSERT_TRUE(read.ok()) << read.status();
    ASSERT_EQ(read->ranks.size(), 1u);
    EXPECT_EQ(read->ranks[0].boot_id, "boot-a");
  }
  {
    auto db = SqliteDb::Open(path);
    ASSERT_TRUE(db.ok());
    const char* to_version_2 =
        "ALTER TABLE rank_assignments DROP COLUMN boot_id; DROP INDEX jobs_by_end_time; "
        "ALTER TABLE jobs DROP COLUMN end_time_ms; DROP TABLE store_counters; "
        "ALTER TABLE workers DROP COLUMN lost_since_ms; PRAGMA user_version=2";
    ASSERT_TRUE((*db)->Exec(to_version_2).ok());
  }
  auto opened = JobStore::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto read = (*opened)->GetAttempt("job-000001", 1);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->ranks.size(), 1u);
  EXPECT_EQ(read->ranks[0].worker_id, "w1");
  EXPECT_EQ(read->ranks[0].boot_id, "");
}

TEST(JobStoreTest, RendezvousKeysOutliveTheStoreUntilTheirAttemptEnds) {
  const std::string path = TempDbPath();
  const std::string nccl_id("\0\x01\xff\0id", 6);  // binary, with NUL bytes
  {
    auto opened = JobStore::Open(path);
    ASSERT_TRUE(opened.ok());
    AttemptRecord attempt{"job-000001", 1, v1::JOB_STATE_RUNNING, 1, 0, "", {}};
    StoreWrite write;
    write.attempts = {attempt};
    ASSERT_TRUE((*opened)->Commit(write).ok());
    ASSERT_TRUE((*opened)->PutRendezvousKey("job-000001", 1, "nccl_unique_id", nccl_id).ok());
    ASSERT_TRUE((*opened)->PutRendezvousKey("job-000001", 1, "rank0", "addr-a").ok());
    ASSERT_TRUE((*opened)->PutRendezvousKey("job-000001", 1, "rank0", "addr-b").ok());  // overwrite
    ASSERT_TRUE((*opened)->PutRendezvousKey("job-000001", 2, "rank0", "other attempt").ok());
  }
  auto reopened = JobStore::Open(path);  // a restart
  ASSERT_TRUE(reopened.ok());
  JobStore& store = **reopened;
  auto keys = store.RendezvousKeys("job-000001", 1);
  ASSERT_TRUE(keys.ok());
  ASSERT_EQ(keys->size(), 2u);
  EXPECT_EQ((*keys)[0].first, "nccl_unique_id");
  EXPECT_EQ((*keys)[0].second, nccl_id);
  EXPECT_EQ((*keys)[1].first, "rank0");
  EXPECT_EQ((*keys)[1].second, "addr-b");
  // Writing the attempt ended deletes its keys (only its own).
  AttemptRecord ended{"job-000001", 1, v1::JOB_STATE_SUCCEEDED, 1, 2, "", {}};
  StoreWrite write;
  write.attempts = {ended};
  ASSERT_TRUE(store.Commit(write).ok());
  EXPECT_TRUE(store.RendezvousKeys("job-000001", 1)->empty());
  EXPECT_EQ(store.RendezvousKeys("job-000001", 2)->size(), 1u);
}

TEST(JobStoreTest, ClusterEventsListedWithJobEvents) {
  auto opened = JobStore::Open(TempDbPath());
  ASSERT_TRUE(opened.ok());
  StoreWrite write;
  write.events = {MakeEvent("", 0, "WorkerRegistered"), MakeEvent("job-000001", 0, "Submitted"),
                  MakeEvent("", 0, "WorkerLost")};
  ASSERT_TRUE((*opened)->Commit(write).ok());
  auto all = (*opened)->ListEvents("", 0);
  ASSERT_TRUE(all.ok());
  std::vector<std::string> types;
  for (const auto& e : *all) types.push_back(e.type());
  EXPECT_THAT(types, ElementsAre("WorkerRegistered", "Submitted", "WorkerLost"));
  auto last = (*opened)->ListEvents("", 1);
  ASSERT_TRUE(last.ok());
  ASSERT_EQ(last->size(), 1u);
  EXPECT_EQ((*last)[0].type(), "WorkerLost");
}

}  // namespace
}  // namespace dropless::coordinator
