#include "worker/engine/checkpoint/checkpoint_agreement.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job_error.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace dropless::engine {
namespace {

// Ranks [first_rank, first_rank + local_ranks) of world_size, and a way to reach the others.
absl::Status CheckLocalRanks(const Communicator* world, int world_size, int first_rank,
                             int local_ranks) {
  if (first_rank < 0 || first_rank + local_ranks > world_size ||
      (world == nullptr && local_ranks != world_size)) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ranks ", first_rank, "..",
                                                   first_rank + local_ranks - 1, " of ", world_size,
                                                   " and no way to reach the others"));
  }
  return absl::OkStatus();
}

// When some ranks failed (failed[r]; job_error[r] for those whose error is a job error), every rank
// reaches the same verdict: a job error when each failure is one (another attempt would meet them
// all again), else worth a retry. This rank returns its own error (its job-error mark dropped when
// the verdict is a retry), the others FailedPrecondition naming the first rank that failed.
absl::Status FailAlike(const std::vector<bool>& failed, const std::vector<bool>& job_error,
                       const absl::Status& local, const std::string& dir, absl::string_view what) {
  bool job = true;
  int first = -1;
  for (size_t r = 0; r < failed.size(); ++r) {
    if (!failed[r]) continue;
    job &= job_error[r];
    if (first < 0) first = static_cast<int>(r);
  }
  if (!local.ok()) return job ? local : absl::Status(local.code(), local.message());
  absl::Status error = absl::FailedPreconditionError(
      absl::StrCat("checkpoint.dir ", dir, ": rank ", first, " could not ", what,
                   job ? " (damaged, or another job's)" : ""));
  return job ? MarkJobError(error) : error;
}

}  // namespace

std::vector<HeldCheckpoints> ListHeldCheckpoints(const std::string& dir,
                                                 const std::vector<MoeCheckpointIdentity>& ids,
                                                 absl::Status* error) {
  std::vector<HeldCheckpoints> held(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    absl::StatusOr<std::vector<int64_t>> steps = MoeCheckpointSteps(dir, ids[i]);
    if (steps.ok()) {
      held[i].steps = *std::move(steps);
    } else if (!absl::IsNotFound(steps.status())) {
      held[i].unreadable = true;
      held[i].unreadable_job_error = IsJobError(steps.status());
      if (error->ok()) *error = steps.status();
    }
  }
  return held;
}

absl::StatusOr<std::vector<HeldCheckpoints>> ExchangeHeldCheckpoints(
    Communicator* world, int world_size, int first_rank,
    const std::vector<HeldCheckpoints>& local) {
  const int local_ranks = static_cast<int>(local.size());
  DROPLESS_RETURN_IF_ERROR(CheckLocalRanks(world, world_size, first_rank, local_ranks));
  // A sum over ranks where each rank fills only its own slots is an all-gather: per rank, the
  // unreadable flag (1; 2 when its error is a job error), then each step + 1 (0: no step). Exact
  // in doubles for steps below 2^53.
  constexpr int kSlots = 1 + kMaxHeldSteps;
  std::vector<double> slots(static_cast<size_t>(world_size) * kSlots, 0.0);
  for (int i = 0; i < local_ranks; ++i) {
    double* own = &slots[static_cast<size_t>(first_rank + i) * kSlots];
    own[0] = local[i].unreadable_job_error ? 2.0 : local[i].unreadable ? 1.0 : 0.0;
    const size_t n = std::min<size_t>(local[i].steps.size(), kMaxHeldSteps);
    for (size_t j = 0; j < n; ++j) own[1 + j] = static_cast<double>(local[i].steps[j]) + 1.0;
  }
  if (world != nullptr && world->size() > 1) {
    if (absl::Status s = world->AllReduceSum(slots.data(), slots.size()); !s.ok()) return s;
  }
  std::vector<HeldCheckpoints> all(world_size);
  for (int r = 0; r < world_size; ++r) {
    const double* own = &slots[static_cast<size_t>(r) * kSlots];
    all[r].unreadable = own[0] != 0.0;
    all[r].unreadable_job_error = own[0] == 2.0;
    for (int j = 0; j < kMaxHeldSteps; ++j) {
      if (own[1 + j] > 0.0) all[r].steps.push_back(static_cast<int64_t>(own[1 + j]) - 1);
    }
  }
  return all;
}

