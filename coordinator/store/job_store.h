// JobStore: the coordinator's durable state in one SQLite file (WAL, exclusive lock so two
// coordinators cannot share a file). Jobs, attempts with their rank assignments, workers and events
// change together in one transaction (StoreWrite) that is fsync'ed (synchronous=FULL) when it
// carries accepted state; step metrics and logs are high-rate and bounded per job, so they commit
// with synchronous=NORMAL (safe against a process crash, the case kill -9 exercises).
//
// Not thread-safe: the coordinator serializes calls under its own lock.
#ifndef DROPLESS_COORDINATOR_STORE_JOB_STORE_H_
#define DROPLESS_COORDINATOR_STORE_JOB_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/store/sqlite.h"
#include "dropless/v1/types.pb.h"
#include "dropless/v1/worker_service.pb.h"

namespace dropless::coordinator {

bool IsTerminal(v1::JobState state);

// Where one rank of an attempt runs and what its worker last said about it.
struct RankRecord {
  int32_t rank = 0;
  std::string worker_id;
  std::string node;
  int32_t slot = 0;
  v1::RankState state = v1::RANK_STATE_UNSPECIFIED;  // unspecified: assigned, not reported yet
  int32_t exit_code = 0;
  // The worker daemon run (Hello.boot_id) the rank was assigned to; "" when its worker has no
  // boot ids or the attempt predates schema version 3. Only that run can say whether it got the
  // Assignment, so only to that run is it ever sent again.
  std::string boot_id;
};

struct AttemptRecord {
  std::string job_id;
  int32_t attempt = 0;                           // 1-based
  v1::JobState state = v1::JOB_STATE_SCHEDULED;  // SCHEDULED, RUNNING or terminal
  int64_t create_time_ms = 0;
  int64_t end_time_ms = 0;
  std::string message;
  std::vector<RankRecord> ranks;  // ordered by rank
  // Assignment.rendezvous_secret: only the attempt's ranks may use its rendezvous keys. Kept
  // while the attempt is active (table rendezvous_secrets), so a restarted coordinator knows it.
  std::string rendezvous_secret;
};

struct JobRecord {
  v1::Job job;  // placement and latest are derived on read (attempt ranks, step metrics)
  int64_t seq = 0;             // submission order: FIFO among equal priorities
  int32_t max_attempts = 1;
  int64_t queued_time_ms = 0;  // when it last became PENDING (submit or requeue)
};

// A SubmitJobRequest.request_id and the job it made.
struct SubmitRequestRecord {
  std::string owner;  // who submitted; request ids are per owner
  std::string request_id;
  std::string job_id;
};

// The last queued message of a worker daemon's run (WorkerMessage.seq within Hello.boot_id) whose
// rows are stored: written in the same transaction as those rows, so that a coordinator restarted
// between storing a message and acknowledging it knows not to store the resent copy again.
struct WorkerReceipt {
  std::string worker_id;
  std::string boot_id;
  uint64_t seq = 0;
};

// A worker's row: the worker as the API shows it and, while it is LOST, since when.
struct WorkerRecord {
  v1::Worker info;
  // When it was last heard from before it became LOST (Unix ms), what --lost-worker-expiry
  // counts from (schema 5); 0 while it is READY, and in the rows of an older file.
  int64_t lost_since_ms = 0;
};

// Rows that change together; committed in one transaction.
struct StoreWrite {
  std::vector<JobRecord> jobs;          // upserted
  std::vector<AttemptRecord> attempts;  // upserted with all their ranks
  std::vector<WorkerRecord> workers;    // upserted
  // Workers forgotten (--lost-worker-expiry): their rows and receipts deleted, after the upserts.
  std::vector<std::string> forgotten_workers;
  // When > 0, the highest worker number ("worker-0042": 42) ever given is at least this: kept in
  // store_counters, so that a forgotten worker's id is not given again after a restart.
  int64_t last_worker_number = 0;
  std::vector<v1::Event> events;        // appended; Commit assigns their ids
  std::vector<SubmitRequestRecord> submit_requests;  // inserted (a second use of an id fails)
  bool durable = true;                  // fsync before returning (synchronous=FULL)
  bool empty() const {
    return jobs.empty() && attempts.empty() && workers.empty() && forgotten_workers.empty() &&
           last_worker_number == 0 && events.empty() && submit_requests.empty();
  }
};

// What the coordinator needs in memory after a restart.
struct ActiveState {
  std::vector<JobRecord> jobs;          // non-terminal jobs, submission order
  std::vector<AttemptRecord> attempts;  // current attempts of SCHEDULED/RUNNING jobs
  std::vector<WorkerRecord> workers;    // every registered worker not forgotten
  std::vector<WorkerReceipt> receipts;  // per worker, its last stored queued message
  // The highest worker number given to a worker since forgotten (StoreWrite.last_worker_number).
  int64_t last_worker_number = 0;
};

class JobStore {
 public:
  // 2: jobs.owner; 3: rank_assignments.boot_id; 4: jobs.end_time_ms and store_counters
  // (retention, job_store_retention.cc); 5: workers.lost_since_ms (job_store_workers.cc).
  static constexpr int kSchemaVersion = 5;

