// Coordinator: the control plane of dropless behind the gRPC services (thin adapters over it). It
// checks requests, holds the lock, runs the ticker (which also forgets workers LOST for longer
// than options.lost_worker_expiry; coordinator_worker_expiry.cc) and the retention sweeper
// (finished jobs older than options.job_retention deleted; coordinator_retention.cc), and says
// what a worker's message means for a job; the state lives in its parts, each with a header of
// its own: the JobController (desired vs observed state of the unfinished jobs: attempts,
// placement, retries; job_controller.h), the WorkerRegistry (the worker-facing state: identity,
// sessions, leases, slots; worker_registry.h), the WatchHub (the subscribers of the streams that
// follow a job, with a lock of its own; watch_hub.h), the RendezvousStore and the hang
// watchdog's policy (hang_watchdog.h).
//
// Every accepted change is written to the JobStore before anyone hears about it (the RPC
// answer, a watcher, a worker's Assignment); only a Cancellation goes out whether or not its
// commit succeeded (stopping ranks is safe whatever the store holds; job_controller.h). One mutex
// guards the job table and the worker registry, SQLite included: the control plane's rates
// (submits, rank state changes, one metrics record per rank per step) are far below what one SQLite
// connection sustains.
//
// Worker protocol (docs/worker_session.md):
// - RegisterWorker: the same node name always gets the same id.
// - A session's first message is Hello; the worker is READY from then on and its reported ranks
//   are reconciled: ranks of a current, active attempt placed on it are kept, any other rank
//   gets a Cancellation; a rank of an active attempt placed on it but not reported fails that
//   attempt (the process is gone).
// - Any message renews the lease. A worker whose session ends is LOST at once (nothing new is
//   placed on it) but its running attempts survive until the lease runs out, so a worker that
//   reconnects in time keeps them. No message for lease_timeout -> LOST and its attempts fail.
// - A slot stays busy until its rank is reported ended (or absent from a heartbeat after its
//   attempt ended, or its worker's lease expired), so a new attempt never lands on a slot whose
//   old process is still exiting.
//
// Thread-safe.
#ifndef DROPLESS_COORDINATOR_CONTROLLER_COORDINATOR_H_
#define DROPLESS_COORDINATOR_CONTROLLER_COORDINATOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "coordinator/controller/hang_watchdog.h"
#include "coordinator/controller/job_controller.h"
#include "coordinator/controller/job_events.h"
#include "coordinator/controller/watch_hub.h"
#include "coordinator/controller/worker_registry.h"
#include "coordinator/controller/worker_session.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "coordinator/rendezvous/rendezvous_store.h"
#include "coordinator/scheduler/gang_scheduler.h"
#include "coordinator/store/job_store.h"
#include "coordinator/util/failure_log_throttle.h"
#include "coordinator/util/mailbox.h"
#include "dropless/v1/job_service.pb.h"
#include "dropless/v1/worker_service.pb.h"

