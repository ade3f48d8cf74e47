// Support for the coordinator's integration tests: the real dropless-coordinator binary on
// loopback with a temporary database, and a minimal worker that speaks the worker protocol
// (register, Hello, heartbeats, rank status, metrics, logs) under the test's control.
#ifndef DROPLESS_TESTS_INTEGRATION_COORDINATOR_COORDINATOR_TEST_SUPPORT_H_
#define DROPLESS_TESTS_INTEGRATION_COORDINATOR_COORDINATOR_TEST_SUPPORT_H_

#include <grpcpp/grpcpp.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dropless/v1/job_service.grpc.pb.h"
#include "dropless/v1/rendezvous_service.grpc.pb.h"
#include "dropless/v1/worker_service.grpc.pb.h"
#include "tests/integration/harness/process.h"

namespace dropless::testing {

// Lease settings the tests run with: short, so lost workers are noticed within seconds.
inline constexpr int64_t kHeartbeatMs = 200;
inline constexpr int64_t kLeaseMs = 1500;
// For tests where a worker must reconnect within the lease (after a restart or a blip): long
// enough for a slow, loaded CI machine to get there.
inline constexpr int64_t kReconnectLeaseMs = 6000;

// A job spec: `ranks` CPU ranks (ep = ranks), a few steps, the given attempts.
std::string TinySpec(int ranks, int max_attempts = 1, const std::string& name = "tiny");

// dropless-coordinator on 127.0.0.1 with a free gRPC and metrics port.
class CoordinatorUnderTest {
 public:
  // db empty: a fresh temporary file. extra_flags: more dropless-coordinator flags, given to
  // every restart too.
  static std::unique_ptr<CoordinatorUnderTest> Start(const std::string& db = "",
                                                     int64_t lease_ms = kLeaseMs,
                                                     std::vector<std::string> extra_flags = {});
  ~CoordinatorUnderTest();

  const std::string& db() const { return db_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(grpc_port_); }
  int metrics_port() const { return metrics_port_; }
  Process& process() { return *process_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  v1::JobService::Stub& jobs() { return *jobs_; }
  v1::RendezvousService::Stub& rendezvous() { return *rendezvous_; }

  // kill -9, then the same binary on the same database and ports.
  void KillAndRestart();
  // kill -9 and wait for the process: its database may be read (StoredAttemptState) until
  // Restart starts the same binary on it and the same ports again.
  void Kill();
  void Restart() { Launch(); }

  // Polls GetJob until pred holds; the last job seen either way.
  v1::Job WaitForJob(const std::string& id, const std::function<bool(const v1::Job&)>& pred,
                     absl::Duration timeout = absl::Seconds(15));
  v1::Job WaitForState(const std::string& id, v1::JobState state,
                       absl::Duration timeout = absl::Seconds(15));
  absl::StatusOr<v1::Job> Submit(const std::string& spec, const std::string& name = "",
                                 int priority = 0);
  absl::StatusOr<v1::Job> Get(const std::string& id);
  std::vector<v1::Event> Events(const std::string& job_id);
  std::vector<v1::Worker> Workers();
  // Waits (up to 20 s) until the worker of `node` is in `state`; whether it got there.
  bool WaitForWorkerState(const std::string& node, v1::WorkerState state);

 private:
  void Launch();

  std::string db_;
  int64_t lease_ms_ = kLeaseMs;
  std::vector<std::string> extra_flags_;
  int grpc_port_ = 0;
  int metrics_port_ = 0;
  std::unique_ptr<Process> process_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::RendezvousService::Stub> rendezvous_;
};

// A worker daemon reduced to its protocol: the test decides what its ranks report.
// RendezvousService calls with a 30 s deadline (a hung coordinator fails the test, not CI).
inline grpc::Status RendezvousPut(v1::RendezvousService::Stub& stub, const v1::Scope& scope,
                                  const std::string& key, const std::string& value) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::PutRequest request;
  *request.mutable_scope() = scope;
  request.set_key(key);
  request.set_value(value);
  v1::PutResponse response;
  return stub.Put(&context, request, &response);
}

inline grpc::Status RendezvousGet(v1::RendezvousService::Stub& stub, const v1::Scope& scope,
                                  const std::string& key, v1::GetResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::GetRequest request;
  *request.mutable_scope() = scope;
  request.set_key(key);
  return stub.Get(&context, request, response);
}

inline grpc::Status RendezvousWait(v1::RendezvousService::Stub& stub, const v1::Scope& scope,
                                   const std::vector<std::string>& keys, int64_t timeout_ms) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::WaitRequest request;
  *request.mutable_scope() = scope;
  for (const std::string& k : keys) request.add_keys(k);
  request.set_timeout_ms(timeout_ms);
  v1::WaitResponse response;
  return stub.Wait(&context, request, &response);
}

