// WorkerRegistry: the worker-facing state of the coordinator. Who the workers are (id by node,
// registration), their Session streams and whose certificate may speak for which node, their
// leases, which of their slots a rank process holds, and the messages sent down to them.
// It knows no jobs: the Coordinator (the job controller) decides what a lost worker or a stray
// rank means for an attempt, and stores what this registry puts into a StoreWrite.
//
// Not thread-safe: its owner serializes every call (the Coordinator, under its lock).
#ifndef DROPLESS_COORDINATOR_CONTROLLER_WORKER_REGISTRY_H_
#define DROPLESS_COORDINATOR_CONTROLLER_WORKER_REGISTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/controller/worker_session.h"
#include "coordinator/scheduler/gang_scheduler.h"
#include "coordinator/store/job_store.h"
#include "dropless/v1/worker_service.pb.h"

namespace dropless::coordinator {

// The rank process that holds a slot, from the moment its placement is decided until the worker
// reports its end (or its lease runs out, or a Hello of a later session leaves it out).
struct RankKey {
  std::string job_id;
  int32_t attempt = 0;
  int32_t rank = 0;
  // Whether the worker has said anything of this rank (a status, or it listed the rank in a Hello
  // or heartbeat). Until then its Assignment may still be on its way, and a heartbeat that does
  // not list the rank, written before the Assignment arrived, says nothing about it: the slot
  // stays taken, also once its attempt ended (the worker starts the rank when the Assignment
  // arrives, and reports its end).
  bool reported = false;
};

struct WorkerEntry {
  v1::Worker info;
  std::shared_ptr<WorkerSession> session;  // null while disconnected
  int64_t last_message_ms = 0;
  bool lease_expired = false;           // handled; cleared by the next Hello
  std::map<int32_t, RankKey> occupied;  // slot -> the rank process holding it
  // The worker daemon's run (Hello.boot_id) and the highest queued-message seq handled from it:
  // a message sent again after a reconnect is acknowledged but not stored twice.
  std::string boot_id;
  uint64_t last_seq = 0;
  // Whether boot_id's run said hello to this coordinator process. After a restart the run the
  // store names (its receipt) has not: its resends are still recognized (Handled), and it holds
  // the node against another run (CheckNodeIsFree) only while a rank process holds a slot here
  // (`occupied`, from the stored active attempts), until its lease runs out or it says hello.
  bool hello_here = false;
  // Why its ranks may have gone away, until its next Hello: when its session ended while this
  // coordinator ran (0: connected, or not seen since the coordinator started), and the reason of
  // its Goodbye (the daemon is shutting down). A peer rank's failure names them as the cause.
  int64_t disconnected_ms = 0;
  std::string leaving;
  // Since when it has been away for the scheduler (Capacity: away for one lease from then): when
  // its session ended while this coordinator ran, or, for a worker stored READY, when this
  // coordinator started. 0: connected, never connected to this process since (a registration is
  // no sign of a session to come), or LOST before the restart.
  int64_t away_since_ms = 0;
  // RegisterWorkerRequest.boot_id of its last registration ("" from a worker that predates it):
  // the run whose address and slots the entry holds, the only one that may say hello next.
  std::string registered_boot_id;
  // While it is LOST: since when it has been away (stored with its row, WorkerRecord), what
  // --lost-worker-expiry counts from; 0 while READY.
  int64_t lost_since_ms = 0;
};

class WorkerRegistry {
 public:
  explicit WorkerRegistry(int64_t lease_timeout_ms) : lease_timeout_ms_(lease_timeout_ms) {}

  // Start-up: the stored workers (state.workers), each LOST until it says Hello on a new session,
  // with its lease running from now_ms, and the last message stored from each (state.receipts,
  // so that its resend is not stored twice); new ids continue after every number given before,
  // forgotten workers' too. Away since: a worker stored LOST keeps its stored time (its absence
  // began before the restart and goes on); one stored READY (connected when the last coordinator
  // stopped) or with no stored time (a file older than schema 5) is away from now_ms: the
  // coordinator's downtime is not counted against it. Only a worker stored READY is away for the
  // scheduler (WorkerEntry::away_since_ms = now_ms). Rows that change go into `write`.
  void Restore(const ActiveState& state, int64_t now_ms, StoreWrite& write);

