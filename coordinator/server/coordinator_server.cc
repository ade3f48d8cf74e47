#include "coordinator/server/coordinator_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace dropless::coordinator {
namespace {

constexpr const char* kServices[] = {"dropless.v1.JobService", "dropless.v1.WorkerService",
                                     "dropless.v1.RendezvousService"};

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorConfig& config) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->metrics_ = std::make_unique<CoordinatorMetrics>();

  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(config.db);
  if (!store.ok()) return store.status();
  CoordinatorOptions options;
  options.heartbeat_interval_ms = config.heartbeat_interval_ms;
  options.lease_timeout_ms = config.lease_timeout_ms;
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator =
      Coordinator::Create(std::move(*store), options, server->metrics_.get());
  if (!coordinator.ok()) return coordinator.status();
  server->coordinator_ = std::move(*coordinator);

  if (config.metrics_port != 0) {
    std::string bind = config.metrics_address.find(':') != std::string::npos
                           ? absl::StrCat("[", config.metrics_address, "]:", config.metrics_port)
                           : absl::StrCat(config.metrics_address, ":", config.metrics_port);
    try {
      server->exposer_ = std::make_unique<prometheus::Exposer>(bind, 2);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("metrics endpoint ", bind, " could not be opened: ", e.what()));
    }
    server->exposer_->RegisterCollectable(server->metrics_->registry());
    std::vector<int> ports = server->exposer_->GetListeningPorts();
    server->metrics_port_ = ports.empty() ? config.metrics_port : ports.front();
  }

  server->job_service_ = std::make_unique<JobServiceImpl>(server->coordinator_.get());
  server->worker_service_ = std::make_unique<WorkerServiceImpl>(server->coordinator_.get());
  server->rendezvous_service_ =
      std::make_unique<RendezvousServiceImpl>(server->coordinator_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.listen, grpc::InsecureServerCredentials(), &server->grpc_port_);
  // gRPC binds with SO_REUSEPORT by default: a second coordinator on a taken port would start and
  // silently share the connections with the first. Refuse the port instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(server->job_service_.get());
  builder.RegisterService(server->worker_service_.get());
  builder.RegisterService(server->rendezvous_service_.get());
  // Workers keep their session alive with HTTP/2 pings; accept them as often as every 5 s.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // The coordinator pings its clients too, so a watcher or log follower whose host vanished frees
  // its server thread within ~40 s instead of when TCP gives up.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<RpcMetricsInterceptorFactory>(server->metrics_.get()));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->grpc_port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("gRPC server could not listen on ", config.listen,
                     " (address in use or not valid?)"));
  }
  grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService();
  if (health != nullptr) {
    health->SetServingStatus(true);
    for (const char* service : kServices) health->SetServingStatus(service, true);
  }
  server->coordinator_->Start();
  LogInfo(absl::StrCat("serving gRPC on port ", server->grpc_port_,
                       " (", config.listen, "), /metrics on port ",
                       server->metrics_port_ == 0 ? std::string("(disabled)")
                                                  : absl::StrCat(server->metrics_port_),
                       ", job store ", config.db));
  return server;
}

void CoordinatorServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  if (server_ != nullptr) {
    if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
      health->SetServingStatus(false);
    }
  }
  if (coordinator_ != nullptr) coordinator_->Shutdown();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoSeconds(grace));
    server_->Wait();
    LogInfo("gRPC server stopped");
  }
  exposer_.reset();
  coordinator_.reset();  // closes the job store
  LogInfo("stopped");
}

CoordinatorServer::~CoordinatorServer() { Shutdown(absl::Seconds(5)); }

}  // namespace dropless::coordinator