namespace dropless::coordinator {

struct CoordinatorOptions {
  int64_t heartbeat_interval_ms = 1000;
  int64_t lease_timeout_ms = 10000;
  // How often leases are checked and the queue re-planned besides event-driven passes.
  absl::Duration tick = absl::Milliseconds(100);
  size_t max_log_line_bytes = 16 * 1024;  // longer lines are truncated
  size_t max_log_lines_per_batch = 10000;
  size_t watch_mailbox_capacity = 4096;
  size_t log_mailbox_capacity = 65536;
  // A GetLogs backlog is read and sent a page at a time, the lock released in between.
  int log_page_lines = 1000;
  size_t log_page_bytes = size_t{8} << 20;
  // ListJobs reads at most this many stored jobs per call (a label filter that matches little
  // then ends the page early, with a token to go on from).
  int max_jobs_scanned_per_list = 10000;
  // Jobs of one (authenticated) user not yet finished; SubmitJob beyond: RESOURCE_EXHAUSTED. 0:
  // no limit.
  int64_t max_unfinished_jobs_per_user = 1000;
  HangWatchdogOptions hang;
  // Finished jobs that ended longer ago than this are deleted from the store with everything that
  // belongs to them (ExpireFinishedJobs); zero (or infinite) keeps them for good.
  absl::Duration job_retention = absl::Hours(720);
  // A worker LOST for longer than this is forgotten (ForgetLostWorkers); zero (or infinite) keeps
  // every worker for good.
  absl::Duration lost_worker_expiry = absl::Hours(24);
};

// How often the retention sweep runs: every 10 minutes, or a tenth of the retention when that is
// shorter, but at most once a minute.
absl::Duration JobRetentionSweepPeriod(absl::Duration retention);

// A WatchJob stream: the job as of subscription and the updates after it.
struct JobWatch {
  v1::Job snapshot;
  // Null when the job had already ended: the snapshot is all there is.
  std::shared_ptr<Mailbox<v1::JobUpdate>> updates;
};

// A GetLogs stream: the stored lines (read a page at a time by NextLogPage, up to the newest one
// when it was opened) and, when following an active job, the lines after them.
struct LogStream {
  std::string job_id;
  std::optional<int32_t> rank;
  int64_t oldest_time_ms = 0;
  int64_t after_seq = 0;  // the next page starts after this line
  int64_t up_to_seq = 0;  // and ends at this one at the latest
  bool backlog_done = false;
  std::shared_ptr<Mailbox<v1::LogLine>> live;  // null unless following a job that is not over
};

class Coordinator {
 public:
  // Loads the store's state and reconciles it: workers start LOST until they say Hello again;
  // attempts that were SCHEDULED or RUNNING wait up to the lease timeout for their ranks to be
  // reported back, else they fail (and retry per max_attempts). metrics may be null.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(std::unique_ptr<JobStore> store,
                                                             CoordinatorOptions options,
                                                             CoordinatorMetrics* metrics);
  ~Coordinator();

  // Starts the lease/scheduling ticker and, unless finished jobs are kept for good, the retention
  // sweeper: ExpireFinishedJobs at once, then every JobRetentionSweepPeriod.
  void Start();
  // Ends every stream (sessions, watches, log follows, rendezvous waits) without changing
  // persisted state, so workers reconcile with the next coordinator; stops the ticker and the
  // sweeper (a batch being deleted is finished first).
  void Shutdown();

  // Retention (coordinator_retention.cc): deletes from the store the finished jobs that ended
  // more than options.job_retention before now_ms, with all their rows, then the cluster-wide
  // events (of no job) stored before that time, one bounded batch (JobStore::DeleteJobsEndedBefore,
  // DeleteClusterEventsBefore) per hold of the lock, so that calls wait at most one batch.
  // Nothing in memory refers to them: finished jobs are retired first (their streams end), and
  // nothing is deleted while memory holds changes the store has not taken (UNAVAILABLE). Jobs are
  // counted by dropless_coordinator_jobs_expired_total; a sweep that deleted anything logs one
  // line. Returns how many jobs were deleted; an error says why it stopped (the batches deleted
  // before it stay deleted, counted and logged).
  absl::StatusOr<int64_t> ExpireFinishedJobs(int64_t now_ms) ABSL_LOCKS_EXCLUDED(mu_);

  // Lost-worker expiry (coordinator_worker_expiry.cc), run by the ticker: forgets the workers
  // that have been LOST for longer than options.lost_worker_expiry as of now_ms
  // (WorkerRegistry::ForgettableWorkers) and have no rank of an active attempt placed on them,
  // then fails the PENDING jobs that waited for larger GPUs only those workers had
  // (JobController::FailJobsWaitingForMissingDevices); one commit. Counted by
  // dropless_coordinator_workers_forgotten_total. Returns how many workers were forgotten.
  int64_t ForgetLostWorkers(int64_t now_ms) ABSL_LOCKS_EXCLUDED(mu_);