  // InvalidArgument naming the field of a request that cannot register.
  static absl::Status CheckRegistration(const v1::RegisterWorkerRequest& request);
  // The same node always gets the same id ("worker-0001", ...); a new one starts LOST (READY once
  // its session says Hello). The worker's row and a WorkerRegistered/WorkerReregistered event go
  // into `write`. *fresh: whether the node was new. AlreadyExists (nothing changed) while another
  // daemon run of the node (another boot_id) holds it (CheckNodeIsFree).
  absl::StatusOr<const v1::Worker*> Register(const v1::RegisterWorkerRequest& request,
                                             int64_t now_ms, StoreWrite& write, bool* fresh);

  WorkerEntry* Find(const std::string& worker_id);
  size_t size() const { return workers_.size(); }

  // Sessions. A new stream is nobody's until its Hello.
  void OpenSession(const std::shared_ptr<WorkerSession>& session, int64_t now_ms);
  // The worker a session said hello as ("" before Hello); null for a session not open here.
  const std::string* SessionWorker(const std::shared_ptr<WorkerSession>& session) const;
  // Binds the session to the worker of hello.worker_id: NotFound for an unregistered id,
  // PermissionDenied when the session's certificate is another node's, AlreadyExists while another
  // daemon run (another boot_id) holds the node (CheckNodeIsFree) or registered after this one.
  // A previous session of the same run is closed (a reconnect); a new boot_id restarts the message
  // numbering (*new_run: it replaced another run, whose ranks are gone with it). A worker that
  // was not READY becomes READY (its row and a WorkerReady event into `write`).
  absl::StatusOr<WorkerEntry*> Hello(const std::shared_ptr<WorkerSession>& session,
                                     const v1::Hello& hello, int64_t now_ms, StoreWrite& write,
                                     bool* new_run = nullptr);
  // Forgets a stream that ended; the worker it had said hello as ("" if none).
  std::string ForgetSession(const std::shared_ptr<WorkerSession>& session);
  // The worker, now without a session and away since now_ms, when `session` was its current one;
  // null when a newer session superseded it (or the worker is unknown).
  WorkerEntry* Disconnect(const std::string& worker_id,
                          const std::shared_ptr<WorkerSession>& session, int64_t now_ms);
  void CloseAllSessions();

  // Whether a message of this seq was handled already in the worker's current boot (a resend
  // after a reconnect: acknowledge it again, store nothing).
  static bool Handled(const WorkerEntry& worker, uint64_t seq) {
    return seq != 0 && seq <= worker.last_seq;
  }

  // READY -> LOST, away since its last message: its row and a WorkerLost event naming `why` into
  // `write` (nothing if LOST).
  void MarkLost(WorkerEntry& worker, const std::string& why, StoreWrite& write);

  // --lost-worker-expiry. The workers that may be forgotten at now_ms: LOST and without a session
  // for longer than expiry_ms (since lost_since_ms), no message for two lease timeouts (after a
  // restart counted from the restart: a live daemon, or a new run of it, gets back in first), and
  // no slot held by a rank process (of a live attempt, or a stray one still exiting). What the
  // registry cannot see, ranks of active attempts placed on them (the rendezvous and Hello
  // reconciliation still need the worker), is the caller's to check.
  std::vector<WorkerEntry*> ForgettableWorkers(int64_t now_ms, int64_t expiry_ms);
  // Removes the worker: the deletion of its row and receipt, the highest worker number given (no
  // id is given again) and a WorkerForgotten event go into `write`; any session still bound to
  // it is closed. Should its daemon come back, it registers as a new worker (a new id).
  void Forget(const std::string& worker_id, int64_t now_ms, int64_t expiry_ms, StoreWrite& write);

