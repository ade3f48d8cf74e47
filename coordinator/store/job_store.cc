#include "coordinator/store/job_store.h"
#include "coordinator/store/job_not_found.h"
#include "coordinator/store/proto_rows.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dropless::coordinator {
namespace {

// Version 1. Protos that are only ever read back whole are stored as serialized blobs; the
// columns next to them are what queries filter or order by.
constexpr absl::string_view kSchemaV1 = R"sql(
CREATE TABLE jobs(
  id TEXT PRIMARY KEY,
  seq INTEGER NOT NULL UNIQUE,
  state INTEGER NOT NULL,
  priority INTEGER NOT NULL,
  max_attempts INTEGER NOT NULL,
  queued_time_ms INTEGER NOT NULL,
  data BLOB NOT NULL);
CREATE INDEX jobs_by_state ON jobs(state, seq);
CREATE TABLE attempts(
  job_id TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  state INTEGER NOT NULL,
  create_time_ms INTEGER NOT NULL,
  end_time_ms INTEGER NOT NULL,
  message TEXT NOT NULL,
  PRIMARY KEY(job_id, attempt));
CREATE TABLE rank_assignments(
  job_id TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  worker_id TEXT NOT NULL,
  node TEXT NOT NULL,
  slot INTEGER NOT NULL,
  state INTEGER NOT NULL,
  exit_code INTEGER NOT NULL,
  PRIMARY KEY(job_id, attempt, rank));
CREATE TABLE workers(
  id TEXT PRIMARY KEY,
  node TEXT NOT NULL UNIQUE,
  state INTEGER NOT NULL,
  data BLOB NOT NULL);
CREATE TABLE events(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  time_ms INTEGER NOT NULL,
  job_id TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  type TEXT NOT NULL,
  message TEXT NOT NULL);
CREATE INDEX events_by_job ON events(job_id, id);
CREATE TABLE step_metrics_latest(
  job_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  data BLOB NOT NULL,
  PRIMARY KEY(job_id, rank));
CREATE TABLE step_metrics_history(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL,
  data BLOB NOT NULL);
CREATE INDEX step_metrics_history_by_job ON step_metrics_history(job_id, id);
CREATE TABLE logs(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  time_ms INTEGER NOT NULL,
  text TEXT NOT NULL);
CREATE INDEX logs_by_job ON logs(job_id, id);
CREATE INDEX logs_by_job_rank ON logs(job_id, rank, id);
)sql";

// The rendezvous keys of active attempts (RendezvousStore), so that ranks still rendezvousing
// when the coordinator restarts find what their peers put before it.
constexpr absl::string_view kRendezvousTable = R"sql(
CREATE TABLE IF NOT EXISTS rendezvous_keys(
  job_id TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  key TEXT NOT NULL,
  value BLOB NOT NULL,
  PRIMARY KEY(job_id, attempt, key));
)sql";

// The rendezvous secret of each active attempt (AttemptRecord.rendezvous_secret).
constexpr absl::string_view kRendezvousSecretsTable = R"sql(
CREATE TABLE IF NOT EXISTS rendezvous_secrets(
  job_id TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  secret TEXT NOT NULL,
  PRIMARY KEY(job_id, attempt));
)sql";

// SubmitJobRequest.request_id -> the job that request made, per owner (idempotent submits).
constexpr absl::string_view kSubmitRequestsTable = R"sql(
CREATE TABLE IF NOT EXISTS submit_requests(
  owner TEXT NOT NULL,
  request_id TEXT NOT NULL,
  job_id TEXT NOT NULL,
  PRIMARY KEY(owner, request_id));
)sql";

// WorkerReceipt: per worker, the last queued message whose rows are stored.
constexpr absl::string_view kWorkerReceiptsTable = R"sql(
CREATE TABLE IF NOT EXISTS worker_receipts(
  worker_id TEXT PRIMARY KEY,
  boot_id TEXT NOT NULL,
  seq INTEGER NOT NULL);
)sql";

// Schema version 2: the user who submitted each job, so that a user's jobs are found without
// reading every job's blob. Jobs of older files belong to nobody ("").
constexpr absl::string_view kJobsOwnerColumn = R"sql(
ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT '';
CREATE INDEX jobs_by_owner ON jobs(owner, seq);
)sql";

// Schema version 3: the worker daemon run each rank was assigned to (RankRecord.boot_id). Ranks
// of older files have none, and their Assignments are never sent again.
constexpr absl::string_view kRankBootIdColumn = R"sql(
ALTER TABLE rank_assignments ADD COLUMN boot_id TEXT NOT NULL DEFAULT '';
)sql";

