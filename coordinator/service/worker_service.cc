#include "coordinator/service/worker_service.h"

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/time/time.h"
#include "common/api_metadata.h"
#include "coordinator/auth/caller.h"
#include "coordinator/util/byte_budget.h"
#include "coordinator/util/grpc_status.h"
#include "coordinator/util/mailbox.h"

namespace dropless::coordinator {
namespace {

// Messages of one session read ahead of the coordinator, and handled together at most: a count,
// and their bytes (a worker's message may be 4 MiB; one larger than this still goes alone).
constexpr size_t kMaxMessagesAhead = 256;
constexpr size_t kMaxBytesAhead = 16 << 20;

// A batch as the coordinator takes it, one lock at a time: a run of consecutive RankStatus
// messages together (one commit with fsync for all), every other message alone, so the lock is
// released between them (a log batch is one transaction of its own).
std::vector<std::vector<v1::WorkerMessage>> LockRuns(std::vector<v1::WorkerMessage>& batch) {
  std::vector<std::vector<v1::WorkerMessage>> runs;
  bool in_status_run = false;
  for (v1::WorkerMessage& message : batch) {
    const bool status = message.has_rank_status();
    if (runs.empty() || !status || !in_status_run) runs.emplace_back();
    runs.back().push_back(std::move(message));
    in_status_run = status;
  }
  return runs;
}

}  // namespace

grpc::Status WorkerServiceImpl::RegisterWorker(grpc::ServerContext* context,
                                               const v1::RegisterWorkerRequest* request,
                                               v1::RegisterWorkerResponse* response) {
  if (absl::Status s = CheckNodeIdentity(*context, request->node()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<v1::RegisterWorkerResponse> registered = coordinator_->RegisterWorker(*request);
  if (!registered.ok()) return ToGrpcStatus(registered.status());
  *response = std::move(*registered);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::Session(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) {
  // The session acts only for the node of the client certificate ("" on a plaintext listener).
  auto session = std::make_shared<WorkerSession>(context->peer(), NodeOf(*context),
                                                 [context] { context->TryCancel(); });
  coordinator_->AddSession(session);

  std::thread writer([&] {
    v1::CoordinatorMessage message;
    while (true) {
      auto result = session->outbox().Pop(absl::Milliseconds(200), &message);
      if (result == Mailbox<v1::CoordinatorMessage>::Result::kClosed) return;
      if (result == Mailbox<v1::CoordinatorMessage>::Result::kTimeout) {
        if (context->IsCancelled()) return;
        continue;
      }
      if (message.has_ack()) message.mutable_ack()->set_seq(session->TakeAck());
      if (!stream->Write(message)) {
        session->Close();  // the peer is gone: end the reader too
        return;
      }
    }
  });

  grpc::Status status = grpc::Status::OK;
  v1::WorkerMessage hello;
  // The Hello alone, before the reader starts: a refusal (ALREADY_EXISTS) goes out at once.
  absl::Status hello_handled = stream->Read(&hello)
                                   ? coordinator_->HandleWorkerMessages(session, {hello})
                                   : absl::CancelledError("the stream ended before a message");
  if (!hello_handled.ok()) {
    if (!absl::IsCancelled(hello_handled)) status = ToGrpcStatus(hello_handled);
  } else {
    Mailbox<v1::WorkerMessage> received(kMaxMessagesAhead);
    ByteBudget bytes_ahead(kMaxBytesAhead);
    std::thread reader([&] {
      v1::WorkerMessage message;
      // Ends with the stream, or at the next message once the handler below stopped.
      while (stream->Read(&message) && bytes_ahead.Take(message.ByteSizeLong()) &&
             received.PushWaiting(std::move(message))) {
      }
      received.Close();
    });
    std::vector<v1::WorkerMessage> batch;
    while (status.ok() && received.PopAll(absl::InfiniteDuration(), kMaxMessagesAhead, &batch) ==
                              Mailbox<v1::WorkerMessage>::Result::kItem) {
      for (std::vector<v1::WorkerMessage>& run : LockRuns(batch)) {
        size_t run_bytes = 0;
        for (const v1::WorkerMessage& m : run) run_bytes += m.ByteSizeLong();
        absl::Status handled = coordinator_->HandleWorkerMessages(session, run);
        bytes_ahead.Give(run_bytes);
        if (!handled.ok()) {
          if (auto seq = handled.GetPayload(kRefusedSeqMetadata); seq.has_value()) {
            context->AddTrailingMetadata(kRefusedSeqMetadata, std::string(*seq));
          }
          status = ToGrpcStatus(handled);
          break;
        }
      }
      batch.clear();
    }
    received.Close();
    bytes_ahead.Close();
    reader.join();
  }
  // Stop the writer before the stream goes away, and make sure nothing cancels this context
  // after the handler returned.
  session->DetachRpc();
  session->outbox().Close();
  writer.join();
  coordinator_->RemoveSession(session);
  return status;
}

}  // namespace dropless::coordinator