  // JobService. Errors name the offending field or id.
  // A request_id seen before (for the same owner) returns the job it made; AlreadyExists when
  // that job's spec differs from this request's. max_priority: the highest priority the owner may
  // give the job (--max-user-priority for a caller below admin; nullopt: no limit). A job whose
  // priority (the request's override, else the spec's) is above it is refused PermissionDenied
  // naming both, a dry run too; a request_id seen before still returns its job, checked first
  // (coordinator_submit.cc).
  absl::StatusOr<v1::Job> SubmitJob(const v1::SubmitJobRequest& request,
                                    const std::string& owner = "",
                                    std::optional<int32_t> max_priority = std::nullopt);
  absl::StatusOr<v1::Job> GetJob(const std::string& id);
  // Oldest first; filtered by states and labels (at most 16); a page of page_size (0: 100; at most
  // 1000) after page_token (an opaque token: the seq of the last job read), or the most recent
  // `limit` (at most 1000). A page ends early, with a token, once max_jobs_scanned_per_list stored
  // jobs were read. The lock is taken per batch of stored jobs, not for the call: each job is as
  // of its batch, none is listed twice, and one that changes state or labels meanwhile may be
  // missed, as between pages. InvalidArgument names the field.
  // With `owner`, only that user's jobs (JobService resolves it from request.owner and the
  // caller's role; request.owner itself is not read here).
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request,
                                                const std::string* owner = nullptr);
  absl::StatusOr<v1::Job> CancelJob(const std::string& id, const std::string& reason);
  absl::StatusOr<std::vector<v1::Event>> ListEvents(const std::string& job_id, int limit);
  std::vector<v1::Worker> ListWorkers();
  // Oldest first; rank unset: every rank; limit 0: every stored one.
  absl::StatusOr<std::vector<v1::StepMetrics>> ListStepMetrics(const std::string& job_id,
                                                               std::optional<int32_t> rank,
                                                               int limit);
  absl::StatusOr<JobWatch> WatchJob(const std::string& id);
  void EndWatch(const std::string& id, const std::shared_ptr<Mailbox<v1::JobUpdate>>& updates);
  // The stored lines after after_seq (LogLine.seq) and from oldest_time_ms on (with tail_lines > 0
  // only the last tail_lines of them), then, when following, the live ones.
  absl::StatusOr<LogStream> OpenLogs(const std::string& job_id, std::optional<int32_t> rank,
                                     bool follow, int64_t after_seq = 0, int tail_lines = 0,
                                     int64_t oldest_time_ms = 0);
  // The next page of the stored lines (options.log_page_lines lines, log_page_bytes of text at
  // most), read under the lock and no more; empty, with stream->backlog_done, once all are read.
  absl::StatusOr<std::vector<v1::LogLine>> NextLogPage(LogStream* stream);
  void EndLogs(const std::string& job_id, const std::shared_ptr<Mailbox<v1::LogLine>>& live);

  // WorkerService.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request);
  // A new Session stream; it must say Hello within the lease timeout or it is closed.
  void AddSession(const std::shared_ptr<WorkerSession>& session);
  // Messages from the stream, in order, under one hold of the lock: consecutive RankStatus
  // messages among them go into one commit with fsync, and are acknowledged once it succeeded
  // (so the statuses a worker sent back to back cost one fsync, not one each). An error ends the
  // stream with that status; the messages after the one that failed are not handled.
  absl::Status HandleWorkerMessages(const std::shared_ptr<WorkerSession>& session,
                                    const std::vector<v1::WorkerMessage>& messages);
  absl::Status HandleWorkerMessage(const std::shared_ptr<WorkerSession>& session,
                                   const v1::WorkerMessage& message) {
    return HandleWorkerMessages(session, {message});
  }
  void RemoveSession(const std::shared_ptr<WorkerSession>& session);

  bool ShuttingDown() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return shutting_down_;
  }
  RendezvousStore& rendezvous() { return rendezvous_; }
  // RendezvousService.Put: checked, written to the store, then visible to Get and Wait; the keys
  // of an attempt that is still active after a restart are put back from the store.
  absl::Status RendezvousPut(const std::string& job_id, int32_t attempt, const std::string& key,
                             std::string value);
  const CoordinatorOptions& options() const { return options_; }

 private:
  Coordinator(std::unique_ptr<JobStore> store, CoordinatorOptions options,
              CoordinatorMetrics* metrics)
      : store_(std::move(store)), options_(options), metrics_(metrics) {}
  absl::Status Load() ABSL_LOCKS_EXCLUDED(mu_);
  void TickLoop();
  // Whether finished jobs are ever deleted: options.job_retention neither zero nor infinite.
  bool RetentionOn() const;
  void RetentionLoop() ABSL_LOCKS_EXCLUDED(mu_);

  // The job an earlier submit with (owner, request_id) made, if any.
  absl::StatusOr<std::optional<v1::Job>> FindSubmittedLocked(const std::string& owner,
                                                             const std::string& request_id,
                                                             const std::string& spec_yaml)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Places what can be placed, unless shutting down.
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefreshGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Workers (coordinator_workers.cc).
  absl::Status HandleHelloLocked(const std::shared_ptr<WorkerSession>& session,
                                 const v1::Hello& hello) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rank statuses applied in memory and not committed yet (coordinator_rank_status.cc): those of
  // one worker message (a Hello's or a heartbeat's list) or consecutive queued RankStatus
  // messages go into one commit with fsync, so a gang's start costs a commit per worker message,
  // not one per rank.
  struct RankStatusCommit {
    StoreWrite write;
    bool needs_commit = false;  // a rank's state changed, or a status's job has unstored changes
    bool slot_freed = false;    // retire finished jobs and schedule once committed
    uint64_t ack_seq = 0;       // the last queued RankStatus among them, acknowledged once stored
  };
  // One queued message (HandleWorkerMessages); a RankStatus goes into `statuses`.
  absl::Status HandleWorkerMessageLocked(const std::shared_ptr<WorkerSession>& session,
                                         const v1::WorkerMessage& message,
                                         RankStatusCommit& statuses)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies a rank's status in memory (from_list: as listed by a Hello or heartbeat, which only
  // moves a rank forward), into `commit`.
  void ApplyRankStatusLocked(WorkerEntry& worker, const v1::RankStatus& status, bool from_list,
                             RankStatusCommit& commit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A rank's failure (exit code) reported after its attempt ended: a peer's failure, handled
  // first, ended it (NCCL's "connection closed by peer" once this rank died), or a cancel, a time
  // limit, a lost worker. The rank's end goes into the attempt's row and a RankExited event that
  // says so, whatever became of the job (retired from memory too), so `dropless describe` shows
  // every rank's own reason. Its exit kRankExitDeviceTooSmall, while that attempt is still the
  // job's latest and the job PENDING (queued again by the peer's failure):
  // JobController::FailAttemptOnTooSmallDevice, as if the report had come first. Once per rank.
  void ApplyLateRankEndLocked(WorkerEntry& worker, const v1::RankStatus& status,
                              RankStatusCommit& commit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits what `commit` holds (with fsync when a rank's state changed) and the jobs with
  // changes not stored yet, publishes its events, then retires and schedules when a slot was
  // freed; `commit` starts over. True when what the statuses say is in the store: only then is a
  // queued RankStatus acknowledged (else it comes again).
  bool CommitRankStatusesLocked(RankStatusCommit& commit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleHeartbeatLocked(WorkerEntry& worker, const v1::Heartbeat& heartbeat)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The hang watchdog (coordinator_watchdog.cc): fails the attempt of a rank that stayed in one
  // step phase too long, into `write` (the heartbeat's commit).
  void CheckProgressLocked(WorkerEntry& worker, const v1::Heartbeat& heartbeat, StoreWrite& write)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // (job_id, attempt, rank) of the ranks a worker listed.
  using ListedRanks = std::set<std::tuple<std::string, int32_t, int32_t>>;
  // The ranks of active attempts placed on `worker` that are neither ended nor in `listed`
  // (coordinator_worker_loss.cc). From a heartbeat (hello null): the attempt of one the worker
  // reported as STARTING or RUNNING fails ("rank N <what>"). From a Hello: the attempt of every
  // one fails, but where all such ranks of an attempt were never reported and were assigned to
  // this daemon run, which takes resent assignments: that run never got their Assignment, and it
  // is sent again. Both go into `write`; true when an attempt failed.
  bool ReconcileUnlistedRanksLocked(WorkerEntry& worker, const ListedRanks& listed,
                                    const v1::Hello* hello, const std::string& what,
                                    StoreWrite& write) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the worker's slots held by ranks of attempts that are not active any more and not in
  // `alive`. From a Hello (ended null), which lists every rank its run has, every such slot; from
  // a heartbeat only those of ranks the worker reported (RankKey::reported) or lists in `ended`:
  // the Assignment of a rank it never mentioned may still be on its way (the heartbeat was
  // written before it arrived), and the worker starts the rank then. True when one was freed.
  bool FreeSlotsOfEndedAttemptsLocked(WorkerEntry& worker, const ListedRanks& alive,
                                      const ListedRanks* ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Both store the message's receipt (when not null) with its rows, and return false when the
  // store write failed (the message is not acknowledged).
  bool HandleMetricsLocked(WorkerEntry& worker, v1::StepMetrics metrics,
                           const WorkerReceipt* receipt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HandleLogsLocked(WorkerEntry& worker, const v1::LogBatch& batch,
                        const WorkerReceipt* receipt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A status of a rank that is not active here: cancels it (rate-limited) and keeps its slot
  // busy until it ends. True when the status ends it and its slot is free.
  bool CancelStrayRankLocked(WorkerEntry& worker, const v1::RankStatus& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the slot a stray rank's stored placement gave it busy (unless something holds it).
  void HoldStraySlotLocked(WorkerEntry& worker, const v1::RankStatus& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker going away (coordinator_worker_loss.cc): an event of `type` on each active attempt
  // with ranks on it; the Goodbye of a daemon that is shutting down; and, for a rank of `job`
  // that failed on `reporter`, the peers' workers that went away first ("" if none).
  void NoteWorkerGoneLocked(const WorkerEntry& worker, absl::string_view type,
                            absl::string_view what, StoreWrite& write)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleGoodbyeLocked(WorkerEntry& worker, const v1::Goodbye& goodbye)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string GonePeersLocked(const ActiveJob& job, const WorkerEntry& reporter)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLeasesLocked(int64_t now_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether workers are ever forgotten: options.lost_worker_expiry neither zero nor infinite.
  bool LostWorkerExpiryOn() const;
  int64_t ForgetLostWorkersLocked(int64_t now_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<JobStore> store_;
  const CoordinatorOptions options_;
  // StepMetrics.expert_tokens entries a worker may send (a spec's most experts).
  static constexpr int kMaxExpertTokens = 1024;
  // Store lookups HoldStraySlotLocked may do for one worker message.
  static constexpr int kMaxStrayLookupsPerMessage = 8;
  CoordinatorMetrics* const metrics_;
  RendezvousStore rendezvous_;
  WatchHub hub_{options_.watch_mailbox_capacity,
                options_.log_mailbox_capacity};  // WatchJob, GetLogs -f

  absl::Mutex mu_;
  // Those left for the worker message being handled, and the attempts they read: one read serves
  // every rank of the attempt (a gang's leftover ranks listed by a returning worker).
  int stray_lookups_left_ ABSL_GUARDED_BY(mu_) = kMaxStrayLookupsPerMessage;
  std::map<std::pair<std::string, int32_t>, std::optional<AttemptRecord>> stray_attempts_
      ABSL_GUARDED_BY(mu_);
  // The worker-facing state, and the unfinished jobs with their state machine (in this order: the
  // controller places onto the registry's slots).
  WorkerRegistry workers_ ABSL_GUARDED_BY(mu_){options_.lease_timeout_ms};
  JobController jobs_ ABSL_GUARDED_BY(mu_){*store_, workers_, hub_, rendezvous_, metrics_};
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // Workers' step metrics and log lines the store refused: a full disk refuses each one, and
  // every worker sends them again on its next session.
  FailureLogThrottle message_store_log_ ABSL_GUARDED_BY(mu_){
      "storing a worker's step metrics or log lines"};

  absl::Notification stop_;
  std::thread ticker_;
  std::thread retention_;  // not started when finished jobs are kept for good
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_CONTROLLER_COORDINATOR_H_
