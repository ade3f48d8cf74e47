// CoordinatorSession: the worker daemon's link to the coordinator (docs/worker_session.md).
// Registers, opens the Session stream, says Hello with the ranks still alive, then sends
// heartbeats at the interval the coordinator gave and drains the outbound queue, while
// Assignments and Cancellations coming down go to the RankManager.
//
// When registration or the stream fails (coordinator restart, network blip) it retries with
// exponential backoff and re-registers; ranks keep running meanwhile and what they report waits
// in the outbound queue. A stream the coordinator ends with InvalidArgument refused a queued
// message as malformed: the queue drops it (OutboundQueue::SessionEnded, counted in
// dropless_worker_outbound_refused_total) and the session reconnects at once with the rest.
#ifndef DROPLESS_WORKER_DAEMON_COORDINATOR_SESSION_H_
#define DROPLESS_WORKER_DAEMON_COORDINATOR_SESSION_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dropless/v1/worker_service.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "worker/daemon/outbound_queue.h"
#include "worker/daemon/rank_manager.h"
#include "worker/daemon/worker_metrics.h"

namespace dropless {

struct SessionOptions {
  std::string coordinator;                         // host:port
  // Mutual TLS (or plaintext); null: plaintext, for tests that build sessions directly.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  dropless::v1::RegisterWorkerRequest registration;
  absl::Duration min_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(3);
  absl::Duration rpc_timeout = absl::Seconds(10);  // RegisterWorker deadline
  // Hello.boot_id: names the numbering of the outbound queue's messages. Empty: a new one (the
  // daemon passes the one its outbound journal kept, so a restart continues the numbering).
  std::string boot_id;
};

class CoordinatorSession {
 public:
  // The manager, queue and metrics outlive the session.
  CoordinatorSession(SessionOptions options, RankManager* ranks, OutboundQueue* outbound,
                     WorkerMetrics* metrics);

  // Registers and keeps a session open until Shutdown(); returns OK then. Returns the error when
  // the coordinator refuses the registration as invalid (InvalidArgument: retrying cannot help).
  // A node held by another daemon run (AlreadyExists) is retried: the node is free again once
  // that run's session ends.
  absl::Status Run();
  // Ends Run(): cancels the open stream and stops retrying. Safe from any thread.
  void Shutdown();

  // Nothing of the outbound queue is left to send, or no session is open to send it on (the
  // daemon's stop waits for this before exiting, DaemonStop).
  bool Flushed() const;
  // Tells the coordinator the daemon is shutting down (Goodbye), ahead of anything queued after
  // this call; waits up to `timeout` for it to be written. False when no session is open.
  bool SayGoodbye(const std::string& reason, absl::Duration timeout);

  std::string worker_id() const;
  bool connected() const;

  // 128 random bits in hex.
  static std::string NewBootId();

 private:
  absl::Status Register();
  // The final statuses still in the outbound queue of ranks not in `listed` (the live ones).
  std::vector<dropless::v1::RankStatus> EndedRanksStillQueued(
      const google::protobuf::RepeatedPtrField<dropless::v1::RankStatus>& listed) const;
  // One session: Hello, then until the stream breaks or Shutdown(). Returns why it ended;
  // *dropped_refused tells whether the coordinator refused a queued message, now dropped.
  absl::Status RunSession(bool* dropped_refused);
  // Heartbeats and the outbound queue until *stop; false when a write failed.
  bool WriteLoop(grpc::ClientReaderWriter<dropless::v1::WorkerMessage,
                                          dropless::v1::CoordinatorMessage>* stream,
                 std::atomic<bool>* stop);
  bool SleepUnlessShutdown(absl::Duration d);

  const SessionOptions options_;
  RankManager* const ranks_;
  OutboundQueue* const outbound_;
  WorkerMetrics* const metrics_;
  const std::string boot_id_;  // Hello.boot_id
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<dropless::v1::WorkerService::Stub> stub_;

  mutable absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  bool acknowledged_ ABSL_GUARDED_BY(mu_) = false;  // the coordinator acknowledges (Register)
  grpc::ClientContext* open_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  int sessions_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<std::string> goodbye_ ABSL_GUARDED_BY(mu_);  // to send; cleared once written
};

}  // namespace dropless

#endif  // DROPLESS_WORKER_DAEMON_COORDINATOR_SESSION_H_
