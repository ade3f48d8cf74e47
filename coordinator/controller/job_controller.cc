#include "coordinator/controller/job_controller.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/byte_text.h"
#include "common/log.h"
#include "coordinator/controller/job_events.h"
#include "coordinator/util/clock.h"

namespace dropless::coordinator {
namespace {

// 128 bits from the OS's random source, in hex.
std::string NewRendezvousSecret() {
  std::random_device rd;
  return absl::StrFormat("%08x%08x%08x%08x", rd(), rd(), rd(), rd());
}

// "node-a[0,1] node-b[0]"
std::string DescribePlacement(const std::vector<RankSlot>& ranks) {
  std::vector<std::pair<std::string, std::vector<int32_t>>> by_node;
  for (const RankSlot& r : ranks) {
    if (by_node.empty() || by_node.back().first != r.node) by_node.push_back({r.node, {}});
    by_node.back().second.push_back(r.slot);
  }
  std::vector<std::string> parts;
  for (const auto& [node, slots] : by_node) {
    parts.push_back(absl::StrCat(node, "[", absl::StrJoin(slots, ","), "]"));
  }
  return absl::StrJoin(parts, " ");
}

// Why a job that ran out of memory on GPUs of `above` bytes ends: no worker the coordinator
// knows could hold its gang on larger ones. The one wording of FailAttemptOnTooSmallDevice and of
// FailJobsWaitingForMissingDevices.
std::string NoLargerDevicesReason(const v1::Job& j, int64_t above) {
  return absl::StrFormat(
      "not retried: no known %s worker has %d GPU(s) with more than %s%s (submit it again once "
      "one has joined)",
      j.backend(), j.world_size(), GibText(above),
      GangNeedsOneNode(j.backend()) ? " on one node" : "");
}

// Why a job ends whose rank reported a problem of the job itself in attempt `number`.
std::string JobErrorMessage(int32_t number, const std::string& reason) {
  return absl::StrFormat(
      "attempt %d failed: %s; not retried: a problem of the job itself, which another attempt "
      "would meet again",
      number, reason);
}

}  // namespace

bool RankEnded(v1::RankState state) {
  return state == v1::RANK_STATE_SUCCEEDED || state == v1::RANK_STATE_FAILED ||
         state == v1::RANK_STATE_KILLED;
}

absl::Status JobController::Commit(StoreWrite& write, IfNotStored if_not_stored) {
  // Kept should this commit fail: what `write` brings besides the dirty jobs (callers add no job
  // rows and, but for a submit, which is forgotten, no submit requests).
  StoreWrite kept;
  if (if_not_stored == IfNotStored::kStoreWithNextCommit) {
    kept.attempts = write.attempts;
    kept.workers = write.workers;
    kept.forgotten_workers = write.forgotten_workers;
    kept.last_worker_number = write.last_worker_number;
    kept.events = write.events;
  }
  if (!unstored_.empty()) {
    // Earlier changes first: an ended attempt's row and a worker's row are upserts that the
    // newer rows of this write replace, and events keep the order they happened in.
    unstored_.PrependTo(write);
    write.durable = true;  // ended attempts, accepted state
  }
  // A job's state is stored with fsync whoever commits it: a queued RankStatus whose commit
  // failed is acknowledged when it comes again once its job is not dirty any more.
  if (!dirty_.empty()) write.durable = true;
  for (const std::string& id : dirty_) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    write.jobs.push_back(it->second.record);
    if (it->second.attempt.has_value()) write.attempts.push_back(*it->second.attempt);
  }
  absl::Status status = store_.Commit(write);
  const absl::Time now = absl::Now();
  if (status.ok()) {
    dirty_.clear();
    unstored_.Clear();
    unstored_retry_.Succeeded();
    if (!write.empty()) {
      if (metrics_ != nullptr) metrics_->CountStoreCommit(write.durable);
      if (auto line = commit_failure_log_.Succeeded(now)) LogInfo(*line);
    }
    Publish(write);
  } else {
    // Job rows are whole-record upserts: keeping them dirty makes the next commit store their
    // latest state, so memory and store meet again once the store recovers (e.g. disk freed).
    // What only this write says (an attempt that ended, events) waits in unstored_.
    unstored_.Keep(std::move(kept.attempts), std::move(kept.workers), std::move(kept.events));
    unstored_.KeepForgotten(kept.forgotten_workers, kept.last_worker_number);
    unstored_retry_.Failed(now);
    if (metrics_ != nullptr) metrics_->CountStoreCommitFailure();
    if (auto line = commit_failure_log_.Failed(
            absl::StrCat(status.ToString(), "; retried with the next commit"), now)) {
      LogError(*line);
    }
  }
  // What is queued here goes out whether or not the commit succeeded (an Assignment of a new
  // placement is not queued here: Schedule sends it only once stored). A Cancellation only stops
  // processes, and stopping is safe whatever the store holds: ranks that the store still shows
  // running end, and their ends (queued on the worker until stored) fail that attempt by the
  // ordinary path after a restart, retried per max_attempts; held back, it would leave the ranks
  // running (a failed rank's peers hung in a collective) for as long as the store fails, and a
  // restart meanwhile would forget it. A resent Assignment names a placement that was loaded
  // from the store.
  for (auto& [worker_id, message] : pending_sends_) workers_.Send(worker_id, std::move(message));
  pending_sends_.clear();
  return status;
}

