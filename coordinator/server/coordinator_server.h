// CoordinatorServer: dropless-coordinator assembled. Opens the job store, reconciles, serves
// JobService, WorkerService and RendezvousService with gRPC health checking and reflection, and
// /metrics on a port of its own. With worker_listen set, the users' API (JobService) and the
// workers' and ranks' (WorkerService, RendezvousService) are on separate listeners, so a network
// policy can keep users off the worker port.
#ifndef DROPLESS_COORDINATOR_SERVER_COORDINATOR_SERVER_H_
#define DROPLESS_COORDINATOR_SERVER_COORDINATOR_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <prometheus/exposer.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/auth/call_authorizer.h"
#include "coordinator/controller/coordinator.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "coordinator/metrics/rpc_metrics_interceptor.h"
#include "coordinator/server/coordinator_config.h"
#include "coordinator/service/job_service.h"
#include "coordinator/service/rendezvous_service.h"
#include "coordinator/service/worker_service.h"

namespace dropless::coordinator {

class CoordinatorServer {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const CoordinatorConfig& config);
  ~CoordinatorServer();

  int grpc_port() const { return grpc_port_; }
  int worker_port() const { return worker_port_; }  // 0 without worker_listen
  int metrics_port() const { return metrics_port_; }  // 0 when disabled

  // Health goes NOT_SERVING, every stream ends, in-flight calls get `grace` to finish.
  // Persisted state is left as it is for the next coordinator to reconcile.
  void Shutdown(absl::Duration grace);

 private:
  struct NamedService {
    const char* name;  // for health checks
    grpc::Service* service;
  };
  CoordinatorServer() = default;
  absl::StatusOr<std::unique_ptr<grpc::Server>> Listen(
      const std::string& address, const std::vector<NamedService>& services,
      std::shared_ptr<grpc::ServerCredentials> credentials, const CoordinatorConfig& config,
      int* port);
  // TLS credentials of a listener; with `serves_workers`, a client certificate, when presented, must
  // be signed by the worker CA (the handshake fails otherwise). A worker call without one is
  // refused by CallAuthorizer, with a status that says so (a handshake refused for a missing
  // certificate reaches the client only as "Socket closed"). Plaintext ones with config.insecure.
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ListenerCredentials(
      const CoordinatorConfig& config, bool serves_workers);

  std::shared_ptr<CallAuthorizer> authorizer_;  // null with insecure
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<StreamLimiter> streams_;  // before job_service_, which uses it
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<RendezvousServiceImpl> rendezvous_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> worker_server_;  // null without worker_listen
  std::unique_ptr<prometheus::Exposer> exposer_;
  int grpc_port_ = 0;
  int worker_port_ = 0;
  int metrics_port_ = 0;
  bool shut_down_ = false;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_SERVER_COORDINATOR_SERVER_H_
