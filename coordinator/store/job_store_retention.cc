// JobStore retention: deleting finished jobs whose end is older than the coordinator's
// --job-retention, with every row that belongs to them, and the cluster-wide events as old, and
// the schema that makes it cheap (version 4: jobs.end_time_ms under an index of the finished jobs
// only, and store_counters, which keeps job ids from being reused once the newest jobs are gone;
// an index of the cluster-wide events by time, added in place).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/store/job_store.h"
#include "coordinator/store/proto_rows.h"

namespace dropless::coordinator {
namespace {

static_assert(v1::JOB_STATE_SUCCEEDED == 4 && v1::JOB_STATE_FAILED == 5 &&
                  v1::JOB_STATE_CANCELLED == 6,
              "kFinishedJobs spells the terminal states as numbers");
// The terminal states as a literal: the partial index below serves only queries whose WHERE
// holds this very term (SQLite matches it as written, not through bound parameters).
constexpr absl::string_view kFinishedJobs = "state IN (4, 5, 6)";

// The events of no job, as a literal for the same reason: the partial index
// events_of_cluster_by_time holds them alone, by time (through events_by_job each batch would
// read and sort every cluster-wide event, the recent ones too).
constexpr absl::string_view kClusterEvents = "job_id = ''";

constexpr absl::string_view kLastJobSeqCounter = "last_job_seq";

// Every table with rows of a job, by its job_id column (the jobs table itself is deleted last).
constexpr const char* kPerJobTables[] = {"attempts",
                                         "rank_assignments",
                                         "events",
                                         "step_metrics_latest",
                                         "step_metrics_history",
                                         "logs",
                                         "rendezvous_keys",
                                         "rendezvous_secrets",
                                         "submit_requests"};

// When a finished job ended; its create time for one without an end time (none is written so).
int64_t EndedAtMs(const v1::Job& job) {
  return job.end_time_ms() != 0 ? job.end_time_ms() : job.create_time_ms();
}

// "?1, ?2, ..., ?n"
std::string Placeholders(size_t n) {
  std::vector<std::string> marks;
  for (size_t i = 1; i <= n; ++i) marks.push_back(absl::StrCat("?", i));
  return absl::StrJoin(marks, ", ");
}

}  // namespace

int64_t JobStore::EndTimeColumn(const v1::Job& job) {
  return IsTerminal(job.state()) ? EndedAtMs(job) : 0;
}

absl::Status JobStore::MigrateToJobEndTimes() {
  return InTransaction(*db_, [&]() -> absl::Status {
    if (absl::Status s = db_->Exec(absl::StrCat(
            "ALTER TABLE jobs ADD COLUMN end_time_ms INTEGER NOT NULL DEFAULT 0; "
            "CREATE INDEX jobs_by_end_time ON jobs(end_time_ms) WHERE ",
            kFinishedJobs,
            "; CREATE TABLE store_counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL);"));
        !s.ok()) {
      return s;
    }
    // The finished jobs of an older file get their end time from their row's blob.
    std::vector<std::pair<std::string, int64_t>> ends;
    {
      absl::StatusOr<SqliteStatement> st =
          db_->Prepare(absl::StrCat("SELECT id, data FROM jobs WHERE ", kFinishedJobs));
      if (!st.ok()) return st.status();
      while (true) {
        absl::StatusOr<bool> row = st->Step();
        if (!row.ok()) return row.status();
        if (!*row) break;
        v1::Job job;
        if (absl::Status s = ParseBlob(st->ColumnText(1), &job, "jobs"); !s.ok()) return s;
        ends.emplace_back(st->ColumnText(0), EndedAtMs(job));
      }
    }
    for (const auto& [id, end_time_ms] : ends) {
      absl::StatusOr<SqliteStatement> update =
          db_->Prepare("UPDATE jobs SET end_time_ms = ?1 WHERE id = ?2");
      if (!update.ok()) return update.status();
      update->Bind(1, end_time_ms).Bind(2, id);
      if (absl::Status s = update->Run(); !s.ok()) return s;
    }
    return db_->Exec("PRAGMA user_version=4");
  });
}

absl::Status JobStore::IndexClusterEventsByTime() {
  return db_->Exec(
      absl::StrCat("CREATE INDEX IF NOT EXISTS events_of_cluster_by_time ON events(time_ms) WHERE ",
                   kClusterEvents));
}

absl::StatusOr<int64_t> JobStore::HighestJobSeq() {
  absl::StatusOr<SqliteStatement> st = db_->Prepare(
      "SELECT MAX(COALESCE((SELECT MAX(seq) FROM jobs), 0), "
      "COALESCE((SELECT value FROM store_counters WHERE name = ?1), 0))");
  if (!st.ok()) return st.status();
  st->Bind(1, kLastJobSeqCounter);
  absl::StatusOr<bool> row = st->Step();
  if (!row.ok()) return row.status();
  return *row ? st->ColumnInt(0) : 0;
}

absl::StatusOr<std::vector<std::string>> JobStore::DeleteJobsEndedBefore(int64_t end_time_ms) {
  // Without fsync: a deletion a power loss undoes is done again by the next sweep.
  if (absl::Status s = SetDurable(false); !s.ok()) return s;
  std::vector<std::string> ids;
  absl::Status status = InTransaction(*db_, [&]() -> absl::Status {
    // The oldest finished jobs first, through jobs_by_end_time: no sort, no scan of the others.
    // The index is named: without statistics (no ANALYZE) SQLite would pick jobs_by_state and
    // sort every finished job for each batch.
    std::vector<std::pair<std::string, int64_t>> candidates;  // id, seq
    {
      absl::StatusOr<SqliteStatement> st = db_->Prepare(
          absl::StrCat("SELECT id, seq FROM jobs INDEXED BY jobs_by_end_time WHERE ", kFinishedJobs,
                       " AND end_time_ms < ?1 ORDER BY end_time_ms LIMIT ?2"));
      if (!st.ok()) return st.status();
      // Each id taken is a bound parameter below (SQLite allows 32766).
      st->Bind(1, end_time_ms)
          .Bind(2, static_cast<int64_t>(std::clamp(limits_.max_expired_jobs, 1, 30000)));
      while (true) {
        absl::StatusOr<bool> row = st->Step();
        if (!row.ok()) return row.status();
        if (!*row) break;
        candidates.emplace_back(st->ColumnText(0), st->ColumnInt(1));
      }
    }
    // Taken while their bulky rows fit the batch's budget (the first one whatever it holds: a
    // job keeps at most Limits::max_logs_per_job lines and max_metrics_history_per_job records).
    int64_t rows = 0;
    int64_t highest_seq = next_seq_ - 1;
    for (const auto& [id, seq] : candidates) {
      absl::StatusOr<SqliteStatement> count = db_->Prepare(
          "SELECT (SELECT COUNT(*) FROM logs WHERE job_id = ?1) + (SELECT COUNT(*) FROM "
          "step_metrics_history WHERE job_id = ?1) + (SELECT COUNT(*) FROM events WHERE "
          "job_id = ?1)");
      if (!count.ok()) return count.status();
      count->Bind(1, id);
      absl::StatusOr<bool> row = count->Step();
      if (!row.ok()) return row.status();
      const int64_t job_rows = *row ? count->ColumnInt(0) : 0;
      if (!ids.empty() && rows + job_rows > limits_.max_expired_rows) break;
      rows += job_rows;
      ids.push_back(id);
      highest_seq = std::max(highest_seq, seq);
    }
    if (ids.empty()) return absl::OkStatus();
    // NextJobId continues from here after a restart, whichever jobs are left.
    absl::StatusOr<SqliteStatement> counter = db_->Prepare(
        "INSERT INTO store_counters(name, value) VALUES(?1, ?2) "
        "ON CONFLICT(name) DO UPDATE SET value = MAX(value, excluded.value)");
    if (!counter.ok()) return counter.status();
    counter->Bind(1, kLastJobSeqCounter).Bind(2, highest_seq);
    if (absl::Status s = counter->Run(); !s.ok()) return s;

    const std::string in = absl::StrCat(" IN (", Placeholders(ids.size()), ")");
    auto delete_rows = [&](absl::string_view table, absl::string_view column) -> absl::Status {
      absl::StatusOr<SqliteStatement> st =
          db_->Prepare(absl::StrCat("DELETE FROM ", table, " WHERE ", column, in));
      if (!st.ok()) return st.status();
      for (size_t i = 0; i < ids.size(); ++i) st->Bind(static_cast<int>(i + 1), ids[i]);
      return st->Run();
    };
    for (const char* table : kPerJobTables) {
      if (absl::Status s = delete_rows(table, "job_id"); !s.ok()) return s;
    }
    return delete_rows("jobs", "id");
  });
  if (!status.ok()) return status;
  for (const std::string& id : ids) {
    logs_since_trim_.erase(id);
    metrics_since_trim_.erase(id);
  }
  return ids;
}

absl::StatusOr<int64_t> JobStore::DeleteClusterEventsBefore(int64_t time_ms) {
  // Without fsync, as above.
  if (absl::Status s = SetDurable(false); !s.ok()) return s;
  int64_t deleted = 0;
  absl::Status status = InTransaction(*db_, [&]() -> absl::Status {
    absl::StatusOr<SqliteStatement> st = db_->Prepare(
        absl::StrCat("DELETE FROM events WHERE id IN (SELECT id FROM events INDEXED BY "
                     "events_of_cluster_by_time WHERE ",
                     kClusterEvents, " AND time_ms < ?1 ORDER BY time_ms LIMIT ?2)"));
    if (!st.ok()) return st.status();
    st->Bind(1, time_ms).Bind(2, static_cast<int64_t>(std::max(limits_.max_expired_rows, 1)));
    if (absl::Status s = st->Run(); !s.ok()) return s;
    deleted = db_->Changes();
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return deleted;
}

}  // namespace dropless::coordinator