absl::Status JobController::StoreIfDirty(const std::string& job_id) {
  if (!IsDirty(job_id)) return absl::OkStatus();
  StoreWrite write;
  return Commit(write);
}

void JobController::StoreUnstored() {
  const absl::Time now = absl::Now();
  // Said once a success has lasted (a failure since resets it).
  if (auto line = commit_failure_log_.Recovered(now)) LogInfo(*line);
  if (auto line = undone_placement_log_.Recovered(now)) LogInfo(*line);
  if (dirty_.empty() && unstored_.empty()) return;
  if (!unstored_retry_.Due(now)) return;  // the store keeps failing: tried less often
  StoreWrite write;
  (void)Commit(write);  // a failure is counted and logged there
}

void JobController::Schedule() {
  // While the store keeps failing, a pass waits for the retry's turn (StoreUnstored's back-off):
  // its commit would fail as the last one did, and its placements would be undone again, every
  // tick. Otherwise (no failure since the last success) it is always due.
  if (!unstored_retry_.Due(absl::Now())) return;
  std::vector<QueuedJob> queue;
  for (const auto& [id, job] : jobs_) {
    const v1::Job& j = job.record.job;
    if (j.state() != v1::JOB_STATE_PENDING) continue;
    queue.push_back(QueuedJob{id, j.priority(), job.record.seq, j.backend(), j.world_size(),
                              j.needs_device_memory_above_bytes()});
  }
  if (queue.empty()) return;
  SchedulePlan plan = PlanSchedule(std::move(queue), workers_.Capacity(NowMs()));
  StoreWrite write;
  write.durable = !plan.placements.empty();
  std::vector<UnstoredPlacement> placed;
  for (const JobPlacement& placement : plan.placements) {
    ActiveJob& job = jobs_.at(placement.job_id);
    placed.push_back(
        UnstoredPlacement{&job, job.record, job.waiting_reason, IsDirty(placement.job_id)});
    Place(job, placement, write);
  }
  std::vector<ActiveJob*> said_waiting;
  for (const WaitingJob& waiting : plan.waiting) {
    ActiveJob& job = jobs_.at(waiting.job_id);
    if (job.waiting_reason == waiting.reason) continue;  // said already
    job.waiting_reason = waiting.reason;
    said_waiting.push_back(&job);
    AddEvent(write, waiting.job_id, job.record.job.attempt(), "Waiting", waiting.reason);
  }
  if (write.empty() && dirty_.empty() && unstored_.empty()) return;
  if (absl::Status committed = Commit(write, IfNotStored::kForget); !committed.ok()) {
    // Logged there. A placement goes no further than memory: undone, its job waits (PENDING, its
    // slots free) for the next pass, which places it again once the store takes it. Nothing of
    // the write is kept or published (what earlier failed commits kept stays kept), and the
    // Waiting events are said again.
    for (const UnstoredPlacement& p : placed) UndoPlacement(p);
    for (ActiveJob* job : said_waiting) job->waiting_reason.clear();
    return;
  }
  if (!placed.empty()) {
    if (auto line = undone_placement_log_.Succeeded(absl::Now())) LogInfo(*line);
  }
  for (const UnstoredPlacement& p : placed) AnnouncePlacement(*p.job);
}

