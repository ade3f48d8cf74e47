// The step every rank of a job resumes from. Each rank commits its own checkpoint files
// (moe_checkpoint.h), so a rank killed while writing leaves the others one checkpoint ahead of it;
// their manifests keep the checkpoint before the newest, and the ranks resume from the newest step
// that all of them hold. Both engines restore through this, so the rule is written once.
#ifndef DROPLESS_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_AGREEMENT_H_
#define DROPLESS_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_AGREEMENT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/checkpoint/moe_checkpoint.h"
#include "worker/transport/communicator.h"

namespace dropless::engine {

// What one rank holds in the checkpoint directory.
struct HeldCheckpoints {
  std::vector<int64_t> steps;  // newest first; empty: none
  bool unreadable = false;     // its manifest could not be read (the rank has the error)
  // ... and that error is the job's (a damaged or foreign manifest, common/job_error.h): every
  // rank then fails with a job error, whichever rank's exit the coordinator hears first.
  bool unreadable_job_error = false;
};

// The steps of `ids` (this process's ranks) in `dir`. A manifest that cannot be read is reported
// as unreadable, with the first such error in *error, so that every rank still takes part in the
// exchange below and fails with the others.
std::vector<HeldCheckpoints> ListHeldCheckpoints(const std::string& dir,
                                                 const std::vector<MoeCheckpointIdentity>& ids,
                                                 absl::Status* error);

// Every rank's holdings, indexed by rank: `local` is ranks [first_rank, first_rank + local.size())
// and `world` (null when the local ranks are the whole job) exchanges them with the other
// processes' ranks (a collective call on every rank of `world`, whose size times local.size() is
// world_size). At most kMaxHeldSteps steps per rank take part.
inline constexpr int kMaxHeldSteps = 2;
absl::StatusOr<std::vector<HeldCheckpoints>> ExchangeHeldCheckpoints(
    Communicator* world, int world_size, int first_rank, const std::vector<HeldCheckpoints>& local);

// The step all ranks resume from, 0 for a fresh start: the newest step every rank holds. When
// no step is held by all, a fresh start if some ranks hold none and each of the others holds one
// (the job's first checkpoint, cut short on some rank); otherwise FailedPrecondition naming what
// the ranks hold (a job error, common/job_error.h). FailedPrecondition too when a rank could not
// read its manifest: `local_error` (ListHeldCheckpoints') on the ranks that could not, and a job
// error on every rank exactly when each unreadable manifest's error is one (damaged, another
// job's), so that all ranks fail alike.
absl::StatusOr<int64_t> AgreeOnCheckpointStep(const std::string& dir,
                                              const std::vector<HeldCheckpoints>& held,
                                              const absl::Status& local_error = absl::OkStatus());

// After each rank of this process read its part of the agreed checkpoint (`local`, one status per
// rank from first_rank on): OK when every rank of the job did. Otherwise every rank reaches the
// same verdict, whichever exit the coordinator hears first: a job error when each failure is one
// (damaged files, another job's), else worth a retry; a rank that failed returns its own error
// (without its job-error mark when the verdict is a retry), the others FailedPrecondition naming
// the first rank that failed. A collective call on every rank of `world` (null when the local
// ranks are the whole job). *only_damaged (when given) says, on every rank alike, whether each
// failure was a rank finding its files damaged (DataLoss): the ranks may then all go back to an
// older step they hold (RestoreAgreedStep).
absl::Status AgreeOnRestoreOutcome(Communicator* world, int world_size, int first_rank,
                                   const std::vector<absl::Status>& local, const std::string& dir,
                                   bool* only_damaged = nullptr);

// The step every rank restored: `step` when all read it (`local`: this process's ranks' reads);
// else, when the only failures were damaged files and every rank holds an older step, that step,
// read through read_again (every rank says so in its log); else the agreed failure. A collective
// call on every rank of `world`, once per step tried.
absl::StatusOr<int64_t> RestoreAgreedStep(
    Communicator* world, int world_size, int first_rank, const std::string& dir,
    const std::vector<HeldCheckpoints>& held, int64_t step, std::vector<absl::Status> local,
    const std::function<std::vector<absl::Status>(int64_t step)>& read_again);

// The newest step older than `step` that every rank holds, if any: where the ranks go back to when
// some rank's files of `step` are damaged (a write its filesystem reported durable and lost).
std::optional<int64_t> OlderCommonStep(const std::vector<HeldCheckpoints>& held, int64_t step);

}  // namespace dropless::engine

#endif  // DROPLESS_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_AGREEMENT_H_
