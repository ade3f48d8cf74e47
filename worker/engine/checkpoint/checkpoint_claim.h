// Which run of a job writes a rank's checkpoints: the attempt that started last. A worker cut off
// from the coordinator keeps its ranks running (docs/architecture.md, "Lease"), while the
// coordinator fails their attempt and starts the next one elsewhere, on the same checkpoint.dir
// when it is shared storage. Both would then write the same rank's files. So each rank records
// its (job, attempt) in the directory before its engine restores, and checks the record before
// each save: a rank whose record was replaced stops instead of writing.
#ifndef DROPLESS_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_CLAIM_H_
#define DROPLESS_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_CLAIM_H_

#include <string>

#include "absl/status/status.h"

namespace dropless::engine {

struct CheckpointClaim {
  std::string job_id;
  int attempt = 0;
  int rank = 0;
  std::string user;  // the job's owner; "" on a plaintext cluster (no users)
};

// `dir`/owner-rank-<rank>.txt: "dropless-checkpoint-owner job=<id> attempt=<n>", then, for a job
// with an owner, "user=<C-escaped name>" on a second line.
std::string CheckpointClaimPath(const std::string& dir, int rank);

// Records `claim` as the writer of its rank's checkpoints in `dir` (created when missing),
// replacing an earlier record: the attempt starting now owns them. Unless the record names a
// later attempt of the same job: FailedPrecondition, this attempt was superseded before it got
// here. Or unless it names another user: PermissionDenied, a job error (one user's job must
// neither resume from nor overwrite another's checkpoints; a record without a user, of a
// plaintext cluster or from before users, is anyone's). A damaged record (DataLoss, an empty
// file too), one over 4 KiB (InvalidArgument) or a directory in its place (FailedPrecondition)
// is not replaced: a job error naming the file, as every attempt would meet it again. The record
// is written atomically (temp file, fsync, rename), so no crash of a rank damages it: whatever
// did cannot be trusted to have left the checkpoints beside it intact, nor to say whose they are.
absl::Status ClaimCheckpoints(const std::string& dir, const CheckpointClaim& claim);

// OK while `claim` is still the record of its rank in `dir` (or none is there). Otherwise
// FailedPrecondition naming the writer since: a later attempt of the same job (this attempt is
// over: its rank stops), or another job, a job error (common/job_error.h), since the next attempt
// would take the directory back from that job, and so on. Job errors too: DataLoss when the
// record is damaged, InvalidArgument when it is over 4 KiB, FailedPrecondition when something
// other than a file is in its place.
absl::Status CheckCheckpointClaim(const std::string& dir, const CheckpointClaim& claim);

}  // namespace dropless::engine

#endif  // DROPLESS_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_CLAIM_H_