void JobController::UndoPlacement(const UnstoredPlacement& placement) {
  ActiveJob& job = *placement.job;
  const AttemptRecord& attempt = *job.attempt;
  if (auto line = undone_placement_log_.Failed(
          absl::StrFormat("job %s attempt %d undone, the job waits to be placed again",
                          attempt.job_id, attempt.attempt),
          absl::Now())) {
    LogWarning(*line);
  }
  for (const RankRecord& r : attempt.ranks) {
    WorkerEntry* worker = workers_.Find(r.worker_id);
    if (worker == nullptr) continue;
    auto slot = worker->occupied.find(r.slot);
    if (slot != worker->occupied.end() && slot->second.job_id == attempt.job_id &&
        slot->second.attempt == attempt.attempt) {
      worker->occupied.erase(slot);
    }
  }
  rendezvous_.Close(attempt.job_id, attempt.attempt);
  job.attempt.reset();
  job.record = placement.record;
  job.waiting_reason = placement.waiting_reason;
  if (!placement.was_dirty) dirty_.erase(job.record.job.id());
}

void JobController::AnnouncePlacement(const ActiveJob& job) {
  const v1::Job& j = job.record.job;
  const AttemptRecord& attempt = *job.attempt;
  std::vector<RankSlot> slots;
  std::set<std::string> placed_on;  // workers
  for (const RankRecord& r : attempt.ranks) {
    slots.push_back(RankSlot{r.rank, r.worker_id, r.node, r.slot});
    placed_on.insert(r.worker_id);
  }
  LogInfo(absl::StrFormat("job %s attempt %d placed on %s", j.id(), attempt.attempt,
                          DescribePlacement(slots)));
  if (metrics_ != nullptr) {
    double waited =
        static_cast<double>(attempt.create_time_ms - job.record.queued_time_ms) / 1000.0;
    metrics_->ObserveSchedulingLatency(waited);
    metrics_->ObservePending(waited);
  }
  for (const std::string& worker_id : placed_on) {
    workers_.Send(worker_id, AssignmentFor(job, worker_id));
  }
}

void JobController::Place(ActiveJob& job, const JobPlacement& placement, StoreWrite& write) {
  const int64_t now = NowMs();
  v1::Job& j = job.record.job;
  AttemptRecord attempt;
  attempt.job_id = j.id();
  attempt.attempt = j.attempt() + 1;
  attempt.state = v1::JOB_STATE_SCHEDULED;
  attempt.create_time_ms = now;
  attempt.rendezvous_secret = NewRendezvousSecret();
  j.set_state(v1::JOB_STATE_SCHEDULED);
  j.set_attempt(attempt.attempt);
  j.clear_placement();
  j.clear_message();
  for (const RankSlot& r : placement.ranks) {
    WorkerEntry* worker = workers_.Find(r.worker_id);
    attempt.ranks.push_back(RankRecord{r.rank, r.worker_id, r.node, r.slot,
                                       v1::RANK_STATE_UNSPECIFIED, 0, worker->boot_id});
    v1::RankPlacement* p = j.add_placement();
    p->set_rank(r.rank);
    p->set_worker_id(r.worker_id);
    p->set_node(r.node);
    p->set_slot(r.slot);
    worker->occupied[r.slot] = RankKey{j.id(), attempt.attempt, r.rank};
  }
  job.waiting_reason.clear();
  rendezvous_.Open(j.id(), attempt.attempt, attempt.rendezvous_secret);
  AddEvent(write, j.id(), attempt.attempt, "Scheduled",
           absl::StrFormat("attempt %d: %d ranks on %s", attempt.attempt, j.world_size(),
                           DescribePlacement(placement.ranks)));
  job.attempt = std::move(attempt);
  MarkDirty(job);
}

v1::CoordinatorMessage JobController::AssignmentFor(const ActiveJob& job,
                                                    const std::string& worker_id) {
  const v1::Job& j = job.record.job;
  const AttemptRecord& attempt = *job.attempt;
  v1::CoordinatorMessage message;
  v1::Assignment* a = message.mutable_assignment();
  a->set_job_id(j.id());
  a->set_attempt(attempt.attempt);
  a->set_spec_yaml(j.spec_yaml());
  a->set_world_size(j.world_size());
  for (const RankRecord& r : attempt.ranks) {
    if (r.worker_id != worker_id) continue;
    v1::RankAssignment* mine = a->add_ranks();
    mine->set_rank(r.rank);
    mine->set_slot(r.slot);
  }
  *a->mutable_placement() = j.placement();
  a->set_rendezvous_secret(attempt.rendezvous_secret);
  a->set_owner(j.owner());
  return message;
}

