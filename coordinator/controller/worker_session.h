// WorkerSession: the coordinator's handle on one open WorkerService.Session stream. The
// coordinator queues Assignments and Cancellations here (never blocking on the network); the RPC
// handler's writer thread drains the outbox onto the stream. Close() ends the stream from the
// coordinator's side (lease expiry, a newer session of the same worker, shutdown).
#ifndef DROPLESS_COORDINATOR_CONTROLLER_WORKER_SESSION_H_
#define DROPLESS_COORDINATOR_CONTROLLER_WORKER_SESSION_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/util/mailbox.h"
#include "dropless/v1/worker_service.pb.h"

namespace dropless::coordinator {

class WorkerSession {
 public:
  static constexpr size_t kOutboxCapacity = 4096;

  // cancel_rpc cancels the stream's RPC so its blocked reader returns.
  // certified_node: the node of the worker's client certificate, the only node this session may
  // say hello as; "" on a plaintext listener (no identity to hold it to).
  WorkerSession(std::string peer, std::string certified_node, std::function<void()> cancel_rpc)
      : peer_(std::move(peer)),
        certified_node_(std::move(certified_node)),
        cancel_rpc_(std::move(cancel_rpc)),
        outbox_(kOutboxCapacity) {}
  WorkerSession(std::string peer, std::function<void()> cancel_rpc)
      : WorkerSession(std::move(peer), "", std::move(cancel_rpc)) {}

  // Queues a message; a full outbox means the worker stopped reading, so the session ends and
  // the worker reconciles when it reconnects.
  void Send(v1::CoordinatorMessage message) {
    if (!outbox_.Push(std::move(message))) Close();
  }

  // Acknowledges every queued message of the worker up to `seq` (cumulative). At most one Ack
  // waits in the outbox at a time, and the writer sends it with the highest seq acknowledged by
  // then (TakeAck), so acknowledgements never fill the outbox however fast messages come.
  void Acknowledge(uint64_t seq) {
    bool queue = false;
    {
      absl::MutexLock lock(&mu_);
      if (seq > ack_through_) ack_through_ = seq;
      if (!ack_queued_) ack_queued_ = queue = true;
    }
    if (queue) {
      v1::CoordinatorMessage ack;
      ack.mutable_ack();
      Send(std::move(ack));
    }
  }
  // For the writer, taking an Ack from the outbox: the seq it should carry.
  uint64_t TakeAck() {
    absl::MutexLock lock(&mu_);
    ack_queued_ = false;
    return ack_through_;
  }

  void Close() {
    outbox_.Close();
    absl::MutexLock lock(&mu_);
    if (cancel_rpc_) cancel_rpc_();
  }

  // Called by the RPC handler before it returns: its context is about to go away.
  void DetachRpc() {
    absl::MutexLock lock(&mu_);
    cancel_rpc_ = nullptr;
  }

  Mailbox<v1::CoordinatorMessage>& outbox() { return outbox_; }
  const std::string& peer() const { return peer_; }
  const std::string& certified_node() const { return certified_node_; }

 private:
  const std::string peer_;
  const std::string certified_node_;
  absl::Mutex mu_;
  std::function<void()> cancel_rpc_ ABSL_GUARDED_BY(mu_);
  uint64_t ack_through_ ABSL_GUARDED_BY(mu_) = 0;
  bool ack_queued_ ABSL_GUARDED_BY(mu_) = false;
  Mailbox<v1::CoordinatorMessage> outbox_;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_CONTROLLER_WORKER_SESSION_H_