absl::StatusOr<int64_t> AgreeOnCheckpointStep(const std::string& dir,
                                              const std::vector<HeldCheckpoints>& held,
                                              const absl::Status& local_error) {
  auto describe = [&]() {
    std::vector<std::string> parts;
    for (size_t r = 0; r < held.size() && parts.size() < 8; ++r) {
      parts.push_back(absl::StrCat("rank ", r, ": ",
                                   held[r].unreadable      ? "unreadable"
                                   : held[r].steps.empty() ? "none"
                                                           : absl::StrJoin(held[r].steps, ", ")));
    }
    if (held.size() > parts.size()) parts.push_back("...");
    return absl::StrJoin(parts, "; ");
  };
  std::vector<bool> unreadable, job_error;
  for (const HeldCheckpoints& h : held) {
    unreadable.push_back(h.unreadable);
    job_error.push_back(h.unreadable_job_error);
  }
  if (!local_error.ok() ||
      std::find(unreadable.begin(), unreadable.end(), true) != unreadable.end()) {
    return FailAlike(unreadable, job_error, local_error, dir, "read its checkpoint manifest");
  }
  if (held.empty()) return 0;
  // The newest step every rank holds.
  for (int64_t candidate : held[0].steps) {
    bool everywhere = true;
    for (const HeldCheckpoints& h : held) {
      everywhere &= std::find(h.steps.begin(), h.steps.end(), candidate) != h.steps.end();
    }
    if (everywhere) return candidate;
  }
  bool some_none = false, others_one = true, any = false;
  for (const HeldCheckpoints& h : held) {
    some_none |= h.steps.empty();
    any |= !h.steps.empty();
    others_one &= h.steps.size() <= 1;
  }
  if (!any || (some_none && others_one)) return 0;
  return MarkJobError(absl::FailedPreconditionError(absl::StrCat(
      "checkpoint.dir ", dir, ": the ranks hold no checkpoint step in common (", describe(), ")")));
}

std::optional<int64_t> OlderCommonStep(const std::vector<HeldCheckpoints>& held, int64_t step) {
  std::optional<int64_t> older;
  if (held.empty()) return older;
  for (int64_t candidate : held[0].steps) {
    if (candidate <= 0 || candidate >= step || (older && candidate <= *older)) continue;
    bool everywhere = true;
    for (const HeldCheckpoints& h : held) {
      everywhere &= std::find(h.steps.begin(), h.steps.end(), candidate) != h.steps.end();
    }
    if (everywhere) older = candidate;
  }
  return older;
}

absl::Status AgreeOnRestoreOutcome(Communicator* world, int world_size, int first_rank,
                                   const std::vector<absl::Status>& local, const std::string& dir,
                                   bool* only_damaged) {
  const int local_ranks = static_cast<int>(local.size());
  DROPLESS_RETURN_IF_ERROR(CheckLocalRanks(world, world_size, first_rank, local_ranks));
  // Per rank (each fills its own slot): 0 read, 1 failed, 2 failed with a job error, 3 found its
  // files damaged (DataLoss, a job error too).
  constexpr double kRead = 0, kFailed = 1, kJobError = 2, kDamaged = 3;
  std::vector<double> outcome(static_cast<size_t>(world_size), kRead);
  for (int i = 0; i < local_ranks; ++i) {
    const absl::Status& s = local[i];
    outcome[first_rank + i] = s.ok()                ? kRead
                              : !IsJobError(s)      ? kFailed
                              : absl::IsDataLoss(s) ? kDamaged
                                                    : kJobError;
  }
  if (world != nullptr && world->size() > 1) {
    if (absl::Status s = world->AllReduceSum(outcome.data(), outcome.size()); !s.ok()) return s;
  }
  bool all_read = true, damaged = true;
  for (double o : outcome) {
    all_read &= o == kRead;
    damaged &= o == kRead || o == kDamaged;
  }
  if (only_damaged != nullptr) *only_damaged = !all_read && damaged;
  if (all_read) return absl::OkStatus();
  std::vector<bool> failed, job_error;
  for (double o : outcome) {
    failed.push_back(o != kRead);
    job_error.push_back(o == kJobError || o == kDamaged);
  }
  absl::Status mine;
  for (const absl::Status& s : local) mine.Update(s);
  return FailAlike(failed, job_error, mine, dir, "restore its checkpoint");
}

absl::StatusOr<int64_t> RestoreAgreedStep(
    Communicator* world, int world_size, int first_rank, const std::string& dir,
    const std::vector<HeldCheckpoints>& held, int64_t step, std::vector<absl::Status> local,
    const std::function<std::vector<absl::Status>(int64_t step)>& read_again) {
  while (step > 0) {
    bool only_damaged = false;
    const absl::Status outcome =
        AgreeOnRestoreOutcome(world, world_size, first_rank, local, dir, &only_damaged);
    if (outcome.ok()) return step;
    const std::optional<int64_t> older = OlderCommonStep(held, step);
    if (!only_damaged || !older) return outcome;
    LogWarning(absl::StrFormat("rank %d: %s; every rank resumes from step %d instead", first_rank,
                               outcome.message(), *older));
    step = *older;
    local = read_again(step);
  }
  return step;
}

}  // namespace dropless::engine
