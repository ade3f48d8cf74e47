#include "worker/rank/rank_options.h"

#include "absl/strings/string_view.h"
#include "absl/strings/str_cat.h"

namespace dropless {

absl::Status ValidateRankOptions(const RankOptions& o) {
  auto bad = [](absl::string_view flag, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", why));
  };
  if (o.coordinator.empty()) return bad("--coordinator", "required");
  if (o.job_id.empty()) return bad("--job", "required");
  if (o.attempt < 1) return bad("--attempt", absl::StrCat("must be >= 1 (got ", o.attempt, ")"));
  if (o.world_size < 1) {
    return bad("--world-size", absl::StrCat("must be >= 1 (got ", o.world_size, ")"));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return bad("--rank", absl::StrCat("must be in 0..", o.world_size - 1, " (got ", o.rank, ")"));
  }
  if (o.slot < 0) return bad("--slot", absl::StrCat("must be >= 0 (got ", o.slot, ")"));
  if (o.spec_path.empty()) return bad("--spec", "required");
  if (o.host.empty()) return bad("--host", "required");
  if (o.report_fd < -1) return bad("--report-fd", absl::StrCat("must be >= 0 or -1 (got ", o.report_fd, ")"));
  return absl::OkStatus();
}

}  // namespace dropless
