// RankManager: the rank processes of one worker daemon. Turns Assignments into rank processes
// (`dropless-worker rank ...`, see docs/architecture.md), Cancellations into stops, and what the
// ranks do into messages for the coordinator (RankStatus, StepMetrics, LogBatch on the outbound
// queue) and into /metrics.
//
// Rank states as reported: STARTING once the process runs, RUNNING on its ready line (or first
// step report), then SUCCEEDED (exit 0), KILLED (stopped by a cancellation) or FAILED (non-zero
// exit or signal; exit_code is the shell status, 128 + signal for a signal).
#ifndef DROPLESS_WORKER_DAEMON_RANK_MANAGER_H_
#define DROPLESS_WORKER_DAEMON_RANK_MANAGER_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/step_phase.h"
#include "dropless/v1/worker_service.pb.h"
#include "worker/daemon/outbound_queue.h"
#include "worker/daemon/rank_log_file.h"
#include "worker/daemon/rank_supervisor.h"
#include "worker/daemon/worker_metrics.h"

namespace dropless {

struct RankManagerOptions {
  std::string rank_binary;        // executable started as `<rank_binary> rank ...`
  std::string coordinator;        // passed to ranks (rendezvous)
  // How ranks reach the coordinator (TLS files or plaintext), as environment entries
  // (common/grpc_security.h, ChannelSecurityEnvironment).
  std::vector<std::string> channel_env;
  std::string node;
  std::string advertise_address;  // --host of the ranks
  std::string work_dir;           // <work_dir>/jobs/<job>/attempt-<N>/{spec.yaml,rank-<R>.log}
  std::string slot_kind;          // cpu | cuda
  int slots = 0;
  std::vector<std::string> slot_uuids;  // per slot: the GPU's UUID (for /metrics); may be empty
  absl::Duration kill_grace = absl::Seconds(5);
  // Cap of each rank's log file before it rotates (RankLogFile; the daemon's
  // --rank-log-max-bytes); 0: none.
  int64_t rank_log_max_bytes = kDefaultRankLogMaxBytes;
  // Job directories kept under <work_dir>/jobs (spec files, rank logs): when a new assignment
  // arrives, the oldest of jobs with no live rank are removed until at most retained_job_dirs
  // remain and those of jobs with no live rank hold at most retained_job_bytes (0: no byte
  // bound). Live jobs' directories are never removed.
  int retained_job_dirs = 32;
  int64_t retained_job_bytes = int64_t{8} << 30;
  // Where jobs' checkpoint.dir may be, passed to the ranks (worker/rank/checkpoint_roots.h);
  // empty: anywhere.
  std::vector<std::string> checkpoint_roots;
};

class RankManager {
 public:
  // `outbound` and `metrics` outlive the manager.
  RankManager(RankManagerOptions options, OutboundQueue* outbound, WorkerMetrics* metrics);
  // Kills the ranks still alive (SIGKILL) and reaps them.
  ~RankManager();

  void HandleAssignment(const dropless::v1::Assignment& assignment);
  // attempt 0 cancels every attempt of the job.
  void HandleCancellation(const dropless::v1::Cancellation& cancellation);

  // Ranks alive now (STARTING or RUNNING), for Hello and Heartbeat.
  std::vector<dropless::v1::RankStatus> LiveRanks() const;
  // pids of the ranks alive now (tests and diagnostics).
  std::vector<pid_t> LivePids() const;

  // Stops every rank (SIGTERM, SIGKILL after the grace period) and waits up to `timeout`. Their
  // final statuses (KILLED) say "stopped: <why>"; assignments that arrive from now on are
  // answered FAILED "not started: <why>".
  bool StopAllAndWait(absl::Duration timeout, absl::string_view why = "the worker daemon stops");
  // StopAllAndWait in two: the stop, then the wait (true once every rank ended and its final
  // status is queued).
  void StopAll(absl::string_view why = "the worker daemon stops");
  bool WaitUntilStopped(absl::Duration timeout);
  // The stop escalated (a second stop signal): SIGKILL to every rank now, grace period or not.
  // The manager's destruction then gives up on a rank it cannot reap (uninterruptible sleep)
  // `reap_timeout` after that SIGKILL (0: at once) rather than kShutdownReapTimeout after its own.
  void KillAll(absl::Duration reap_timeout);

 private:
  struct RankEntry {
    std::string job_id;
    int attempt = 0;
    int rank = 0;
    int slot = 0;
    pid_t pid = -1;
    dropless::v1::RankState state = dropless::v1::RANK_STATE_STARTING;
    bool cancelled = false;
    bool bad_report_logged = false;
    std::string last_output;  // last line it printed, quoted in failure messages
    std::optional<PhaseReport> phase;  // the step phase it reported last (hang watchdog)
  };

  void StartRank(const dropless::v1::Assignment& assignment, int rank, int slot,
                 const std::string& spec_path, const std::string& attempt_dir);
  void OnOutput(RankSupervisor::ChildId id, absl::string_view line);
  void OnReport(RankSupervisor::ChildId id, absl::string_view line);
  void OnPhaseLine(RankSupervisor::ChildId id, absl::string_view line);
  void OnExit(RankSupervisor::ChildId id, const ChildExit& exit);
  void PushStatus(const RankEntry& entry, dropless::v1::RankState state, int exit_code,
                  const std::string& message);
  // The rank and its GPU (index and UUID on a cuda worker) as the metrics label it.
  RankIdentity IdentityOf(const RankEntry& entry) const;
  void UpdateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PruneJobDirs(const std::string& keep);

  const RankManagerOptions options_;
  OutboundQueue* const outbound_;
  WorkerMetrics* const metrics_;

  mutable absl::Mutex mu_;
  std::map<RankSupervisor::ChildId, RankEntry> ranks_ ABSL_GUARDED_BY(mu_);
  RankSupervisor::ChildId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);  // set by StopAll: no new ranks

  // Last member: destroyed first, so its callbacks never see a half-destroyed manager.
  std::unique_ptr<RankSupervisor> supervisor_;
};

// Path-safe form of a coordinator-given id (anything but [A-Za-z0-9._-] becomes '_').
std::string SafePathComponent(const std::string& id);

}  // namespace dropless

#endif  // DROPLESS_WORKER_DAEMON_RANK_MANAGER_H_