  // Workers with no message for longer than the lease timeout, not handled before: marked
  // handled, their sessions closed. Sessions that never said Hello within the lease timeout are
  // closed too. What the expiry means for their ranks is the caller's.
  std::vector<WorkerEntry*> ExpireLeases(int64_t now_ms);

  // A message down a worker's session; dropped when the worker is not connected (it reconciles
  // with its Hello).
  void Send(const std::string& worker_id, v1::CoordinatorMessage message);

  // A stray rank (one the coordinator did not place there) is cancelled at most once per
  // interval per (worker, job, attempt): whether this is such a time (then it is recorded).
  bool TakeStrayCancelTurn(const std::string& worker_id, const std::string& job_id, int32_t attempt,
                           int64_t now_ms);
  // The stored placement of each stray rank is looked up (to hold its slot until it exits) at
  // most once per interval per (worker, job, attempt, rank): whether this is such a time.
  bool TakeStraySlotLookupTurn(const std::string& worker_id, const std::string& job_id,
                               int32_t attempt, int32_t rank, int64_t now_ms);

  // For the scheduler at now_ms: READY, connected workers and their free slots, and the workers
  // away for now (NodeCapacity::away) with all their slots and none free, so that a gang waiting
  // for them keeps its hold. Away: no session, no Goodbye, lease not run out, and at most one
  // lease timeout since away_since_ms (its session ended here, or it was READY when this
  // coordinator started). Registrations do not prolong it: a daemon that registers again and
  // again but never keeps a session holds nothing after one lease; one that has had no session on
  // this process (and was not READY at the restart), or was LOST before the restart, is never away.
  std::vector<NodeCapacity> Capacity(int64_t now_ms) const;
  // Every registered worker not forgotten, READY or away for now (LOST, or its daemon said
  // Goodbye: a restart as often as a drain), with all its slots and none free: what a job could
  // ever be placed on (GangFitsCapacity).
  std::vector<NodeCapacity> KnownCapacity() const;
  // Every worker as the API shows it (busy slots, last message).
  std::vector<v1::Worker> List() const;

  struct Counts {
    int64_t ready = 0;
    int64_t lost = 0;
    int64_t busy_slots = 0;  // of READY workers
    int64_t free_slots = 0;  // of READY workers
  };
  Counts Count() const;

 private:
  // Whether `key`'s turn has come (its first time, or the interval since its last): recorded.
  bool TakeStrayTurn(const std::string& key, int64_t now_ms);

  struct SessionEntry {
    std::string worker_id;  // empty until Hello
    int64_t opened_ms = 0;
  };

  // AlreadyExists when a daemon run other than `boot_id` holds the node of `worker`: the run that
  // said hello last to this coordinator process, until its lease expires (ExpireLeases) or, after
  // a Goodbye, its session ends. A run known only from the store (before a restart) holds the node
  // likewise while a rank process holds a slot of it (a duplicate daemon must not take a live
  // run's work), and nothing once none does: a new run of an idle node (its host rebooted, its
  // journal lost) takes over at once.
  absl::Status CheckNodeIsFree(const WorkerEntry& worker, const std::string& boot_id) const;
  // The worker's row as stored.
  static WorkerRecord Row(const WorkerEntry& worker) {
    return WorkerRecord{worker.info, worker.lost_since_ms};
  }

  const int64_t lease_timeout_ms_;
  std::map<std::string, WorkerEntry> workers_;
  std::map<std::string, std::string> worker_by_node_;
  std::map<std::shared_ptr<WorkerSession>, SessionEntry> sessions_;
  // (worker, job, attempt) -> when a Cancellation for a stray rank was last sent, and
  // (worker, job, attempt, rank) -> when a stray rank's slot was last looked up.
  std::map<std::string, int64_t> stray_turns_;
  int64_t next_worker_number_ = 1;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_CONTROLLER_WORKER_REGISTRY_H_