class FakeWorker {
 public:
  FakeWorker(std::shared_ptr<grpc::Channel> channel, std::string node, int slots,
             std::string slot_kind = "cpu");
  ~FakeWorker();

  // Registers as the daemon run of the last Connect (its boot_id; "" before the first), or as
  // the run `boot_id` (which the next Connect should then use).
  absl::Status Register(std::optional<std::string> boot_id = std::nullopt);
  // Opens the session and says Hello with the ranks it still runs (and boot_id: a new one is a
  // restarted daemon); heartbeats start.
  // also_list: more RankStatus entries for the Hello (the daemon lists ranks that ended while it
  // had no session, from its unacknowledged queue).
  absl::Status Connect(const std::string& boot_id = "",
                       const std::vector<v1::RankStatus>& also_list = {});
  // Register(boot_id), then Connect(boot_id): a daemon run joining the cluster.
  absl::Status Join(const std::string& boot_id = "boot-1");
  // Ends the session from the worker's side (the stream is cancelled).
  void Disconnect();
  // The total memory its registration reports for each GPU (cuda workers; none by default).
  void SetGpuMemoryBytes(int64_t bytes) { gpu_memory_bytes_ = bytes; }
  // Whether the next Hellos say Hello.takes_resent_assignments (as today's daemons do).
  void SetTakesResentAssignments(bool takes) { takes_resent_assignments_ = takes; }
  // Keeps the stream open but sends nothing more: a hung worker.
  void StopHeartbeats() { heartbeats_on_ = false; }
  void ResumeHeartbeats() { heartbeats_on_ = true; }

  // The next message from the coordinator that matches, waiting up to timeout.
  std::optional<v1::CoordinatorMessage> Next(
      const std::function<bool(const v1::CoordinatorMessage&)>& match,
      absl::Duration timeout = absl::Seconds(10));
  std::optional<v1::Assignment> NextAssignment(absl::Duration timeout = absl::Seconds(10));
  std::optional<v1::Cancellation> NextCancellation(absl::Duration timeout = absl::Seconds(10));

  // Sends a RankStatus and remembers it for the heartbeats and the next Hello.
  absl::Status ReportRank(const std::string& job_id, int attempt, int rank, v1::RankState state,
                          int exit_code = 0);
  absl::Status ReportMetrics(const std::string& job_id, int attempt, int rank, int64_t step,
                             int64_t steps, double loss);
  absl::Status ReportLog(const std::string& job_id, int attempt, int rank,
                         const std::string& text);
  absl::Status Send(const v1::WorkerMessage& message);
  // Sends them back to back in one write to the network (gRPC's buffer hint on all but the
  // last), as a daemon with a full queue does.
  absl::Status SendAll(const std::vector<v1::WorkerMessage>& messages);

  // Whether the session stream is still open (the reader has not seen its end).
  bool SessionOpen() const { return !session_ended_; }
  // The status the coordinator ended the session with, once it did.
  std::optional<grpc::Status> SessionStatus();

  const std::string& id() const { return worker_id_; }
  const std::string& node() const { return node_; }

 private:
  using RankKey = std::tuple<std::string, int, int>;
  std::vector<v1::RankStatus> LiveRanks();
  void StopThreads();

