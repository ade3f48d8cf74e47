// JobStore: the workers' rows. Schema version 5 added workers.lost_since_ms, since when a LOST
// worker has been away, so that --lost-worker-expiry counts across coordinator restarts; a
// forgotten worker's row and receipt are deleted, and the highest worker number given is kept in
// store_counters so that its id is never given to another node.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/store/job_store.h"
#include "coordinator/store/proto_rows.h"

namespace dropless::coordinator {
namespace {

constexpr absl::string_view kLastWorkerNumberCounter = "last_worker_number";

}  // namespace

absl::Status JobStore::MigrateToWorkerLostSince() {
  // Rows of an older file get 0 ("not known"): the coordinator counts their absence from the
  // start that upgrades the file (WorkerRegistry::Restore), so an upgrade forgets nobody at once.
  return InTransaction(*db_, [&] {
    if (absl::Status s =
            db_->Exec("ALTER TABLE workers ADD COLUMN lost_since_ms INTEGER NOT NULL DEFAULT 0");
        !s.ok()) {
      return s;
    }
    return db_->Exec("PRAGMA user_version=5");
  });
}

absl::Status JobStore::WriteWorker(const WorkerRecord& worker) {
  absl::StatusOr<SqliteStatement> st = db_->Prepare(
      "INSERT OR REPLACE INTO workers(id, node, state, data, lost_since_ms) "
      "VALUES(?1, ?2, ?3, ?4, ?5)");
  if (!st.ok()) return st.status();
  st->Bind(1, worker.info.id())
      .Bind(2, worker.info.node())
      .Bind(3, static_cast<int64_t>(worker.info.state()))
      .BindBlob(4, worker.info.SerializeAsString())
      .Bind(5, worker.lost_since_ms);
  return st->Run();
}

absl::Status JobStore::DeleteWorker(const std::string& worker_id) {
  for (const char* sql :
       {"DELETE FROM workers WHERE id = ?1", "DELETE FROM worker_receipts WHERE worker_id = ?1"}) {
    absl::StatusOr<SqliteStatement> st = db_->Prepare(sql);
    if (!st.ok()) return st.status();
    st->Bind(1, worker_id);
    if (absl::Status s = st->Run(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status JobStore::RaiseLastWorkerNumber(int64_t number) {
  absl::StatusOr<SqliteStatement> st = db_->Prepare(
      "INSERT INTO store_counters(name, value) VALUES(?1, ?2) "
      "ON CONFLICT(name) DO UPDATE SET value = MAX(value, excluded.value)");
  if (!st.ok()) return st.status();
  st->Bind(1, kLastWorkerNumberCounter).Bind(2, number);
  return st->Run();
}

absl::StatusOr<int64_t> JobStore::LastWorkerNumber() {
  absl::StatusOr<SqliteStatement> st =
      db_->Prepare("SELECT value FROM store_counters WHERE name = ?1");
  if (!st.ok()) return st.status();
  st->Bind(1, kLastWorkerNumberCounter);
  absl::StatusOr<bool> row = st->Step();
  if (!row.ok()) return row.status();
  return *row ? st->ColumnInt(0) : 0;
}

absl::StatusOr<std::vector<WorkerRecord>> JobStore::ListWorkers() {
  absl::StatusOr<SqliteStatement> st =
      db_->Prepare("SELECT data, lost_since_ms FROM workers ORDER BY id");
  if (!st.ok()) return st.status();
  std::vector<WorkerRecord> out;
  while (true) {
    absl::StatusOr<bool> row = st->Step();
    if (!row.ok()) return row.status();
    if (!*row) return out;
    WorkerRecord& worker = out.emplace_back();
    if (absl::Status s = ParseBlob(st->ColumnText(0), &worker.info, "workers"); !s.ok()) return s;
    worker.lost_since_ms = st->ColumnInt(1);
  }
}

}  // namespace dropless::coordinator