constexpr absl::string_view kSubmitRequestsByJobIndex = R"sql(
CREATE INDEX IF NOT EXISTS submit_requests_by_job ON submit_requests(job_id);
)sql";

// The SQL parameter number of the owner in job queries: above any numbered integer argument.
constexpr int kOwnerParam = 100;

constexpr absl::string_view kJobColumns =
    "id, seq, state, priority, max_attempts, queued_time_ms, data";

// Reads a row selected with kJobColumns.
absl::Status ReadJobRow(const SqliteStatement& st, JobRecord* record) {
  if (absl::Status s = ParseBlob(st.ColumnText(6), &record->job, "jobs"); !s.ok()) return s;
  record->job.set_id(st.ColumnText(0));
  record->seq = st.ColumnInt(1);
  record->job.set_state(static_cast<v1::JobState>(st.ColumnInt(2)));
  record->max_attempts = static_cast<int32_t>(st.ColumnInt(4));
  record->queued_time_ms = st.ColumnInt(5);
  return absl::OkStatus();
}

}  // namespace

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  return Open(path, Limits{});
}

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path,
                                                         Limits limits) {
  absl::StatusOr<std::unique_ptr<SqliteDb>> db = SqliteDb::Open(path);
  if (!db.ok()) return db.status();
  std::unique_ptr<JobStore> store(new JobStore(std::move(*db), limits));
  if (absl::Status s = store->Initialize(); !s.ok()) {
    if (absl::IsUnavailable(s)) {
      return absl::UnavailableError(absl::StrCat(
          "database ", path, " is locked (is another coordinator using it?): ", s.message()));
    }
    return s;
  }
  return store;
}

absl::Status JobStore::Initialize() {
  // Exclusive locking before WAL: the WAL index lives in heap memory and the file stays locked
  // for this process's lifetime, so a second coordinator on the same file fails fast.
  if (absl::Status s = db_->Exec("PRAGMA locking_mode=EXCLUSIVE"); !s.ok()) return s;
  // Statements are finalized at the end of each block: an unfinished one would keep the schema
  // transaction below from committing.
  {
    absl::StatusOr<SqliteStatement> wal = db_->Prepare("PRAGMA journal_mode=WAL");
    if (!wal.ok()) return wal.status();
    absl::StatusOr<bool> row = wal->Step();
    if (!row.ok()) return row.status();
    if (!*row || wal->ColumnText(0) != "wal") {
      return absl::FailedPreconditionError("the job store could not switch to WAL journaling");
    }
  }
  if (absl::Status s = db_->Exec("PRAGMA synchronous=FULL"); !s.ok()) return s;
  durable_ = true;

  int64_t schema = 0;
  {
    absl::StatusOr<SqliteStatement> version = db_->Prepare("PRAGMA user_version");
    if (!version.ok()) return version.status();
    absl::StatusOr<bool> row = version->Step();
    if (!row.ok()) return row.status();
    if (*row) schema = version->ColumnInt(0);
  }
  if (schema > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "job store schema version %d is newer than this coordinator's (%d)", schema,
        kSchemaVersion));
  }
  if (schema == 0) {
    absl::Status s = InTransaction(*db_, [&] {
      if (absl::Status c = db_->Exec(kSchemaV1); !c.ok()) return c;
      return db_->Exec("PRAGMA user_version=1");
    });
    if (!s.ok()) return s;
    schema = 1;
  }
  if (schema < 2) {
    if (absl::Status s = MigrateToOwners(); !s.ok()) return s;
  }
  if (schema < 3) {
    if (absl::Status s = MigrateToRankBootIds(); !s.ok()) return s;
  }
  if (schema < 4) {
    if (absl::Status s = MigrateToJobEndTimes(); !s.ok()) return s;
  }
  if (schema < 5) {
    if (absl::Status s = MigrateToWorkerLostSince(); !s.ok()) return s;
  }
  // Added after schema version 1 shipped; a table of its own, so older files gain it in place.
  if (absl::Status s = db_->Exec(kRendezvousTable); !s.ok()) return s;
  if (absl::Status s = db_->Exec(kSubmitRequestsTable); !s.ok()) return s;
  if (absl::Status s = db_->Exec(kRendezvousSecretsTable); !s.ok()) return s;
  if (absl::Status s = db_->Exec(kWorkerReceiptsTable); !s.ok()) return s;
  // Deleting expired jobs finds their submit requests by job, and expired cluster-wide events
  // by time (job_store_retention.cc).
  if (absl::Status s = db_->Exec(kSubmitRequestsByJobIndex); !s.ok()) return s;
  if (absl::Status s = IndexClusterEventsByTime(); !s.ok()) return s;

  absl::StatusOr<int64_t> highest = HighestJobSeq();
  if (!highest.ok()) return highest.status();
  next_seq_ = *highest + 1;
  return absl::OkStatus();
}

