// JobController: desired vs observed state of the jobs that are not over. It holds them in memory
// (the JobStore has every job) and moves them through their state machine, PENDING -> SCHEDULED
// -> RUNNING -> SUCCEEDED | FAILED | CANCELLED, with attempts: placement through the gang
// scheduler onto the WorkerRegistry's free slots, attempt ends with the ranks cancelled, retries
// per max_attempts, terminal states, time limits.
//
// The write path: a change is marked dirty and committed to the JobStore (Commit) with the events
// that describe it before anyone hears about it: watchers get the events once they are stored
// (Commit publishes them), an Assignment goes out only once its placement is stored (a placement
// whose commit fails is undone), and the Cancellations a change queues are sent after its commit
// whether or not that succeeded (stopping ranks is safe whatever the store holds; Commit says
// why). What a failed commit could not store is stored by the next one that succeeds: the dirty
// jobs' rows (whole-record upserts of their latest state) and, kept aside, the rows of attempts
// that ended, worker rows and events (unless the caller undoes the change: a placement, a submit;
// bounded: UnstoredWrites). A commit that carries a job's state is fsync'ed, whoever makes it.
//
// Not thread-safe: its owner serializes every call (the Coordinator, under its lock).
#ifndef DROPLESS_COORDINATOR_CONTROLLER_JOB_CONTROLLER_H_
#define DROPLESS_COORDINATOR_CONTROLLER_JOB_CONTROLLER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/controller/hang_watchdog.h"
#include "coordinator/controller/unstored_writes.h"
#include "coordinator/controller/watch_hub.h"
#include "coordinator/controller/worker_registry.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "coordinator/rendezvous/rendezvous_store.h"
#include "coordinator/scheduler/gang_scheduler.h"
#include "coordinator/store/job_store.h"
#include "coordinator/util/failure_log_throttle.h"
#include "coordinator/util/retry_backoff.h"
#include "dropless/v1/worker_service.pb.h"

namespace dropless::coordinator {

// Where a rank of an attempt is in its step (hang watchdog).
struct RankProgress {
  int32_t attempt = 0;
  std::string phase;
  int64_t step = 0;
  int64_t since_ms = 0;  // its worker's clock
  std::string node;
  std::string worker_id;
};

struct ActiveJob {
  JobRecord record;  // record.job carries placement and latest as the API shows them
  std::optional<AttemptRecord> attempt;  // while SCHEDULED or RUNNING
  // The latest attempt that ended, as its end was written (EndAttempt); none since a restart
  // until one ends (JobController::EndedAttempt reads the store then).
  std::optional<AttemptRecord> ended_attempt;
  std::string waiting_reason;                // last reason recorded in a Waiting event
  StepTimes step_times;                      // recent step times (hang watchdog)
  std::map<int32_t, RankProgress> progress;  // by rank, as the last heartbeats said
};

bool RankEnded(v1::RankState state);

class JobController {
 public:
  // metrics may be null.
  JobController(JobStore& store, WorkerRegistry& workers, WatchHub& hub,
                RendezvousStore& rendezvous, CoordinatorMetrics* metrics)
      : store_(store), workers_(workers), hub_(hub), rendezvous_(rendezvous), metrics_(metrics) {}

  // The unfinished jobs (and finished ones not yet retired), by id.
  std::map<std::string, ActiveJob>& jobs() { return jobs_; }
  ActiveJob* Find(const std::string& id);
  // The job whose current, unfinished attempt is `attempt`; null otherwise.
  ActiveJob* FindActiveAttempt(const std::string& job_id, int32_t attempt);
  // Attempt `attempt` of the job once it ended (whatever the job's state since, the job retired
  // from memory too); null while it runs, or when neither memory nor the store has it. From
  // memory (the latest attempt of a job in memory: ActiveJob::ended_attempt), else from the
  // store into `holder`: a job's row is stored with the row of the attempt that ended, so what
  // is stored is what memory held. A change to it is stored by putting it into a write.
  AttemptRecord* EndedAttempt(const std::string& job_id, int32_t attempt,
                              std::optional<AttemptRecord>* holder);
  // NotFound for an unknown job (live or stored); InvalidArgument naming the rank when it is set
  // and outside the job's ranks.
  absl::Status CheckJobRank(const std::string& job_id, std::optional<int32_t> rank);

