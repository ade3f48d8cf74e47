// JobStore reads of attempts, events and workers, the restart snapshot, and the bounded
// per-job streams (step metrics, logs).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/store/job_store.h"
#include "coordinator/store/proto_rows.h"

namespace dropless::coordinator {
absl::StatusOr<AttemptRecord> JobStore::GetAttempt(absl::string_view job_id, int32_t attempt) {
  absl::StatusOr<SqliteStatement> st = db_->Prepare(
      "SELECT state, create_time_ms, end_time_ms, message FROM attempts "
      "WHERE job_id = ?1 AND attempt = ?2");
  if (!st.ok()) return st.status();
  st->Bind(1, job_id).Bind(2, static_cast<int64_t>(attempt));
  absl::StatusOr<bool> row = st->Step();
  if (!row.ok()) return row.status();
  if (!*row) {
    return absl::NotFoundError(
        absl::StrCat("attempt ", attempt, " of job \"", job_id, "\" not found"));
  }
  AttemptRecord record;
  record.job_id = std::string(job_id);
  record.attempt = attempt;
  record.state = static_cast<v1::JobState>(st->ColumnInt(0));
  record.create_time_ms = st->ColumnInt(1);
  record.end_time_ms = st->ColumnInt(2);
  record.message = st->ColumnText(3);

  absl::StatusOr<SqliteStatement> secret = db_->Prepare(
      "SELECT secret FROM rendezvous_secrets WHERE job_id = ?1 AND attempt = ?2");
  if (!secret.ok()) return secret.status();
  secret->Bind(1, job_id).Bind(2, static_cast<int64_t>(attempt));
  absl::StatusOr<bool> has_secret = secret->Step();
  if (!has_secret.ok()) return has_secret.status();
  if (*has_secret) record.rendezvous_secret = secret->ColumnText(0);

  absl::StatusOr<SqliteStatement> ranks = db_->Prepare(
      "SELECT rank, worker_id, node, slot, state, exit_code, boot_id FROM rank_assignments "
      "WHERE job_id = ?1 AND attempt = ?2 ORDER BY rank");
  if (!ranks.ok()) return ranks.status();
  ranks->Bind(1, job_id).Bind(2, static_cast<int64_t>(attempt));
  while (true) {
    absl::StatusOr<bool> r = ranks->Step();
    if (!r.ok()) return r.status();
    if (!*r) break;
    RankRecord rank;
    rank.rank = static_cast<int32_t>(ranks->ColumnInt(0));
    rank.worker_id = ranks->ColumnText(1);
    rank.node = ranks->ColumnText(2);
    rank.slot = static_cast<int32_t>(ranks->ColumnInt(3));
    rank.state = static_cast<v1::RankState>(ranks->ColumnInt(4));
    rank.exit_code = static_cast<int32_t>(ranks->ColumnInt(5));
    rank.boot_id = ranks->ColumnText(6);
    record.ranks.push_back(std::move(rank));
  }
  return record;
}

absl::StatusOr<std::vector<AttemptRecord>> JobStore::ListAttempts(absl::string_view job_id) {
  absl::StatusOr<SqliteStatement> st =
      db_->Prepare("SELECT attempt FROM attempts WHERE job_id = ?1 ORDER BY attempt");
  if (!st.ok()) return st.status();
  st->Bind(1, job_id);
  std::vector<int32_t> numbers;
  while (true) {
    absl::StatusOr<bool> row = st->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    numbers.push_back(static_cast<int32_t>(st->ColumnInt(0)));
  }
  std::vector<AttemptRecord> out;
  for (int32_t n : numbers) {
    absl::StatusOr<AttemptRecord> attempt = GetAttempt(job_id, n);
    if (!attempt.ok()) return attempt.status();
    out.push_back(std::move(*attempt));
  }
  return out;
}

absl::StatusOr<std::vector<v1::Event>> JobStore::ListEvents(absl::string_view job_id, int limit) {
  std::string filter = job_id.empty() ? "" : "WHERE job_id = ?1 ";
  std::string sql = absl::StrCat(
      "SELECT id, time_ms, job_id, attempt, type, message FROM events WHERE id IN (SELECT id FROM "
      "events ", filter, "ORDER BY id DESC LIMIT ", limit > 0 ? limit : -1, ") ORDER BY id");
  absl::StatusOr<SqliteStatement> st = db_->Prepare(sql);
  if (!st.ok()) return st.status();
  if (!job_id.empty()) st->Bind(1, job_id);
  std::vector<v1::Event> out;
  while (true) {
    absl::StatusOr<bool> row = st->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    v1::Event& event = out.emplace_back();
    event.set_id(st->ColumnInt(0));
    event.set_time_ms(st->ColumnInt(1));
    event.set_job_id(st->ColumnText(2));
    event.set_attempt(static_cast<int32_t>(st->ColumnInt(3)));
    event.set_type(st->ColumnText(4));
    event.set_message(st->ColumnText(5));
  }
  return out;
}

absl::StatusOr<std::optional<std::string>> JobStore::FindSubmitRequest(
    absl::string_view owner, absl::string_view request_id) {
  absl::StatusOr<SqliteStatement> st = db_->Prepare(
      "SELECT job_id FROM submit_requests WHERE owner = ?1 AND request_id = ?2");
  if (!st.ok()) return st.status();
  st->Bind(1, owner).Bind(2, request_id);
  absl::StatusOr<bool> row = st->Step();
  if (!row.ok()) return row.status();
  if (!*row) return std::optional<std::string>();
  return std::optional<std::string>(st->ColumnText(0));
}

absl::StatusOr<ActiveState> JobStore::LoadActive() {
  ActiveState state;
  absl::StatusOr<std::vector<JobRecord>> jobs = QueryJobs(
      "WHERE state IN (?1, ?2, ?3) ORDER BY seq",
      {v1::JOB_STATE_PENDING, v1::JOB_STATE_SCHEDULED, v1::JOB_STATE_RUNNING});
  if (!jobs.ok()) return jobs.status();
  state.jobs = std::move(*jobs);
  for (const JobRecord& job : state.jobs) {
    if (job.job.state() == v1::JOB_STATE_PENDING || job.job.attempt() <= 0) continue;
    absl::StatusOr<AttemptRecord> attempt = GetAttempt(job.job.id(), job.job.attempt());
    if (!attempt.ok()) return attempt.status();
    state.attempts.push_back(std::move(*attempt));
  }
  absl::StatusOr<std::vector<WorkerRecord>> workers = ListWorkers();
  if (!workers.ok()) return workers.status();
  state.workers = std::move(*workers);
  absl::StatusOr<int64_t> last_worker_number = LastWorkerNumber();
  if (!last_worker_number.ok()) return last_worker_number.status();
  state.last_worker_number = *last_worker_number;
  absl::StatusOr<std::vector<WorkerReceipt>> receipts = ListReceipts();
  if (!receipts.ok()) return receipts.status();
  state.receipts = std::move(*receipts);
  return state;
}

absl::Status JobStore::Trim(absl::string_view table, absl::string_view job_id, int keep) {
  // Deletes everything older than the keep-th newest row of the job.
  absl::StatusOr<SqliteStatement> st = db_->Prepare(absl::StrCat(
      "DELETE FROM ", table, " WHERE job_id = ?1 AND id <= (SELECT id FROM ", table,
      " WHERE job_id = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)"));
  if (!st.ok()) return st.status();
  st->Bind(1, job_id).Bind(2, static_cast<int64_t>(keep));
  return st->Run();
}

absl::Status JobStore::PutReceipt(const WorkerReceipt& receipt) {
  absl::StatusOr<SqliteStatement> st = db_->Prepare(
      "INSERT OR REPLACE INTO worker_receipts(worker_id, boot_id, seq) VALUES(?1, ?2, ?3)");
  if (!st.ok()) return st.status();
  st->Bind(1, receipt.worker_id)
      .Bind(2, receipt.boot_id)
      .Bind(3, static_cast<int64_t>(receipt.seq));
  return st->Run();
}

absl::StatusOr<std::vector<WorkerReceipt>> JobStore::ListReceipts() {
  absl::StatusOr<SqliteStatement> st =
      db_->Prepare("SELECT worker_id, boot_id, seq FROM worker_receipts ORDER BY worker_id");
  if (!st.ok()) return st.status();
  std::vector<WorkerReceipt> out;
  while (true) {
    absl::StatusOr<bool> row = st->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    out.push_back({st->ColumnText(0), st->ColumnText(1), static_cast<uint64_t>(st->ColumnInt(2))});
  }
  return out;
}

absl::Status JobStore::PutStepMetrics(const v1::StepMetrics& metrics,
                                      const WorkerReceipt* receipt) {
  if (absl::Status s = SetDurable(false); !s.ok()) return s;
  std::string blob = metrics.SerializeAsString();
  if (absl::Status s = db_->Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<SqliteStatement> latest = db_->Prepare(
        "INSERT OR REPLACE INTO step_metrics_latest(job_id, rank, data) VALUES(?1, ?2, ?3)");
    if (!latest.ok()) return latest.status();
    latest->Bind(1, metrics.job_id()).Bind(2, static_cast<int64_t>(metrics.rank())).BindBlob(3, blob);
    if (absl::Status s = latest->Run(); !s.ok()) return s;
    absl::StatusOr<SqliteStatement> history =
        db_->Prepare("INSERT INTO step_metrics_history(job_id, data) VALUES(?1, ?2)");
    if (!history.ok()) return history.status();
    history->Bind(1, metrics.job_id()).BindBlob(2, blob);
    if (absl::Status s = history->Run(); !s.ok()) return s;
    if (receipt != nullptr) {
      if (absl::Status s = PutReceipt(*receipt); !s.ok()) return s;
    }
    int& since = metrics_since_trim_[metrics.job_id()];
    if (++since > limits_.max_metrics_history_per_job / 10) {
      since = 0;
      return Trim("step_metrics_history", metrics.job_id(), limits_.max_metrics_history_per_job);
    }
    return absl::OkStatus();
  }();
  if (status.ok()) status = db_->Exec("COMMIT");
  if (!status.ok()) (void)db_->Exec("ROLLBACK");
  return status;
}

absl::StatusOr<std::vector<v1::StepMetrics>> JobStore::LatestStepMetrics(absl::string_view job_id) {
  absl::StatusOr<SqliteStatement> st =
      db_->Prepare("SELECT data FROM step_metrics_latest WHERE job_id = ?1 ORDER BY rank");
  if (!st.ok()) return st.status();
  st->Bind(1, job_id);
  return ReadBlobRows<v1::StepMetrics>(*st, "step_metrics");
}

absl::StatusOr<std::vector<v1::StepMetrics>> JobStore::StepMetricsHistory(absl::string_view job_id,
                                                                          int limit) {
  absl::StatusOr<SqliteStatement> st = db_->Prepare(absl::StrCat(
      "SELECT data FROM step_metrics_history WHERE id IN (SELECT id FROM step_metrics_history "
      "WHERE job_id = ?1 ORDER BY id DESC LIMIT ",
      limit > 0 ? limit : -1, ") ORDER BY id"));
  if (!st.ok()) return st.status();
  st->Bind(1, job_id);
  return ReadBlobRows<v1::StepMetrics>(*st, "step_metrics");
}

absl::Status JobStore::PutRendezvousKey(absl::string_view job_id, int32_t attempt,
                                        absl::string_view key, absl::string_view value) {
  if (absl::Status s = SetDurable(false); !s.ok()) return s;
  absl::StatusOr<SqliteStatement> st = db_->Prepare(
      "INSERT OR REPLACE INTO rendezvous_keys(job_id, attempt, key, value) VALUES(?1, ?2, ?3, ?4)");
  if (!st.ok()) return st.status();
  st->Bind(1, job_id).Bind(2, static_cast<int64_t>(attempt)).Bind(3, key).BindBlob(4, value);
  return st->Run();
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> JobStore::RendezvousKeys(
    absl::string_view job_id, int32_t attempt) {
  absl::StatusOr<SqliteStatement> st = db_->Prepare(
      "SELECT key, value FROM rendezvous_keys WHERE job_id = ?1 AND attempt = ?2 ORDER BY key");
  if (!st.ok()) return st.status();
  st->Bind(1, job_id).Bind(2, static_cast<int64_t>(attempt));
  std::vector<std::pair<std::string, std::string>> out;
  while (true) {
    absl::StatusOr<bool> row = st->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    out.emplace_back(st->ColumnText(0), st->ColumnText(1));
  }
  return out;
}

absl::StatusOr<int64_t> JobStore::AppendLogs(const std::vector<v1::LogLine>& lines,
                                             const WorkerReceipt* receipt) {
  if (lines.empty()) return 0;
  int64_t first_seq = 0;
  if (absl::Status s = SetDurable(false); !s.ok()) return s;
  if (absl::Status s = db_->Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status status = [&]() -> absl::Status {
    for (const v1::LogLine& line : lines) {
      absl::StatusOr<SqliteStatement> st = db_->Prepare(
          "INSERT INTO logs(job_id, attempt, rank, time_ms, text) VALUES(?1, ?2, ?3, ?4, ?5)");
      if (!st.ok()) return st.status();
      st->Bind(1, line.job_id())
          .Bind(2, static_cast<int64_t>(line.attempt()))
          .Bind(3, static_cast<int64_t>(line.rank()))
          .Bind(4, line.time_ms())
          .Bind(5, line.text());
      if (absl::Status s = st->Run(); !s.ok()) return s;
      // One writer and AUTOINCREMENT: the rows of this transaction get consecutive ids.
      if (first_seq == 0) first_seq = db_->LastInsertRowId();
      int& since = logs_since_trim_[line.job_id()];
      if (++since > limits_.max_logs_per_job / 10) {
        since = 0;
        if (absl::Status s = Trim("logs", line.job_id(), limits_.max_logs_per_job); !s.ok()) {
          return s;
        }
      }
    }
    if (receipt != nullptr) return PutReceipt(*receipt);
    return absl::OkStatus();
  }();
  if (status.ok()) status = db_->Exec("COMMIT");
  if (!status.ok()) {
    (void)db_->Exec("ROLLBACK");
    return status;
  }
  return first_seq;
}

namespace {

// A row of "SELECT job_id, attempt, rank, time_ms, text, id FROM logs".
void ReadLogLine(SqliteStatement& st, v1::LogLine* line) {
  line->set_job_id(st.ColumnText(0));
  line->set_attempt(static_cast<int32_t>(st.ColumnInt(1)));
  line->set_rank(static_cast<int32_t>(st.ColumnInt(2)));
  line->set_time_ms(st.ColumnInt(3));
  line->set_text(st.ColumnText(4));
  line->set_seq(st.ColumnInt(5));
}

}  // namespace

absl::StatusOr<std::vector<v1::LogLine>> JobStore::ListLogs(absl::string_view job_id,
                                                            std::optional<int32_t> rank, int limit,
                                                            int64_t after_seq,
                                                            int64_t oldest_time_ms) {
  std::string filter = rank.has_value()
                           ? "WHERE job_id = ?1 AND id > ?3 AND time_ms >= ?4 AND rank = ?2 "
                           : "WHERE job_id = ?1 AND id > ?3 AND time_ms >= ?4 ";
  absl::StatusOr<SqliteStatement> st = db_->Prepare(absl::StrCat(
      "SELECT job_id, attempt, rank, time_ms, text, id FROM logs WHERE id IN (SELECT id FROM logs ",
      filter, "ORDER BY id DESC LIMIT ", limit > 0 ? limit : -1, ") ORDER BY id"));
  if (!st.ok()) return st.status();
  st->Bind(1, job_id);
  if (rank.has_value()) st->Bind(2, static_cast<int64_t>(*rank));
  st->Bind(3, after_seq);
  st->Bind(4, oldest_time_ms);
  std::vector<v1::LogLine> out;
  while (true) {
    absl::StatusOr<bool> row = st->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    v1::LogLine& line = out.emplace_back();
    ReadLogLine(*st, &line);
  }
  return out;
}

absl::StatusOr<std::vector<v1::LogLine>> JobStore::ListLogsPage(
    absl::string_view job_id, std::optional<int32_t> rank, int64_t after_seq, int64_t up_to_seq,
    int64_t oldest_time_ms, int max_lines, size_t max_bytes) {
  absl::StatusOr<SqliteStatement> st = db_->Prepare(absl::StrCat(
      "SELECT job_id, attempt, rank, time_ms, text, id FROM logs WHERE job_id = ?1 AND id > ?3 "
      "AND time_ms >= ?4 AND (?5 = 0 OR id <= ?5) ",
      rank.has_value() ? "AND rank = ?2 " : "", "ORDER BY id LIMIT ?6"));
  if (!st.ok()) return st.status();
  st->Bind(1, job_id);
  if (rank.has_value()) st->Bind(2, static_cast<int64_t>(*rank));
  st->Bind(3, after_seq);
  st->Bind(4, oldest_time_ms);
  st->Bind(5, up_to_seq);
  st->Bind(6, static_cast<int64_t>(std::max(max_lines, 1)));
  std::vector<v1::LogLine> out;
  size_t bytes = 0;
  while (out.empty() || bytes < max_bytes) {
    absl::StatusOr<bool> row = st->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    v1::LogLine& line = out.emplace_back();
    ReadLogLine(*st, &line);
    bytes += line.text().size();
  }
  return out;
}

absl::StatusOr<std::pair<int64_t, int64_t>> JobStore::LogTailStart(absl::string_view job_id,
                                                                   std::optional<int32_t> rank,
                                                                   int tail_lines,
                                                                   int64_t after_seq,
                                                                   int64_t oldest_time_ms) {
  absl::StatusOr<SqliteStatement> newest =
      db_->Prepare("SELECT COALESCE(MAX(id), 0) FROM logs WHERE job_id = ?1");
  if (!newest.ok()) return newest.status();
  newest->Bind(1, job_id);
  absl::StatusOr<bool> row = newest->Step();
  if (!row.ok()) return row.status();
  const int64_t newest_seq = *row ? newest->ColumnInt(0) : 0;
  if (tail_lines <= 0) return std::make_pair(after_seq, newest_seq);
  absl::StatusOr<SqliteStatement> st = db_->Prepare(
      absl::StrCat("SELECT id FROM logs WHERE job_id = ?1 AND id > ?3 AND time_ms >= ?4 ",
                   rank.has_value() ? "AND rank = ?2 " : "", "ORDER BY id DESC LIMIT 1 OFFSET ?5"));
  if (!st.ok()) return st.status();
  st->Bind(1, job_id);
  if (rank.has_value()) st->Bind(2, static_cast<int64_t>(*rank));
  st->Bind(3, after_seq);
  st->Bind(4, oldest_time_ms);
  st->Bind(5, static_cast<int64_t>(tail_lines) - 1);
  row = st->Step();
  if (!row.ok()) return row.status();
  // The tail_lines-th newest line: read from just before it.
  if (*row) after_seq = std::max(after_seq, st->ColumnInt(0) - 1);
  return std::make_pair(after_seq, newest_seq);
}

}  // namespace dropless::coordinator