  struct Limits {
    int max_logs_per_job = 10000;
    int max_metrics_history_per_job = 5000;
    // One DeleteJobsEndedBefore transaction deletes at most this many jobs, and adds no further
    // job once the log lines, step metrics and events of those it took pass max_expired_rows (it
    // takes one job at least); one DeleteClusterEventsBefore transaction deletes at most
    // max_expired_rows events: the write lock, and the coordinator's, are held briefly however
    // large the backlog is.
    int max_expired_jobs = 500;
    int max_expired_rows = 20000;
  };

  // Creates or upgrades the schema; refuses a file written by a newer schema or locked by
  // another coordinator.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path, Limits limits);

  // A fresh job id ("job-000042") in submission order. Ids are never reused, also once the newest
  // jobs are deleted (DeleteJobsEndedBefore keeps the highest seq handed out).
  std::string NextJobId(int64_t* seq);

  absl::Status Commit(StoreWrite& write);

  absl::StatusOr<ActiveState> LoadActive();

  // Jobs as the API shows them: placement of the current attempt, latest metrics (rank 0's,
  // else the lowest rank's). NotFound names the id.
  absl::StatusOr<v1::Job> GetJob(absl::string_view id);
  absl::StatusOr<JobRecord> GetJobRecord(absl::string_view id);
  // Submission order; with limit > 0 the most recent `limit` jobs; with after_seq > 0 only jobs
  // submitted after the one of that seq. Empty states: all. `seqs`, when given, gets each job's
  // seq. With `owner`, only that user's jobs. With max_rows > 0, at most the first max_rows of them
  // (a page is read so, not the whole table). `states` must not repeat a state.
  absl::StatusOr<std::vector<v1::Job>> ListJobs(const std::vector<v1::JobState>& states, int limit,
                                                int64_t after_seq = 0,
                                                std::vector<int64_t>* seqs = nullptr,
                                                const std::string* owner = nullptr,
                                                int max_rows = 0);
  absl::StatusOr<std::map<v1::JobState, int64_t>> CountJobsByState();

  absl::StatusOr<AttemptRecord> GetAttempt(absl::string_view job_id, int32_t attempt);
  absl::StatusOr<std::vector<AttemptRecord>> ListAttempts(absl::string_view job_id);

  // Oldest first; with limit > 0 the most recent `limit`. Empty job_id: every event.
  absl::StatusOr<std::vector<v1::Event>> ListEvents(absl::string_view job_id, int limit);

  // Every stored worker, by id.
  absl::StatusOr<std::vector<WorkerRecord>> ListWorkers();

  // The job a submit with this (owner, request_id) made; nullopt when none did.
  absl::StatusOr<std::optional<std::string>> FindSubmitRequest(absl::string_view owner,
                                                               absl::string_view request_id);

  // Keeps the latest metrics per (job, rank) and a bounded history per job. With a receipt, the
  // message that carried them is recorded as stored in the same transaction.
  absl::Status PutStepMetrics(const v1::StepMetrics& metrics,
                              const WorkerReceipt* receipt = nullptr);
  absl::StatusOr<std::vector<v1::StepMetrics>> LatestStepMetrics(absl::string_view job_id);
  absl::StatusOr<std::vector<v1::StepMetrics>> StepMetricsHistory(absl::string_view job_id,
                                                                  int limit);

  // Keeps the most recent Limits::max_logs_per_job lines per job (trimmed in batches).
  // Rendezvous keys of active attempts (RendezvousStore), written without fsync like log lines (a
  // killed process keeps them in the WAL); an attempt's keys are deleted by the Commit that writes
  // it ended.
  absl::Status PutRendezvousKey(absl::string_view job_id, int32_t attempt, absl::string_view key,
                                absl::string_view value);
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> RendezvousKeys(
      absl::string_view job_id, int32_t attempt);

