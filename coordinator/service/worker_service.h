// WorkerService over the Coordinator: registration and the long-lived session stream
// (docs/worker_session.md).
#ifndef DROPLESS_COORDINATOR_SERVICE_WORKER_SERVICE_H_
#define DROPLESS_COORDINATOR_SERVICE_WORKER_SERVICE_H_

#include "coordinator/controller/coordinator.h"
#include "dropless/v1/worker_service.grpc.pb.h"

namespace dropless::coordinator {

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  explicit WorkerServiceImpl(Coordinator* coordinator) : coordinator_(coordinator) {}

  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  // The handler's thread handles the Hello, then what a reader thread has read meanwhile, all
  // of it at once (Coordinator::HandleWorkerMessages: consecutive rank statuses cost one commit
  // with fsync); a third thread writes what the coordinator queues. Ends with the coordinator's
  // error when a message breaks the protocol (no Hello first, unknown worker) or cannot be
  // stored; after the Hello, that error goes out once the blocked reader has the worker's next
  // message (a heartbeat interval at most), as a sync stream's read cannot be interrupted
  // without cancelling the call and with it the status.
  grpc::Status Session(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) override;

 private:
  Coordinator* const coordinator_;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_SERVICE_WORKER_SERVICE_H_