  // The job's record and current attempt go into the next Commit.
  void MarkDirty(const ActiveJob& job) { dirty_.insert(job.record.job.id()); }
  // Whether the job has changes that are not stored yet (a failed Commit leaves them dirty).
  bool IsDirty(const std::string& job_id) const { return dirty_.count(job_id) != 0; }
  // Whether memory holds anything the store does not have yet: dirty jobs, or what failed commits
  // kept aside (which may name jobs that are no longer in memory).
  bool HasUnstoredChanges() const { return !dirty_.empty() || !unstored_.empty(); }

  // What a failed Commit does with the attempts, workers and events of its write (the dirty
  // jobs stay dirty either way).
  enum class IfNotStored {
    kStoreWithNextCommit,  // kept, and written (before its own) by the next Commit that succeeds
    kForget,               // the caller undoes the change in memory (a placement, a submit)
  };
  // Writes, in one transaction, what earlier failed commits kept, then `write`, then the dirty
  // jobs (`write` ends up holding all of it); once stored, publishes the events to the watchers
  // of their jobs, in the order stored. Then sends the queued Cancellations and resent
  // Assignments, stored or not. A failure is counted and logged (throttled: a full disk fails
  // every commit).
  absl::Status Commit(StoreWrite& write,
                      IfNotStored if_not_stored = IfNotStored::kStoreWithNextCommit);
  // OK when the job's state in memory is in the store: it is not dirty (a failed Commit leaves
  // its jobs dirty), or committing the dirty jobs again succeeds now.
  absl::Status StoreIfDirty(const std::string& job_id);
  // Commits the dirty jobs and what failed commits kept, if any (the ticker: memory and store
  // meet again once the store recovers, whether or not anything else happens). While commits
  // keep failing it tries less often: 100 ms after a failure, doubling up to 5 s.
  void StoreUnstored();

  // Places what the gang scheduler can place on the registry's free slots; a job that must wait
  // gets a Waiting event when its reason changes. The Assignments go out once the placements are
  // stored; when that commit fails they are undone (the jobs PENDING again, their slots free),
  // and a later pass places them again. While commits keep failing a pass does nothing until
  // StoreUnstored's back-off makes a try due.
  void Schedule();
  // Ends the attempt; the job is queued again while attempts remain, else it FAILS. `retry` false
  // (a rank reported a problem of the job itself, common/job_error.h) FAILS it at once.
  void FailAttempt(ActiveJob& job, const std::string& reason, StoreWrite& write, bool retry = true);
  // Ends the attempt of which a rank ran out of memory on a GPU with `device_memory_bytes` in all
  // (kRankExitDeviceTooSmall): the job is queued again, the attempt not counted against
  // max_attempts, for GPUs with more memory only (Job.needs_device_memory_above_bytes) while the
  // known workers of its kind (READY or away, WorkerRegistry::KnownCapacity) could hold its gang
  // on such GPUs; otherwise (or when that GPU's memory is unknown: 0) the job FAILS as for a
  // problem of the job itself.
  // The rank's report may come after a peer's failure ended that attempt (NCCL's "connection
  // closed by peer" once this rank died, handled first as an ordinary failure) and queued the job
  // again (PENDING, not placed yet; a job it finished stays finished): the job then
  // ends up as if the report had come first, and the attempt, which FailAttempt counted, stops
  // counting against max_attempts.
  void FailAttemptOnTooSmallDevice(ActiveJob& job, const std::string& reason,
                                   int64_t device_memory_bytes, StoreWrite& write);
  // The PENDING jobs waiting for GPUs larger than one they ran out of memory on that the known
  // workers (KnownCapacity) can no longer hold, once workers were forgotten (--lost-worker-expiry):
  // FAILED with the reason FailAttemptOnTooSmallDevice gives, into `write`. How many.
  int FailJobsWaitingForMissingDevices(StoreWrite& write);
  // Sends the job's current Assignment for the worker's ranks again (with the next Commit, after
  // the AssignmentResent event that says why in `write`): its placement is stored, but the
  // worker's daemon run never got it (lost to a restart of the coordinator).
  void ResendAssignment(const ActiveJob& job, const std::string& worker_id, const std::string& why,
                        StoreWrite& write);
  // Fails the attempts with a live rank placed on the worker.
  void FailAttemptsOnWorker(const WorkerEntry& worker, const std::string& reason,
                            StoreWrite& write);
  void EndAttempt(ActiveJob& job, v1::JobState state, const std::string& message,
                  StoreWrite& write);
  void FinishJob(ActiveJob& job, v1::JobState state, const std::string& message, StoreWrite& write);
  // Ends an unfinished job now (cancel, time limit): its attempt (the ranks are cancelled) and the
  // job, in `state`.
  void StopJob(ActiveJob& job, v1::JobState state, const std::string& message, StoreWrite& write);
  // FAILS every unfinished job running longer than its time_limit since its first start.
  void EnforceTimeLimits(int64_t now_ms);
  // Drops the finished, stored jobs from memory; their streams end.
  void RetireFinished();

