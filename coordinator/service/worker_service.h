// WorkerService over the Coordinator: registration and the long-lived session stream
// (docs/architecture.md, "Worker session protocol").
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
  // Reads on the handler's thread; a second thread writes what the coordinator queues. Ends with
  // the coordinator's error when a message breaks the protocol (no Hello first, unknown worker).
  grpc::Status Session(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) override;

 private:
  Coordinator* const coordinator_;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_SERVICE_WORKER_SERVICE_H_
