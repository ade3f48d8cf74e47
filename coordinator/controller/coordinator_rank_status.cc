// Coordinator: what a worker says about its ranks (a queued RankStatus, or the list of a Hello or
// heartbeat), applied in memory and committed together: the statuses of one worker message, or
// consecutive RankStatus messages handled together, cost one commit with fsync. Ranks that are
// not active here are cancelled.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job_error.h"
#include "common/log.h"
#include "common/utf8.h"
#include "coordinator/controller/coordinator.h"
#include "coordinator/util/clock.h"

namespace dropless::coordinator {
namespace {

// Whether a busy slot's rank is the one `status` is about.
bool IsRankOf(const RankKey& key, const v1::RankStatus& status) {
  return key.job_id == status.job_id() && key.attempt == status.attempt() &&
         key.rank == status.rank();
}

// Marks the slot that holds `status`'s rank reported: the worker got the rank's Assignment, so
// from now on a heartbeat that does not list the rank means it ended. `slot`: where the rank was
// placed (-1: not known, every slot is looked at). Whether a slot holds it.
bool MarkRankReported(WorkerEntry& worker, const v1::RankStatus& status, int32_t slot = -1) {
  auto held = slot >= 0 ? worker.occupied.find(slot)
                        : std::find_if(worker.occupied.begin(), worker.occupied.end(),
                                       [&](const auto& s) { return IsRankOf(s.second, status); });
  if (held == worker.occupied.end() || !IsRankOf(held->second, status)) return false;
  held->second.reported = true;
  return true;
}

// "rank 0 on node n failed with exit code 1: <the worker's message>"
std::string RankEndReason(const WorkerEntry& worker, const v1::RankStatus& status) {
  std::string reason =
      status.state() == v1::RANK_STATE_FAILED
          ? absl::StrFormat("rank %d on node %s failed with exit code %d", status.rank(),
                            worker.info.node(), status.exit_code())
          : absl::StrFormat("rank %d on node %s was killed", status.rank(), worker.info.node());
  // The worker's text goes into an event and the job's message, printed by the CLI: no control
  // characters (a terminal escape, a newline forging a line), as for a Goodbye's reason.
  if (!status.message().empty()) {
    absl::StrAppend(&reason, ": ",
                    SanitizedText(status.message(), 512));
  }
  return reason;
}

// The total memory of the worker's GPU in `slot`; 0 when it does not say.
int64_t DeviceMemoryBytes(const WorkerEntry& worker, int32_t slot) {
  return slot >= 0 && slot < worker.info.device_memory_bytes_size()
             ? worker.info.device_memory_bytes(slot)
             : 0;
}

bool RanOutOfDeviceMemory(const v1::RankStatus& status) {
  return status.state() == v1::RANK_STATE_FAILED && status.exit_code() == kRankExitDeviceTooSmall;
}

}  // namespace

void Coordinator::ApplyRankStatusLocked(WorkerEntry& worker, const v1::RankStatus& status,
                                        bool from_list, RankStatusCommit& commit) {
  if (status.state() == v1::RANK_STATE_UNSPECIFIED || !v1::RankState_IsValid(status.state())) {
    return;  // says nothing
  }
  // A status that changes nothing (sent again, or older than what is known) is stored once its
  // job is: a commit that failed left the job dirty, and it is tried again with this one.
  auto stored_once_its_job_is = [&] { commit.needs_commit |= jobs_.IsDirty(status.job_id()); };
  ActiveJob* job = jobs_.FindActiveAttempt(status.job_id(), status.attempt());
  RankRecord* rank = nullptr;
  if (job != nullptr) {
    for (RankRecord& r : job->attempt->ranks) {
      if (r.rank == status.rank()) rank = &r;
    }
  }
  if (rank == nullptr || rank->worker_id != worker.info.id()) {
    commit.slot_freed |= CancelStrayRankLocked(worker, status);
    if (job == nullptr) ApplyLateRankEndLocked(worker, status, commit);
    return stored_once_its_job_is();  // e.g. the last rank's end again, its job's commit failed
  }
  MarkRankReported(worker, status, rank->slot);
  if (RankEnded(rank->state)) return stored_once_its_job_is();  // no way back from an end
  // A late or resent older report (STARTING after RUNNING).
  if (status.state() < rank->state) return stored_once_its_job_is();
  if (from_list && status.state() == rank->state) return;  // lists only move ranks forward
  rank->state = status.state();
  rank->exit_code = status.exit_code();
  if (RankEnded(status.state())) {
    worker.occupied.erase(rank->slot);
    commit.slot_freed = true;
  }

  // Committed with fsync: the worker forgets a status once acknowledged, and a restarted
  // coordinator must still know it (an end, or that the rank's daemon run got its Assignment:
  // it is never sent again).
  commit.needs_commit = true;
  StoreWrite& write = commit.write;
  v1::Job& j = job->record.job;
  jobs_.MarkDirty(*job);
  if (status.state() == v1::RANK_STATE_FAILED || status.state() == v1::RANK_STATE_KILLED) {
    std::string reason = RankEndReason(worker, status);
    // A peer whose worker went away first is the likely cause ("connection closed by peer").
    if (std::string gone = GonePeersLocked(*job, worker); !gone.empty()) {
      reason = absl::StrCat(gone, ", then ", reason);
    }
    AddEvent(write, j.id(), status.attempt(), "RankExited", reason);
    if (RanOutOfDeviceMemory(status)) {
      // Out of memory on this GPU in all: larger GPUs only, if a known worker has them.
      jobs_.FailAttemptOnTooSmallDevice(*job, reason, DeviceMemoryBytes(worker, rank->slot), write);
      return;
    }
    const bool failed = status.state() == v1::RANK_STATE_FAILED;
    const bool job_error = failed && status.exit_code() == kRankExitJobError;
    jobs_.FailAttempt(*job, reason, write, /*retry=*/!job_error);
    return;
  }
  bool all_running = true, all_succeeded = true;
  for (const RankRecord& r : job->attempt->ranks) {
    all_running &= r.state == v1::RANK_STATE_RUNNING || r.state == v1::RANK_STATE_SUCCEEDED;
    all_succeeded &= r.state == v1::RANK_STATE_SUCCEEDED;
  }
  if (all_running && j.state() == v1::JOB_STATE_SCHEDULED) {
    j.set_state(v1::JOB_STATE_RUNNING);
    job->attempt->state = v1::JOB_STATE_RUNNING;
    if (j.start_time_ms() == 0) j.set_start_time_ms(NowMs());
    AddEvent(write, j.id(), status.attempt(), "Running",
             absl::StrFormat("all %d ranks running", j.world_size()));
  }
  if (all_succeeded) {
    jobs_.EndAttempt(*job, v1::JOB_STATE_SUCCEEDED, "", write);
    jobs_.FinishJob(*job, v1::JOB_STATE_SUCCEEDED, "", write);
  }
}

void Coordinator::ApplyLateRankEndLocked(WorkerEntry& worker, const v1::RankStatus& status,
                                         RankStatusCommit& commit) {
  // A kill is the attempt's end reaching the rank (its cancellation), not news of its own. Store
  // reads are bounded per worker message as for stray ranks (a daemon sends one end a message).
  if (status.state() != v1::RANK_STATE_FAILED || stray_lookups_left_ <= 0) return;
  --stray_lookups_left_;
  std::optional<AttemptRecord> holder;
  AttemptRecord* ended = jobs_.EndedAttempt(status.job_id(), status.attempt(), &holder);
  if (ended == nullptr) return;
  // The row this batch of statuses writes already, if another late end changed it: the newest
  // (each end read from the store alone would write back only its own rank's).
  StoreWrite& write = commit.write;
  AttemptRecord* batched = nullptr;
  for (AttemptRecord& a : write.attempts) {
    if (a.job_id == status.job_id() && a.attempt == status.attempt()) batched = &a;
  }
  AttemptRecord& current = batched != nullptr ? *batched : *ended;
  RankRecord* rank = nullptr;
  bool too_small = false;  // ended as too small already (another rank's exit 79, first or late)
  for (RankRecord& r : current.ranks) {
    if (r.rank == status.rank()) rank = &r;
    too_small |= r.state == v1::RANK_STATE_FAILED && r.exit_code == kRankExitDeviceTooSmall;
  }
  // Once: the rank's end is written into the attempt's row with what it changed, and an end
  // already known (the report sent again, also after a restart) changes nothing.
  if (rank == nullptr || rank->worker_id != worker.info.id() || RankEnded(rank->state)) return;
  rank->state = status.state();
  rank->exit_code = status.exit_code();
  if (batched != nullptr && !holder.has_value()) {  // memory's copy (the next batch reads it)
    for (RankRecord& r : ended->ranks) {
      if (r.rank == status.rank()) {
        r.state = status.state();
        r.exit_code = status.exit_code();
      }
    }
  }
  commit.needs_commit = true;
  if (batched == nullptr) write.attempts.push_back(*ended);
  const std::string reason = RankEndReason(worker, status);
  AddEvent(write, status.job_id(), status.attempt(), "RankExited",
           absl::StrCat(reason, " (after attempt ", status.attempt(), " had ended)"));
  if (!RanOutOfDeviceMemory(status) || too_small) return;
  // Out of memory: while the peer's failure left the job PENDING with this attempt its latest,
  // as if the report had come first. A job it finished stays finished (its end was stored and
  // announced: watchers ended, `submit --wait` returned, the user may have submitted it again);
  // the event above tells why.
  ActiveJob* job = jobs_.Find(status.job_id());
  if (job == nullptr || job->attempt.has_value() ||
      job->record.job.state() != v1::JOB_STATE_PENDING ||
      job->record.job.attempt() != status.attempt() || ended->state != v1::JOB_STATE_FAILED) {
    return;
  }
  jobs_.MarkDirty(*job);
  jobs_.FailAttemptOnTooSmallDevice(*job, reason, DeviceMemoryBytes(worker, rank->slot), write);
}

bool Coordinator::CommitRankStatusesLocked(RankStatusCommit& commit) {
  RankStatusCommit done = std::exchange(commit, RankStatusCommit{});
  bool stored = true;
  if (done.needs_commit || !done.write.empty()) {
    // Commit fsyncs it where it stores job state (a rank's state, an attempt that failed, any
    // dirty job) and here where an attempt's row changed (a rank's end after its attempt's: it is
    // acknowledged once stored); a Hello that changed only its worker's row does without.
    done.write.durable = !done.write.attempts.empty();
    // A failed commit keeps its jobs dirty and its ended attempts and events aside (stored with
    // the next commit), and publishes nothing.
    stored = jobs_.Commit(done.write).ok();
  }
  if (done.slot_freed) {
    jobs_.RetireFinished();
    ScheduleLocked();
  }
  return stored;
}

bool Coordinator::CancelStrayRankLocked(WorkerEntry& worker, const v1::RankStatus& status) {
  auto holds = [&](const auto& slot) { return IsRankOf(slot.second, status); };
  if (RankEnded(status.state())) {
    for (auto it = worker.occupied.begin(); it != worker.occupied.end();) {
      it = holds(*it) ? worker.occupied.erase(it) : std::next(it);
    }
    return true;
  }
  // Every stray rank holds its slot until it exits, whether or not its attempt's cancellation
  // goes out this time.
  HoldStraySlotLocked(worker, status);
  if (!workers_.TakeStrayCancelTurn(worker.info.id(), status.job_id(), status.attempt(), NowMs())) {
    return false;
  }
  LogInfo(
      absl::StrFormat("%s runs rank %d of %s attempt %d, which is not active here: "
                      "cancelling it",
                      worker.info.id(), status.rank(),
                      absl::CHexEscape(TruncateUtf8(status.job_id(), 64)), status.attempt()));
  if (worker.session != nullptr) {
    v1::CoordinatorMessage message;
    v1::Cancellation* c = message.mutable_cancellation();
    c->set_job_id(status.job_id());
    c->set_attempt(status.attempt());
    c->set_reason("this attempt is not active on the coordinator");
    worker.session->Send(std::move(message));
  }
  return false;
}

void Coordinator::HoldStraySlotLocked(WorkerEntry& worker, const v1::RankStatus& status) {
  // Until it exits, the process holds its slot: find which one from the stored placement.
  if (MarkRankReported(worker, status)) return;
  // One read of the attempt serves all of its ranks in this message. Past this message's reads,
  // a rank not looked up now is looked up with a later message.
  const std::pair<std::string, int32_t> key{status.job_id(), status.attempt()};
  auto cached = stray_attempts_.find(key);
  if (cached == stray_attempts_.end()) {
    if (stray_lookups_left_ <= 0 ||
        !workers_.TakeStraySlotLookupTurn(worker.info.id(), status.job_id(), status.attempt(),
                                          status.rank(), NowMs())) {
      return;
    }
    --stray_lookups_left_;
    absl::StatusOr<AttemptRecord> read = store_->GetAttempt(status.job_id(), status.attempt());
    cached = stray_attempts_
                 .emplace(key, read.ok() ? std::optional<AttemptRecord>(*std::move(read))
                                         : std::nullopt)
                 .first;
  }
  const std::optional<AttemptRecord>& attempt = cached->second;
  if (!attempt.has_value()) return;
  // By node as well as by id: a worker forgotten while cut off (--lost-worker-expiry) comes back
  // under a new id, its old ranks still exiting on the same machine's slots.
  for (const RankRecord& r : attempt->ranks) {
    if (r.rank == status.rank() &&
        (r.worker_id == worker.info.id() || r.node == worker.info.node()) &&
        worker.occupied.count(r.slot) == 0) {
      worker.occupied[r.slot] =
          RankKey{status.job_id(), status.attempt(), status.rank(), /*reported=*/true};
    }
  }
}

void Coordinator::HandleHeartbeatLocked(WorkerEntry& worker, const v1::Heartbeat& heartbeat) {
  // The listed ranks and what the absence of one means: one commit.
  RankStatusCommit commit;
  ListedRanks alive;
  for (const v1::RankStatus& status : heartbeat.ranks()) {
    alive.insert({status.job_id(), status.attempt(), status.rank()});
    ApplyRankStatusLocked(worker, status, /*from_list=*/true, commit);
  }
  CheckProgressLocked(worker, heartbeat, commit.write);
  if (heartbeat.lists_ended_ranks()) {
    // The worker reported these ranks (STARTING goes out after a rank joins the live list, and an
    // end is queued before it leaves it), and this heartbeat was written after those reports: a
    // rank in neither list lost its end (e.g. with the worker's queue).
    ListedRanks listed = alive;
    for (const v1::RankStatus& status : heartbeat.ended_ranks()) {
      listed.insert({status.job_id(), status.attempt(), status.rank()});
    }
    commit.slot_freed |= ReconcileUnlistedRanksLocked(
        worker, listed, /*hello=*/nullptr,
        absl::StrCat("on node ", worker.info.node(),
                     " ended without a final status reaching the coordinator"),
        commit.write);
  }
  ListedRanks ended;  // their processes exited; the final statuses are on their way
  for (const v1::RankStatus& status : heartbeat.ended_ranks()) {
    ended.insert({status.job_id(), status.attempt(), status.rank()});
  }
  commit.slot_freed |= FreeSlotsOfEndedAttemptsLocked(worker, alive, &ended);
  // A heartbeat is not a queued message: a failed commit is logged and retried with the next one.
  (void)CommitRankStatusesLocked(commit);
}

bool Coordinator::FreeSlotsOfEndedAttemptsLocked(WorkerEntry& worker, const ListedRanks& alive,
                                                 const ListedRanks* ended) {
  bool freed = false;
  for (auto slot = worker.occupied.begin(); slot != worker.occupied.end();) {
    const RankKey& key = slot->second;
    const ListedRanks::value_type listed_key{key.job_id, key.attempt, key.rank};
    const bool gone = alive.count(listed_key) == 0 &&
                      (ended == nullptr || key.reported || ended->count(listed_key) != 0);
    if (gone && jobs_.FindActiveAttempt(key.job_id, key.attempt) == nullptr) {
      slot = worker.occupied.erase(slot);
      freed = true;
    } else {
      ++slot;
    }
  }
  return freed;
}

}  // namespace dropless::coordinator