void JobController::ResendAssignment(const ActiveJob& job, const std::string& worker_id,
                                     const std::string& why, StoreWrite& write) {
  const AttemptRecord& attempt = *job.attempt;
  AddEvent(write, attempt.job_id, attempt.attempt, "AssignmentResent", why);
  LogInfo(absl::StrFormat("job %s attempt %d: %s", attempt.job_id, attempt.attempt, why));
  pending_sends_.emplace_back(worker_id, AssignmentFor(job, worker_id));
}

void JobController::SendCancellations(const AttemptRecord& attempt, const std::string& reason) {
  std::set<std::string> notified;
  for (const RankRecord& rank : attempt.ranks) {
    if (RankEnded(rank.state) || !notified.insert(rank.worker_id).second) continue;
    v1::CoordinatorMessage message;
    v1::Cancellation* c = message.mutable_cancellation();
    c->set_job_id(attempt.job_id);
    c->set_attempt(attempt.attempt);
    c->set_reason(reason);
    pending_sends_.emplace_back(rank.worker_id, std::move(message));
  }
}

void JobController::EndAttempt(ActiveJob& job, v1::JobState state, const std::string& message,
                               StoreWrite& write) {
  AttemptRecord& attempt = *job.attempt;
  attempt.state = state;
  attempt.end_time_ms = NowMs();
  attempt.message = message;
  if (state != v1::JOB_STATE_SUCCEEDED) SendCancellations(attempt, message);
  rendezvous_.Close(attempt.job_id, attempt.attempt);
  write.attempts.push_back(attempt);
  job.ended_attempt = std::move(job.attempt);
  job.attempt.reset();
  MarkDirty(job);
}

void JobController::FailAttempt(ActiveJob& job, const std::string& reason, StoreWrite& write,
                                bool retry) {
  v1::Job& j = job.record.job;
  const int32_t number = EndFailedAttempt(job, reason, write);
  if (!retry) {
    FinishJob(job, v1::JOB_STATE_FAILED, JobErrorMessage(number, reason), write);
    return;
  }
  // Attempts that ran out of memory on a GPU too small do not count (FailAttemptOnTooSmallDevice).
  const int32_t counted = number - j.uncounted_attempts();
  const std::string of_max =
      j.uncounted_attempts() == 0
          ? absl::StrFormat("attempt %d of %d", number, job.record.max_attempts)
          : absl::StrFormat("attempt %d (%d of %d counted)", number, counted,
                            job.record.max_attempts);
  if (counted < job.record.max_attempts) {
    Requeue(job, number, reason,
            absl::StrFormat("%s failed; queued for attempt %d", of_max, number + 1), write);
    return;
  }
  FinishJob(job, v1::JOB_STATE_FAILED, absl::StrFormat("%s failed: %s", of_max, reason), write);
}

void JobController::FailAttemptOnTooSmallDevice(ActiveJob& job, const std::string& reason,
                                                int64_t device_memory_bytes, StoreWrite& write) {
  v1::Job& j = job.record.job;
  const bool ended = !job.attempt.has_value();  // by a peer's failure, which counted it
  if (ended && j.state() != v1::JOB_STATE_PENDING) return;
  const int32_t number = ended ? j.attempt() : EndFailedAttempt(job, reason, write);
  if (device_memory_bytes <= 0) {  // a worker that does not say: nothing to place by
    StopJob(job, v1::JOB_STATE_FAILED, JobErrorMessage(number, reason), write);
    return;
  }
  const int64_t above = std::max(j.needs_device_memory_above_bytes(), device_memory_bytes);
  j.set_needs_device_memory_above_bytes(above);
  // Workers that are away for now (LOST: a restart, a lease blip) count: the job waits for them.
  if (!GangFitsCapacity(j.world_size(), j.backend(), above, workers_.KnownCapacity())) {
    StopJob(job, v1::JOB_STATE_FAILED,
            absl::StrFormat("attempt %d failed: %s; %s", number, reason,
                            NoLargerDevicesReason(j, above)),
            write);
    return;
  }
  j.set_uncounted_attempts(j.uncounted_attempts() + 1);
  Requeue(job, number, reason,
          absl::StrFormat("attempt %d ran out of memory on a GPU of %s; queued for attempt %d "
                          "on GPUs with more memory (not counted against max_attempts)",
                          number, GibText(above), number + 1),
          write);
}