absl::Status JobStore::MigrateToOwners() {
  return InTransaction(*db_, [&] {
    if (absl::Status c = db_->Exec(kJobsOwnerColumn); !c.ok()) return c;
    return db_->Exec("PRAGMA user_version=2");
  });
}

absl::Status JobStore::MigrateToRankBootIds() {
  return InTransaction(*db_, [&] {
    if (absl::Status c = db_->Exec(kRankBootIdColumn); !c.ok()) return c;
    return db_->Exec("PRAGMA user_version=3");
  });
}

std::string JobStore::NextJobId(int64_t* seq) {
  *seq = next_seq_++;
  return absl::StrFormat("job-%06d", *seq);
}

absl::Status JobStore::SetDurable(bool durable) {
  if (durable == durable_) return absl::OkStatus();
  absl::Status s = db_->Exec(durable ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL");
  if (s.ok()) durable_ = durable;
  return s;
}

absl::Status JobStore::WriteJob(const JobRecord& record) {
  v1::Job stored = record.job;
  stored.clear_placement();  // derived from rank_assignments on read
  stored.clear_latest();     // derived from step_metrics_latest on read
  absl::StatusOr<SqliteStatement> st = db_->Prepare(
      "INSERT OR REPLACE INTO jobs(id, seq, state, priority, max_attempts, queued_time_ms, data, "
      "owner, end_time_ms) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
  if (!st.ok()) return st.status();
  st->Bind(1, stored.id())
      .Bind(2, record.seq)
      .Bind(3, static_cast<int64_t>(stored.state()))
      .Bind(4, static_cast<int64_t>(stored.priority()))
      .Bind(5, static_cast<int64_t>(record.max_attempts))
      .Bind(6, record.queued_time_ms)
      .BindBlob(7, stored.SerializeAsString())
      .Bind(8, stored.owner())
      .Bind(9, EndTimeColumn(stored));
  return st->Run();
}

absl::Status JobStore::WriteAttempt(const AttemptRecord& attempt) {
  absl::StatusOr<SqliteStatement> st = db_->Prepare(
      "INSERT OR REPLACE INTO attempts(job_id, attempt, state, create_time_ms, end_time_ms, "
      "message) VALUES(?1, ?2, ?3, ?4, ?5, ?6)");
  if (!st.ok()) return st.status();
  st->Bind(1, attempt.job_id)
      .Bind(2, static_cast<int64_t>(attempt.attempt))
      .Bind(3, static_cast<int64_t>(attempt.state))
      .Bind(4, attempt.create_time_ms)
      .Bind(5, attempt.end_time_ms)
      .Bind(6, attempt.message);
  if (absl::Status s = st->Run(); !s.ok()) return s;

  absl::StatusOr<SqliteStatement> clear =
      db_->Prepare("DELETE FROM rank_assignments WHERE job_id = ?1 AND attempt = ?2");
  if (!clear.ok()) return clear.status();
  clear->Bind(1, attempt.job_id).Bind(2, static_cast<int64_t>(attempt.attempt));
  if (absl::Status s = clear->Run(); !s.ok()) return s;
  if (attempt.state != v1::JOB_STATE_SCHEDULED && attempt.state != v1::JOB_STATE_RUNNING) {
    // The attempt is over: its rendezvous keys and secret go with the write that ends it.
    for (const char* table : {"rendezvous_keys", "rendezvous_secrets"}) {
      absl::StatusOr<SqliteStatement> drop = db_->Prepare(
          absl::StrCat("DELETE FROM ", table, " WHERE job_id = ?1 AND attempt = ?2"));
      if (!drop.ok()) return drop.status();
      drop->Bind(1, attempt.job_id).Bind(2, static_cast<int64_t>(attempt.attempt));
      if (absl::Status s = drop->Run(); !s.ok()) return s;
    }
  } else if (!attempt.rendezvous_secret.empty()) {
    absl::StatusOr<SqliteStatement> put = db_->Prepare(
        "INSERT OR REPLACE INTO rendezvous_secrets(job_id, attempt, secret) VALUES(?1, ?2, ?3)");
    if (!put.ok()) return put.status();
    put->Bind(1, attempt.job_id)
        .Bind(2, static_cast<int64_t>(attempt.attempt))
        .Bind(3, attempt.rendezvous_secret);
    if (absl::Status s = put->Run(); !s.ok()) return s;
  }
  for (const RankRecord& rank : attempt.ranks) {
    absl::StatusOr<SqliteStatement> ins = db_->Prepare(
        "INSERT INTO rank_assignments(job_id, attempt, rank, worker_id, node, slot, state, "
        "exit_code, boot_id) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
    if (!ins.ok()) return ins.status();
    ins->Bind(1, attempt.job_id)
        .Bind(2, static_cast<int64_t>(attempt.attempt))
        .Bind(3, static_cast<int64_t>(rank.rank))
        .Bind(4, rank.worker_id)
        .Bind(5, rank.node)
        .Bind(6, static_cast<int64_t>(rank.slot))
        .Bind(7, static_cast<int64_t>(rank.state))
        .Bind(8, static_cast<int64_t>(rank.exit_code))
        .Bind(9, rank.boot_id);
    if (absl::Status s = ins->Run(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status JobStore::WriteEvent(v1::Event& event) {
  absl::StatusOr<SqliteStatement> st = db_->Prepare(
      "INSERT INTO events(time_ms, job_id, attempt, type, message) VALUES(?1, ?2, ?3, ?4, ?5)");
  if (!st.ok()) return st.status();
  st->Bind(1, event.time_ms())
      .Bind(2, event.job_id())
      .Bind(3, static_cast<int64_t>(event.attempt()))
      .Bind(4, event.type())
      .Bind(5, event.message());
  if (absl::Status s = st->Run(); !s.ok()) return s;
  event.set_id(db_->LastInsertRowId());
  return absl::OkStatus();
}

absl::Status JobStore::WriteSubmitRequest(const SubmitRequestRecord& request) {
  absl::StatusOr<SqliteStatement> st = db_->Prepare(
      "INSERT INTO submit_requests(owner, request_id, job_id) VALUES(?1, ?2, ?3)");
  if (!st.ok()) return st.status();
  st->Bind(1, request.owner).Bind(2, request.request_id).Bind(3, request.job_id);
  return st->Run();
}

absl::Status JobStore::Commit(StoreWrite& write) {
  if (write.empty()) return absl::OkStatus();
  if (absl::Status s = SetDurable(write.durable); !s.ok()) return s;
  return InTransaction(*db_, [&]() -> absl::Status {
    for (const JobRecord& job : write.jobs) {
      if (absl::Status s = WriteJob(job); !s.ok()) return s;
    }
    for (const AttemptRecord& attempt : write.attempts) {
      if (absl::Status s = WriteAttempt(attempt); !s.ok()) return s;
    }
    for (const WorkerRecord& worker : write.workers) {
      if (absl::Status s = WriteWorker(worker); !s.ok()) return s;
    }
    for (const std::string& worker_id : write.forgotten_workers) {
      if (absl::Status s = DeleteWorker(worker_id); !s.ok()) return s;
    }
    if (write.last_worker_number > 0) {
      if (absl::Status s = RaiseLastWorkerNumber(write.last_worker_number); !s.ok()) return s;
    }
    for (v1::Event& event : write.events) {
      if (absl::Status s = WriteEvent(event); !s.ok()) return s;
    }
    for (const SubmitRequestRecord& request : write.submit_requests) {
      if (absl::Status s = WriteSubmitRequest(request); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<JobRecord>> JobStore::QueryJobs(absl::string_view where_and_order,
                                                           const std::vector<int64_t>& args,
                                                           const std::string* owner) {
  absl::StatusOr<SqliteStatement> st =
      db_->Prepare(absl::StrCat("SELECT ", kJobColumns, " FROM jobs ", where_and_order));
  if (!st.ok()) return st.status();
  for (size_t i = 0; i < args.size(); ++i) st->Bind(static_cast<int>(i + 1), args[i]);
  if (owner != nullptr) st->Bind(kOwnerParam, *owner);
  std::vector<JobRecord> out;
  while (true) {
    absl::StatusOr<bool> row = st->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    JobRecord record;
    if (absl::Status s = ReadJobRow(*st, &record); !s.ok()) return s;
    out.push_back(std::move(record));
  }
  return out;
}

absl::StatusOr<JobRecord> JobStore::GetJobRecord(absl::string_view id) {
  absl::StatusOr<SqliteStatement> st = db_->Prepare(
      absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE id = ?1"));
  if (!st.ok()) return st.status();
  st->Bind(1, id);
  absl::StatusOr<bool> row = st->Step();
  if (!row.ok()) return row.status();
  if (!*row) return JobNotFoundError(id);
  JobRecord record;
  if (absl::Status s = ReadJobRow(*st, &record); !s.ok()) return s;
  return record;
}

absl::Status JobStore::FillView(const JobRecord& record, v1::Job* job) {
  *job = record.job;
  job->clear_placement();
  job->clear_latest();
  if (record.job.attempt() > 0) {
    absl::StatusOr<AttemptRecord> attempt = GetAttempt(record.job.id(), record.job.attempt());
    if (!attempt.ok() && !absl::IsNotFound(attempt.status())) return attempt.status();
    if (attempt.ok()) {
      for (const RankRecord& rank : attempt->ranks) {
        v1::RankPlacement* p = job->add_placement();
        p->set_rank(rank.rank);
        p->set_worker_id(rank.worker_id);
        p->set_node(rank.node);
        p->set_slot(rank.slot);
      }
    }
  }
  absl::StatusOr<SqliteStatement> st = db_->Prepare(
      "SELECT data FROM step_metrics_latest WHERE job_id = ?1 ORDER BY rank LIMIT 1");
  if (!st.ok()) return st.status();
  st->Bind(1, record.job.id());
  absl::StatusOr<bool> row = st->Step();
  if (!row.ok()) return row.status();
  if (*row) return ParseBlob(st->ColumnText(0), job->mutable_latest(), "step_metrics_latest");
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobStore::GetJob(absl::string_view id) {
  absl::StatusOr<JobRecord> record = GetJobRecord(id);
  if (!record.ok()) return record.status();
  v1::Job job;
  if (absl::Status s = FillView(*record, &job); !s.ok()) return s;
  return job;
}

absl::StatusOr<std::vector<v1::Job>> JobStore::ListJobs(const std::vector<v1::JobState>& states,
                                                        int limit, int64_t after_seq,
                                                        std::vector<int64_t>* seqs,
                                                        const std::string* owner, int max_rows) {
  // The numbered parameters (the states, after_seq, limit, max_rows) stay below the owner's.
  if (states.size() + 3 >= static_cast<size_t>(kOwnerParam)) {
    return absl::InvalidArgumentError(
        absl::StrCat("states: at most ", kOwnerParam - 4, " (each state once)"));
  }
  std::vector<std::string> conditions;
  std::vector<int64_t> args;
  if (!states.empty()) {
    std::vector<std::string> marks;
    for (v1::JobState state : states) {
      args.push_back(state);
      marks.push_back(absl::StrCat("?", args.size()));
    }
    conditions.push_back(absl::StrCat("state IN (", absl::StrJoin(marks, ", "), ")"));
  }
  if (after_seq > 0) {
    args.push_back(after_seq);
    conditions.push_back(absl::StrCat("seq > ?", args.size()));
  }
  if (owner != nullptr) conditions.push_back(absl::StrCat("owner = ?", kOwnerParam));
  const std::string where =
      conditions.empty() ? "" : absl::StrCat("WHERE ", absl::StrJoin(conditions, " AND "), " ");
  std::string suffix;
  if (limit > 0) {
    args.push_back(limit);
    suffix = absl::StrCat("WHERE seq IN (SELECT seq FROM jobs ", where, "ORDER BY seq DESC LIMIT ?",
                          args.size(), ") ORDER BY seq");
  } else {
    suffix = absl::StrCat(where, "ORDER BY seq");
  }
  if (max_rows > 0) {
    args.push_back(max_rows);
    absl::StrAppend(&suffix, " LIMIT ?", args.size());
  }
  absl::StatusOr<std::vector<JobRecord>> records = QueryJobs(suffix, args, owner);
  if (!records.ok()) return records.status();
  std::vector<v1::Job> jobs(records->size());
  for (size_t i = 0; i < records->size(); ++i) {
    if (absl::Status s = FillView((*records)[i], &jobs[i]); !s.ok()) return s;
    if (seqs != nullptr) seqs->push_back((*records)[i].seq);
  }
  return jobs;
}

absl::StatusOr<std::map<v1::JobState, int64_t>> JobStore::CountJobsByState() {
  absl::StatusOr<SqliteStatement> st =
      db_->Prepare("SELECT state, COUNT(*) FROM jobs GROUP BY state");
  if (!st.ok()) return st.status();
  std::map<v1::JobState, int64_t> counts;
  while (true) {
    absl::StatusOr<bool> row = st->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    counts[static_cast<v1::JobState>(st->ColumnInt(0))] = st->ColumnInt(1);
  }
  return counts;
}

}  // namespace dropless::coordinator
