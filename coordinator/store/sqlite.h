// A small RAII layer over the SQLite C API: a connection and a prepared statement whose errors are
// absl::Status values naming the SQL that failed. Only what JobStore needs.
#ifndef DROPLESS_COORDINATOR_STORE_SQLITE_H_
#define DROPLESS_COORDINATOR_STORE_SQLITE_H_

#include <cstdint>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct sqlite3;
struct sqlite3_stmt;

namespace dropless::coordinator {

class SqliteStatement;

// One connection. Not thread-safe: the owner serializes access.
class SqliteDb {
 public:
  static absl::StatusOr<std::unique_ptr<SqliteDb>> Open(const std::string& path);
  ~SqliteDb();
  SqliteDb(const SqliteDb&) = delete;
  SqliteDb& operator=(const SqliteDb&) = delete;

  // Runs one or more statements that return no rows we need.
  absl::Status Exec(absl::string_view sql);
  absl::StatusOr<SqliteStatement> Prepare(absl::string_view sql);
  int64_t LastInsertRowId() const;
  // Rows the last INSERT, UPDATE or DELETE statement changed.
  int64_t Changes() const;

  // Status for a failed SQLite call: the code's name, the connection's message and what we did.
  absl::Status Error(int rc, absl::string_view what) const;

 private:
  explicit SqliteDb(sqlite3* db) : db_(db) {}
  sqlite3* db_;
};

// A prepared statement. Bind parameters are 1-based, columns 0-based (SQLite's convention).
class SqliteStatement {
 public:
  SqliteStatement(SqliteStatement&& other) noexcept;
  SqliteStatement& operator=(SqliteStatement&&) = delete;
  SqliteStatement(const SqliteStatement&) = delete;
  ~SqliteStatement();

  SqliteStatement& Bind(int index, int64_t value);
  SqliteStatement& Bind(int index, absl::string_view text);
  SqliteStatement& BindBlob(int index, absl::string_view bytes);
  SqliteStatement& BindNull(int index);

  // True while a row is available; false when done. A bind error is reported here.
  absl::StatusOr<bool> Step();
  // Steps a statement that returns no rows.
  absl::Status Run();

  int64_t ColumnInt(int column) const;
  std::string ColumnText(int column) const;
  bool ColumnIsNull(int column) const;

 private:
  friend class SqliteDb;
  SqliteStatement(const SqliteDb* db, sqlite3_stmt* stmt, std::string sql)
      : db_(db), stmt_(stmt), sql_(std::move(sql)) {}
  void NoteBind(int rc);

  const SqliteDb* db_;
  sqlite3_stmt* stmt_;
  std::string sql_;
  int bind_error_ = 0;  // first failed bind; Step reports it
};

// Runs `body` (returning absl::Status) inside BEGIN IMMEDIATE ... COMMIT, rolling back on any
// error; the body's error is the one returned.
template <typename Body>
absl::Status InTransaction(SqliteDb& db, Body body) {
  if (absl::Status s = db.Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status status = body();
  if (status.ok()) status = db.Exec("COMMIT");
  if (!status.ok()) (void)db.Exec("ROLLBACK");  // the original error is the one worth reporting
  return status;
}

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_STORE_SQLITE_H_
