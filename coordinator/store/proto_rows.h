// Internal to the job store: protos kept as serialized blobs in SQLite columns.
#ifndef DROPLESS_COORDINATOR_STORE_PROTO_ROWS_H_
#define DROPLESS_COORDINATOR_STORE_PROTO_ROWS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "coordinator/store/sqlite.h"

namespace dropless::coordinator {

template <typename Proto>
absl::Status ParseBlob(const std::string& bytes, Proto* out, absl::string_view what) {
  if (!out->ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("corrupt ", what, " row in the job store"));
  }
  return absl::OkStatus();
}

// Every row of a statement whose first column is a `Proto` blob, in row order.
template <typename Proto>
absl::StatusOr<std::vector<Proto>> ReadBlobRows(SqliteStatement& st, absl::string_view what) {
  std::vector<Proto> out;
  while (true) {
    absl::StatusOr<bool> row = st.Step();
    if (!row.ok()) return row.status();
    if (!*row) return out;
    if (absl::Status s = ParseBlob(st.ColumnText(0), &out.emplace_back(), what); !s.ok()) {
      return s;
    }
  }
}

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_STORE_PROTO_ROWS_H_