int JobController::FailJobsWaitingForMissingDevices(StoreWrite& write) {
  int failed = 0;
  std::vector<NodeCapacity> known;
  bool known_read = false;
  for (auto& [id, job] : jobs_) {
    v1::Job& j = job.record.job;
    const int64_t above = j.needs_device_memory_above_bytes();
    if (j.state() != v1::JOB_STATE_PENDING || above <= 0) continue;
    if (!known_read) {
      known = workers_.KnownCapacity();
      known_read = true;
    }
    if (GangFitsCapacity(j.world_size(), j.backend(), above, known)) continue;
    // Requeue left "attempt N failed: <why>" (the attempt that ran out of memory): the message
    // ends as FailAttemptOnTooSmallDevice's would have, had those workers been gone then.
    const std::string failed_attempt =
        j.message().empty() ? absl::StrFormat("attempt %d ran out of memory on a GPU of %s",
                                              j.attempt(), GibText(above))
                            : j.message();
    StopJob(job, v1::JOB_STATE_FAILED,
            absl::StrCat(failed_attempt, "; ", NoLargerDevicesReason(j, above)), write);
    ++failed;
  }
  return failed;
}

int32_t JobController::EndFailedAttempt(ActiveJob& job, const std::string& reason,
                                        StoreWrite& write) {
  const v1::Job& j = job.record.job;
  const int32_t number = j.attempt();
  EndAttempt(job, v1::JOB_STATE_FAILED, reason, write);
  AddEvent(write, j.id(), number, "AttemptFailed", reason);
  LogWarning(absl::StrFormat("job %s attempt %d failed: %s", j.id(), number, reason));
  return number;
}

void JobController::Requeue(ActiveJob& job, int32_t number, const std::string& reason,
                            const std::string& event, StoreWrite& write) {
  v1::Job& j = job.record.job;
  j.set_state(v1::JOB_STATE_PENDING);
  j.clear_placement();
  j.set_message(absl::StrCat("attempt ", number, " failed: ", reason));
  job.record.queued_time_ms = NowMs();
  job.waiting_reason.clear();
  AddEvent(write, j.id(), number, "Retrying", event);
  MarkDirty(job);
}

void JobController::FinishJob(ActiveJob& job, v1::JobState state, const std::string& message,
                              StoreWrite& write) {
  v1::Job& j = job.record.job;
  j.set_state(state);
  j.set_end_time_ms(NowMs());
  j.set_message(message);
  std::string type = state == v1::JOB_STATE_SUCCEEDED ? "Succeeded"
                     : state == v1::JOB_STATE_FAILED  ? "Failed"
                                                      : "Cancelled";
  AddEvent(write, j.id(), j.attempt(), type,
           message.empty()
               ? absl::StrFormat("all %d ranks finished %d steps", j.world_size(), j.steps())
               : message);
  if (metrics_ != nullptr) metrics_->CountJobFinished(state);
  LogInfo(absl::StrFormat("job %s %s%s", j.id(), JobStateName(state),
                          message.empty() ? "" : absl::StrCat(": ", message)));
  MarkDirty(job);
}

void JobController::Publish(const StoreWrite& write) {
  for (const v1::Event& event : write.events) {
    if (event.job_id().empty()) continue;
    auto it = jobs_.find(event.job_id());
    if (it == jobs_.end() || !hub_.Watched(event.job_id())) continue;
    v1::JobUpdate update;
    *update.mutable_job() = it->second.record.job;
    *update.mutable_event() = event;
    hub_.Publish(event.job_id(), std::move(update));
  }
}

void JobController::StopJob(ActiveJob& job, v1::JobState state, const std::string& message,
                            StoreWrite& write) {
  if (job.record.job.state() == v1::JOB_STATE_PENDING && metrics_ != nullptr) {
    metrics_->ObservePending(static_cast<double>(NowMs() - job.record.queued_time_ms) / 1000.0);
  }
  if (job.attempt.has_value()) EndAttempt(job, state, message, write);
  FinishJob(job, state, message, write);
}