  // Retention: deletes finished jobs (SUCCEEDED, FAILED, CANCELLED) that ended before
  // `end_time_ms` (Job.end_time_ms), oldest first, with every row that belongs to them (attempts,
  // rank assignments, events, step metrics, logs, rendezvous keys and secrets, submit requests),
  // in one transaction bounded by Limits::max_expired_jobs and max_expired_rows. Unfinished jobs
  // are never touched. Returns the ids deleted, empty once none is left; call again for more.
  absl::StatusOr<std::vector<std::string>> DeleteJobsEndedBefore(int64_t end_time_ms);
  // Retention of the cluster-wide events (those of no job: workers registered, ready, lost,
  // coordinator started, events dropped): deletes those stored with a time before `time_ms`,
  // oldest first, at most Limits::max_expired_rows in one transaction. Returns how many it
  // deleted, 0 once none is left; call again for more.
  absl::StatusOr<int64_t> DeleteClusterEventsBefore(int64_t time_ms);

  // Stores the lines in one transaction; returns the seq of the first (the others follow it
  // consecutively), 0 when there are none. With a receipt, as PutStepMetrics.
  absl::StatusOr<int64_t> AppendLogs(const std::vector<v1::LogLine>& lines,
                                     const WorkerReceipt* receipt = nullptr);
  // Oldest first, each with its seq; only lines with seq > after_seq and time_ms >=
  // oldest_time_ms; with limit > 0 the most recent `limit` of those; rank unset: every rank.
  absl::StatusOr<std::vector<v1::LogLine>> ListLogs(absl::string_view job_id,
                                                    std::optional<int32_t> rank, int limit,
                                                    int64_t after_seq = 0,
                                                    int64_t oldest_time_ms = 0);
  // A page of the lines ListLogs(job_id, rank, 0, after_seq, oldest_time_ms) would give, those
  // with seq <= up_to_seq only (0: no bound), oldest first: at most max_lines, and no more lines
  // once max_bytes of text is reached (at least one line).
  absl::StatusOr<std::vector<v1::LogLine>> ListLogsPage(absl::string_view job_id,
                                                        std::optional<int32_t> rank,
                                                        int64_t after_seq, int64_t up_to_seq,
                                                        int64_t oldest_time_ms, int max_lines,
                                                        size_t max_bytes);
  // Where the last `tail_lines` of the lines after after_seq and from oldest_time_ms on begin: the
  // after_seq to read them from (after_seq itself when there are no more than that), and the seq
  // of the newest line of the job (0: none).
  absl::StatusOr<std::pair<int64_t, int64_t>> LogTailStart(absl::string_view job_id,
                                                           std::optional<int32_t> rank,
                                                           int tail_lines, int64_t after_seq,
                                                           int64_t oldest_time_ms);

 private:
  JobStore(std::unique_ptr<SqliteDb> db, Limits limits) : db_(std::move(db)), limits_(limits) {}
  absl::Status Initialize();
  absl::Status SetDurable(bool durable);
  absl::Status PutReceipt(const WorkerReceipt& receipt);  // inside the caller's transaction
  absl::StatusOr<std::vector<WorkerReceipt>> ListReceipts();
  absl::Status WriteJob(const JobRecord& record);
  absl::Status WriteAttempt(const AttemptRecord& attempt);
  // Workers (job_store_workers.cc), inside the caller's transaction.
  absl::Status WriteWorker(const WorkerRecord& worker);
  absl::Status DeleteWorker(const std::string& worker_id);  // its row and its receipt
  absl::Status RaiseLastWorkerNumber(int64_t number);
  absl::StatusOr<int64_t> LastWorkerNumber();
  absl::Status WriteEvent(v1::Event& event);
  absl::Status WriteSubmitRequest(const SubmitRequestRecord& request);
  // `args` bind to ?1, ?2, ...; `owner`, when given, to ?kOwnerParam.
  absl::StatusOr<std::vector<JobRecord>> QueryJobs(absl::string_view where_and_order,
                                                   const std::vector<int64_t>& args,
                                                   const std::string* owner = nullptr);
  absl::Status MigrateToOwners();
  absl::Status MigrateToRankBootIds();
  absl::Status MigrateToJobEndTimes();
  absl::Status MigrateToWorkerLostSince();
  // The index DeleteClusterEventsBefore reads, created in place in a file that lacks it.
  absl::Status IndexClusterEventsByTime();
  // jobs.end_time_ms of a job row: when a finished job ended (its create time if it has no end
  // time), 0 for an unfinished one.
  static int64_t EndTimeColumn(const v1::Job& job);
  // The highest seq any job was given: the newest stored job's, or a deleted one's.
  absl::StatusOr<int64_t> HighestJobSeq();
  absl::Status FillView(const JobRecord& record, v1::Job* job);
  absl::Status Trim(absl::string_view table, absl::string_view job_id, int keep);

  std::unique_ptr<SqliteDb> db_;
  Limits limits_;
  int64_t next_seq_ = 1;
  bool durable_ = true;
  std::map<std::string, int, std::less<>> logs_since_trim_;
  std::map<std::string, int, std::less<>> metrics_since_trim_;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_STORE_JOB_STORE_H_
