// RendezvousService over the coordinator's RendezvousStore: the per-attempt key-value store the
// ranks use for the NCCL unique id and the Gloo store. Puts go through the coordinator, which
// stores them before they are visible.
#ifndef DROPLESS_COORDINATOR_SERVICE_RENDEZVOUS_SERVICE_H_
#define DROPLESS_COORDINATOR_SERVICE_RENDEZVOUS_SERVICE_H_

#include "coordinator/controller/coordinator.h"
#include "dropless/v1/rendezvous_service.grpc.pb.h"

namespace dropless::coordinator {

class RendezvousServiceImpl final : public v1::RendezvousService::Service {
 public:
  explicit RendezvousServiceImpl(Coordinator* coordinator)
      : coordinator_(coordinator), store_(&coordinator->rendezvous()) {}

  grpc::Status Put(grpc::ServerContext* context, const v1::PutRequest* request,
                   v1::PutResponse* response) override;
  // A key that is not set yet is found=false, not an error.
  grpc::Status Get(grpc::ServerContext* context, const v1::GetRequest* request,
                   v1::GetResponse* response) override;
  // DEADLINE_EXCEEDED names the missing keys; timeout_ms 0 checks once.
  grpc::Status Wait(grpc::ServerContext* context, const v1::WaitRequest* request,
                    v1::WaitResponse* response) override;

 private:
  // The scope's fields, then the attempt's secret (PermissionDenied for another attempt's).
  absl::Status CheckScope(const v1::Scope& scope) const;

  Coordinator* const coordinator_;
  RendezvousStore* const store_;  // Get and Wait
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_SERVICE_RENDEZVOUS_SERVICE_H_