void JobController::EnforceTimeLimits(int64_t now_ms) {
  StoreWrite write;
  bool stopped = false;
  for (auto& [id, job] : jobs_) {
    const v1::Job& j = job.record.job;
    if (IsTerminal(j.state()) || !j.has_time_limit()) continue;
    // From the job's first start; for a job that never started, from its current attempt's
    // placement (a rank that hangs before its first step, in CUDA or NCCL set-up, is not
    // watched by the hang watchdog, which waits for a phase).
    const bool started = j.start_time_ms() != 0;
    const int64_t since_ms = started                   ? j.start_time_ms()
                             : job.attempt.has_value() ? job.attempt->create_time_ms
                                                       : 0;
    if (since_ms == 0) continue;
    const int64_t limit_ms = j.time_limit().seconds() * 1000;
    if (now_ms - since_ms <= limit_ms) continue;
    const std::string message = absl::StrFormat(
        "time limit of %ds exceeded (%s %d ms)", j.time_limit().seconds(),
        started ? "running since" : "placed, never running, for", now_ms - since_ms);
    LogWarning(absl::StrCat("job ", id, ": ", message));
    StopJob(job, v1::JOB_STATE_FAILED, message, write);
    stopped = true;
  }
  if (!stopped) return;
  (void)Commit(write);  // a failed write is kept for the next one (Commit logs it)
  RetireFinished();
}

void JobController::RetireFinished() {
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    ActiveJob& job = it->second;
    if (!IsTerminal(job.record.job.state()) || dirty_.count(it->first) != 0) {
      ++it;
      continue;
    }
    // Watchers drain what they have (the terminal update last) and end; so do log followers.
    hub_.CloseJob(it->first);
    it = jobs_.erase(it);
  }
}

ActiveJob* JobController::FindActiveAttempt(const std::string& job_id, int32_t attempt) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || !it->second.attempt.has_value() ||
      it->second.attempt->attempt != attempt || IsTerminal(it->second.record.job.state())) {
    return nullptr;
  }
  return &it->second;
}

AttemptRecord* JobController::EndedAttempt(const std::string& job_id, int32_t attempt,
                                           std::optional<AttemptRecord>* holder) {
  ActiveJob* job = Find(job_id);
  if (job != nullptr) {
    if (job->attempt.has_value() && job->attempt->attempt == attempt) return nullptr;  // not ended
    if (job->ended_attempt.has_value() && job->ended_attempt->attempt == attempt) {
      return &*job->ended_attempt;
    }
  }
  absl::StatusOr<AttemptRecord> stored = store_.GetAttempt(job_id, attempt);
  if (!stored.ok() || !IsTerminal(stored->state)) return nullptr;  // unknown, or not ended
  // The job's latest attempt is kept in memory while the job is (the next late end reads it
  // there); an older one, or one of a retired job, lives in `holder`.
  if (job != nullptr && job->record.job.attempt() == attempt) {
    job->ended_attempt = *std::move(stored);
    return &*job->ended_attempt;
  }
  *holder = *std::move(stored);
  return &**holder;
}

ActiveJob* JobController::Find(const std::string& id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::Status JobController::CheckJobRank(const std::string& job_id, std::optional<int32_t> rank) {
  int32_t world_size = 0;
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) {
    world_size = it->second.record.job.world_size();
  } else {
    absl::StatusOr<JobRecord> stored = store_.GetJobRecord(job_id);
    if (!stored.ok()) return stored.status();
    world_size = stored->job.world_size();
  }
  if (rank.has_value() && (*rank < 0 || *rank >= world_size)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank: job %s has ranks 0..%d (got %d)", job_id, world_size - 1, *rank));
  }
  return absl::OkStatus();
}

void JobController::FailAttemptsOnWorker(const WorkerEntry& worker, const std::string& reason,
                                         StoreWrite& write) {
  for (auto& [id, job] : jobs_) {
    if (!job.attempt.has_value() || IsTerminal(job.record.job.state())) continue;
    bool placed_here = false;
    for (const RankRecord& rank : job.attempt->ranks) {
      placed_here |= rank.worker_id == worker.info.id() && !RankEnded(rank.state);
    }
    if (placed_here) FailAttempt(job, reason, write);
  }
}

}  // namespace dropless::coordinator