 private:
  // A placement made in memory by Schedule, and what its job was before it.
  struct UnstoredPlacement {
    ActiveJob* job;
    JobRecord record;
    std::string waiting_reason;
    bool was_dirty;
  };
  // The events of a committed write, to the watchers of their jobs.
  void Publish(const StoreWrite& write);
  void Place(ActiveJob& job, const JobPlacement& placement, StoreWrite& write);
  // Its commit failed: the job as it was, the slots free, the rendezvous closed.
  void UndoPlacement(const UnstoredPlacement& placement);
  // Ends the current attempt as FAILED with an AttemptFailed event; its number.
  int32_t EndFailedAttempt(ActiveJob& job, const std::string& reason, StoreWrite& write);
  // PENDING again after attempt `number` failed; `event` says why in a Retrying event.
  void Requeue(ActiveJob& job, int32_t number, const std::string& reason, const std::string& event,
               StoreWrite& write);
  // Its commit succeeded: logged, measured, and the Assignments sent.
  void AnnouncePlacement(const ActiveJob& job);
  // The Assignment of the job's current attempt for the ranks placed on `worker_id`.
  static v1::CoordinatorMessage AssignmentFor(const ActiveJob& job, const std::string& worker_id);
  void SendCancellations(const AttemptRecord& attempt, const std::string& reason);

  JobStore& store_;
  WorkerRegistry& workers_;
  WatchHub& hub_;
  RendezvousStore& rendezvous_;
  CoordinatorMetrics* const metrics_;

  std::map<std::string, ActiveJob> jobs_;
  std::set<std::string> dirty_;
  // Rows of ended attempts, worker rows and events that failed commits could not store (never a
  // current attempt: that is a dirty job's); written first by the next commit that succeeds.
  UnstoredWrites unstored_;
  RetryBackoff unstored_retry_{absl::Milliseconds(100), absl::Seconds(5)};
  FailureLogThrottle commit_failure_log_{"a job store commit"};
  FailureLogThrottle undone_placement_log_{"storing a placement"};
  // Cancellations and resent Assignments to workers, sent by the next Commit whatever its
  // outcome (see Commit).
  std::vector<std::pair<std::string, v1::CoordinatorMessage>> pending_sends_;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_CONTROLLER_JOB_CONTROLLER_H_