  std::unique_ptr<v1::WorkerService::Stub> stub_;
  const std::string node_;
  const int slots_;
  const std::string slot_kind_;
  std::string worker_id_;
  std::string boot_id_;  // of the last Connect
  bool takes_resent_assignments_ = false;
  int64_t gpu_memory_bytes_ = 0;  // 0: not reported

  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream_;
  std::thread reader_;
  std::thread heartbeat_;
  std::atomic<bool> heartbeats_on_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> session_ended_{true};

  absl::Mutex write_mu_;  // one writer at a time on the stream
  absl::Mutex mu_;
  std::deque<v1::CoordinatorMessage> inbox_ ABSL_GUARDED_BY(mu_);
  std::map<RankKey, v1::RankState> ranks_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> final_status_ ABSL_GUARDED_BY(mu_);
};

// Submits `spec` and runs its attempt 1 on `w` (connected, with a slot for each rank): the
// Assignment taken, each rank reported RUNNING, the job RUNNING; the job as submitted.
absl::StatusOr<v1::Job> SubmitRunning(CoordinatorUnderTest& coordinator, FakeWorker& w,
                                      const std::string& spec);
// A RankStatus of a rank of the job's attempt.
v1::RankStatus RankStatusOf(const std::string& job_id, int attempt, int rank, v1::RankState state);
// The status as a queued message with its place `seq` in the worker's queue.
v1::WorkerMessage QueuedMessage(const v1::RankStatus& status, uint64_t seq);
// Whether the coordinator acknowledges the worker's queue through `seq` within `timeout`.
bool NextAck(FakeWorker& w, uint64_t seq, absl::Duration timeout = absl::Seconds(5));
// Registers again, while the channel may still be backing off from a coordinator that died.
absl::Status RegisterAgain(FakeWorker& w, const std::string& boot_id);
// The coordinator's files may grow to `bytes` (RLIMIT_FSIZE's soft limit): at 0 every write of
// its store fails as on a full disk (EFBIG: the test must ignore SIGXFSZ, which the coordinator
// inherits). A fatal failure when the limit cannot be set.
void LimitFileSize(Process& process, rlim_t bytes);
bool HasEvent(CoordinatorUnderTest& coordinator, const std::string& job_id,
              const std::string& type);
// dropless_coordinator_store_commits_total{sync} as /metrics shows it now (sync: "full" counts
// the commits with fsync).
int64_t StoreCommits(CoordinatorUnderTest& coordinator, const std::string& sync = "full");
// dropless_coordinator_store_commit_failures_total as /metrics shows it now; -1 when absent.
int64_t StoreCommitFailures(CoordinatorUnderTest& coordinator);
// dropless_coordinator_jobs_expired_total as /metrics shows it now; -1 when absent.
int64_t JobsExpired(CoordinatorUnderTest& coordinator);
// dropless_coordinator_workers_forgotten_total as /metrics shows it now; -1 when absent.
int64_t WorkersForgotten(CoordinatorUnderTest& coordinator);
// The state of the job's attempt as its row in the database file says (read with SQLite while
// no coordinator holds the file: after Kill); NotFound when there is no row.
absl::StatusOr<v1::JobState> StoredAttemptState(const std::string& db, const std::string& job_id,
                                                int attempt);
// Runs SQL statements on the database file while no coordinator holds it (after Kill, or once
// the coordinator stopped): for a state the API cannot make, such as a job that ended long ago.
absl::Status ExecStoreSql(const std::string& db, const std::string& sql);

// One unary call by method name with raw request bytes; for calls the tests have no stub for
// (grpc.health.v1) and for malformed payloads.
grpc::Status RawUnaryCall(grpc::Channel* channel, const std::string& method,
                          const std::string& request, std::string* response);
// One request and one response on a bidirectional stream by method name (server reflection).
grpc::Status RawBidiExchange(grpc::Channel* channel, const std::string& method,
                             const std::string& request, std::string* response);

}  // namespace dropless::testing

#endif  // DROPLESS_TESTS_INTEGRATION_COORDINATOR_COORDINATOR_TEST_SUPPORT_H_
