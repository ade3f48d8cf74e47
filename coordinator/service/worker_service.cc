#include "coordinator/service/worker_service.h"

#include <memory>
#include <thread>
#include <utility>

#include "absl/time/time.h"
#include "coordinator/auth/caller.h"
#include "coordinator/util/grpc_status.h"

namespace dropless::coordinator {

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
  v1::WorkerMessage message;
  while (stream->Read(&message)) {
    absl::Status handled = coordinator_->HandleWorkerMessage(session, message);
    if (!handled.ok()) {
      status = ToGrpcStatus(handled);
      break;
    }
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
