#include "worker/engine/checkpoint/checkpoint_claim.h"

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/job_error.h"
#include "worker/engine/checkpoint/file_io.h"
#include "worker/engine/checkpoint/json.h"

namespace dropless::engine {
namespace {

constexpr char kClaimTag[] = "dropless-checkpoint-owner";
constexpr uint64_t kMaxClaimBytes = 4096;

std::string ClaimText(const CheckpointClaim& claim) {
  std::string text =
      absl::StrCat(kClaimTag, " job=", claim.job_id, " attempt=", claim.attempt, "\n");
  if (!claim.user.empty()) absl::StrAppend(&text, "user=", absl::CEscape(claim.user), "\n");
  return text;
}

absl::StatusOr<CheckpointClaim> ParseClaim(const std::string& path, absl::string_view text,
                                           int rank) {
  const std::vector<absl::string_view> lines =
      absl::StrSplit(absl::StripTrailingAsciiWhitespace(text), '\n');
  const std::vector<absl::string_view> fields = absl::StrSplit(lines[0], ' ');
  CheckpointClaim claim;
  claim.rank = rank;
  absl::string_view job, attempt;
  if (fields.size() == 3 && fields[0] == kClaimTag) {
    job = fields[1];
    attempt = fields[2];
  }
  bool user_ok = lines.size() == 1;  // no user: a plaintext cluster's, or from before users
  if (lines.size() == 2) {
    absl::string_view user = lines[1];
    user_ok = absl::ConsumePrefix(&user, "user=") && absl::CUnescape(user, &claim.user) &&
              !claim.user.empty();
  }
  if (user_ok && absl::ConsumePrefix(&job, "job=") && !job.empty() &&
      absl::ConsumePrefix(&attempt, "attempt=") && absl::SimpleAtoi(attempt, &claim.attempt)) {
    claim.job_id = std::string(job);
    return claim;
  }
  // Never the torn tail of a rank's own write: the record is replaced atomically (temp file,
  // fsync, rename), so a crash leaves the previous record or the whole new one, an empty file
  // neither; whoever damaged it may have damaged the checkpoints too.
  return absl::DataLossError(absl::StrCat(
      "checkpoint: ", path,
      " is damaged, not a checkpoint owner record (ranks replace it atomically, so no crash of "
      "theirs leaves it so): check the checkpoints in checkpoint.dir, then remove it"));
}

// The record of `rank` in `dir`: NotFound when there is none; job errors, which every attempt would
// meet again in the same directory: DataLoss when damaged, InvalidArgument when larger than a
// record, FailedPrecondition when something other than a file (a directory) is in its place.
absl::StatusOr<CheckpointClaim> ReadClaim(const std::string& dir, int rank) {
  const std::string path = CheckpointClaimPath(dir, rank);
  absl::StatusOr<std::string> text = ReadSmallFile(path, kMaxClaimBytes);
  if (!text.ok()) return AsCheckpointJobError(text.status());
  absl::StatusOr<CheckpointClaim> owner = ParseClaim(path, *text, rank);
  if (!owner.ok()) return MarkJobError(owner.status());
  return owner;
}

absl::Status Superseded(const std::string& dir, const CheckpointClaim& owner,
                        const CheckpointClaim& claim) {
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint.dir ", dir, ": attempt ", owner.attempt, " of this job writes rank ", claim.rank,
      "'s checkpoints now; attempt ", claim.attempt, " stops without saving"));
}

}  // namespace

std::string CheckpointClaimPath(const std::string& dir, int rank) {
  return absl::StrCat(dir, "/owner-rank-", rank, ".txt");
}

absl::Status ClaimCheckpoints(const std::string& dir, const CheckpointClaim& claim) {
  if (absl::Status s = MakeDirectories(dir); !s.ok()) {
    return absl::IsFailedPrecondition(s) ? MarkJobError(s) : s;  // a file where dir belongs
  }
  // A later attempt of this job may have claimed the files already (this one started late). A
  // damaged record is not replaced: it cannot say whose the files are.
  absl::StatusOr<CheckpointClaim> owner = ReadClaim(dir, claim.rank);
  if (!owner.ok() && !absl::IsNotFound(owner.status())) return owner.status();
  if (owner.ok() && owner->job_id == claim.job_id && owner->attempt > claim.attempt) {
    return Superseded(dir, *owner, claim);
  }
  if (owner.ok() && !owner->user.empty() && owner->user != claim.user) {
    return MarkJobError(absl::PermissionDeniedError(absl::StrCat(
        "checkpoint.dir ", dir, " holds the checkpoints of job ",
        json::QuoteForMessage(owner->job_id), " of user ", json::QuoteForMessage(owner->user),
        "; job ", claim.job_id, " of ",
        claim.user.empty() ? std::string("no user") : absl::StrCat("user ", claim.user),
        " may neither resume from nor write them: choose another checkpoint.dir")));
  }
  AtomicFileWriter writer(CheckpointClaimPath(dir, claim.rank));
  const std::string line = ClaimText(claim);
  if (absl::Status s = writer.Open(); !s.ok()) return s;
  if (absl::Status s = writer.Append(line.data(), line.size()); !s.ok()) return s;
  return writer.Commit();
}

absl::Status CheckCheckpointClaim(const std::string& dir, const CheckpointClaim& claim) {
  absl::StatusOr<CheckpointClaim> owner = ReadClaim(dir, claim.rank);
  if (absl::IsNotFound(owner.status())) return absl::OkStatus();
  if (!owner.ok()) return owner.status();
  if (owner->job_id == claim.job_id && owner->attempt == claim.attempt) return absl::OkStatus();
  if (owner->job_id == claim.job_id) return Superseded(dir, *owner, claim);
  return MarkJobError(absl::FailedPreconditionError(
      absl::StrCat("checkpoint.dir ", dir, ": job ", json::QuoteForMessage(owner->job_id),
                   " (attempt ", owner->attempt, ") writes rank ", claim.rank,
                   "'s checkpoints now; two jobs cannot share a checkpoint.dir: choose another")));
}

}  // namespace dropless::engine
