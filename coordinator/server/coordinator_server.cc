#include "coordinator/server/coordinator_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_security.h"
#include "common/log.h"

namespace dropless::coordinator {
namespace {

// Concurrent calls on one HTTP/2 connection (the CLI and a worker need a handful; a test's
// watchers 64).
constexpr int kMaxStreamsPerConnection = 100;

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> CoordinatorServer::ListenerCredentials(
    const CoordinatorConfig& config, bool serves_workers) {
  if (config.insecure) return grpc::InsecureServerCredentials();
  absl::StatusOr<PemKeyPair> pair =
      ReadPemKeyPair(config.tls_cert, "tls_cert", config.tls_key, "tls_key");
  if (!pair.ok()) return pair.status();
  absl::StatusOr<std::string> worker_ca = ReadPemCertificates(config.worker_ca, "worker_ca");
  if (!worker_ca.ok()) return worker_ca.status();
  grpc::SslServerCredentialsOptions options(serves_workers
                                                ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY
                                                : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_root_certs = *worker_ca;
  options.pem_key_cert_pairs.push_back({pair->private_key, pair->cert_chain});
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(options);
  credentials->SetAuthMetadataProcessor(authorizer_);
  return credentials;
}

absl::StatusOr<std::unique_ptr<grpc::Server>> CoordinatorServer::Listen(
    const std::string& address, const std::vector<NamedService>& services,
    std::shared_ptr<grpc::ServerCredentials> credentials, const CoordinatorConfig& config,
    int* port) {
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  // Each open call of the sync server holds a thread: bound them per listener (beyond, a new call
  // is refused RESOURCE_EXHAUSTED by gRPC), so a flood on the users' port cannot take the
  // workers', and bound the calls one connection may have open at once.
  grpc::ResourceQuota quota(absl::StrCat("dropless-coordinator ", address));
  quota.SetMaxThreads(config.max_server_threads);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
  builder.AddListeningPort(address, std::move(credentials), port);
  // gRPC binds with SO_REUSEPORT by default: a second coordinator on a taken port would start and
  // silently share the connections with the first. Refuse the port instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  for (const NamedService& service : services) builder.RegisterService(service.service);
  // Workers keep their session alive with HTTP/2 pings; accept them as often as every 5 s.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // The coordinator pings its clients too, so a watcher or log follower whose host vanished frees
  // its server thread within ~40 s instead of when TCP gives up.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<RpcMetricsInterceptorFactory>(metrics_.get()));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) {
    return absl::UnavailableError(absl::StrCat("gRPC server could not listen on ", address,
                                               " (address in use or not valid?)"));
  }
  if (grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService()) {
    health->SetServingStatus(true);
    for (const NamedService& service : services) health->SetServingStatus(service.name, true);
  }
  return server;
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorConfig& config) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->metrics_ = std::make_unique<CoordinatorMetrics>();
  if (config.insecure) {
    LogWarning("INSECURE: --insecure given: every listener is plaintext gRPC and no call is "
               "authenticated (anyone who reaches a port may submit, cancel, or act as any "
               "worker). For development only; docs/security.md says how to run with TLS.");
  } else {
    absl::StatusOr<UserTokens> tokens = UserTokens::LoadFile(config.tokens_file);
    if (!tokens.ok()) return tokens.status();
    LogInfo(absl::StrCat("TLS on every listener; ", tokens->size(), " user token(s) from ",
                         config.tokens_file, "; workers need a certificate from ",
                         config.worker_ca, "; at most ", config.submit_rate_per_second,
                         " submissions per second per token (burst ", config.submit_burst,
                         "); priorities above ", config.max_user_priority, " need role admin"));
    server->authorizer_ = std::make_shared<CallAuthorizer>(
        std::make_shared<const UserTokens>(*std::move(tokens)),
        std::make_shared<SubmitRateLimiter>(config.submit_rate_per_second, config.submit_burst));
  }

  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(config.db);
  if (!store.ok()) return store.status();
  CoordinatorOptions options;
  options.max_unfinished_jobs_per_user = config.max_unfinished_jobs_per_user;
  options.heartbeat_interval_ms = config.heartbeat_interval_ms;
  options.lease_timeout_ms = config.lease_timeout_ms;
  options.hang.step_multiple = config.hang_step_multiple;
  options.hang.min_stall_ms = config.hang_min_stall_ms;
  options.hang.first_step_ms = config.hang_first_step_ms;
  options.job_retention = config.job_retention;
  options.lost_worker_expiry = config.lost_worker_expiry;
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
    server->exposer_->RegisterCollectable(server->metrics_->collectable());
    std::vector<int> ports = server->exposer_->GetListeningPorts();
    server->metrics_port_ = ports.empty() ? config.metrics_port : ports.front();
  }

  server->streams_ =
      std::make_unique<StreamLimiter>(config.max_streams_per_user, config.max_streams);
  server->job_service_ = std::make_unique<JobServiceImpl>(
      server->coordinator_.get(), server->authorizer_ ? server->authorizer_->tokens() : nullptr,
      server->streams_.get(), config.max_user_priority);
  server->worker_service_ = std::make_unique<WorkerServiceImpl>(server->coordinator_.get());
  server->rendezvous_service_ =
      std::make_unique<RendezvousServiceImpl>(server->coordinator_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  std::vector<NamedService> user_services = {
      {"dropless.v1.JobService", server->job_service_.get()}};
  std::vector<NamedService> worker_services = {
      {"dropless.v1.WorkerService", server->worker_service_.get()},
      {"dropless.v1.RendezvousService", server->rendezvous_service_.get()}};
  if (config.worker_listen.empty()) {
    // One listener for everything.
    user_services.insert(user_services.end(), worker_services.begin(), worker_services.end());
    worker_services.clear();
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> user_credentials =
      server->ListenerCredentials(config, /*serves_workers=*/worker_services.empty());
  if (!user_credentials.ok()) return user_credentials.status();
  absl::StatusOr<std::unique_ptr<grpc::Server>> user =
      server->Listen(config.listen, user_services, *user_credentials, config, &server->grpc_port_);
  if (!user.ok()) return user.status();
  server->server_ = std::move(*user);
  if (!worker_services.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> worker_credentials =
        server->ListenerCredentials(config, /*serves_workers=*/true);
    if (!worker_credentials.ok()) return worker_credentials.status();
    absl::StatusOr<std::unique_ptr<grpc::Server>> workers = server->Listen(
        config.worker_listen, worker_services, *worker_credentials, config, &server->worker_port_);
    if (!workers.ok()) return workers.status();
    server->worker_server_ = std::move(*workers);
  }
  server->coordinator_->Start();
  LogInfo(absl::StrCat(config.insecure ? "serving PLAINTEXT (insecure) gRPC on port "
                                       : "serving gRPC over TLS on port ",
                       server->grpc_port_,
                       " (", config.listen, ")",
                       server->worker_port_ == 0
                           ? std::string()
                           : absl::StrCat(", workers and ranks on port ", server->worker_port_,
                                          " (", config.worker_listen, ")"),
                       ", /metrics on port ",
                       server->metrics_port_ == 0 ? std::string("(disabled)")
                                                  : absl::StrCat(server->metrics_port_),
                       ", job store ", config.db));
  return server;
}

void CoordinatorServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  for (grpc::Server* server : {server_.get(), worker_server_.get()}) {
    if (server == nullptr) continue;
    if (grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService()) {
      health->SetServingStatus(false);
    }
  }
  if (coordinator_ != nullptr) coordinator_->Shutdown();
  const auto deadline = std::chrono::system_clock::now() + absl::ToChronoSeconds(grace);
  for (grpc::Server* server : {server_.get(), worker_server_.get()}) {
    if (server == nullptr) continue;
    server->Shutdown(deadline);
    server->Wait();
  }
  if (server_ != nullptr) LogInfo("gRPC server stopped");
  exposer_.reset();
  coordinator_.reset();  // closes the job store
  LogInfo("stopped");
}

CoordinatorServer::~CoordinatorServer() { Shutdown(absl::Seconds(5)); }

}  // namespace dropless::coordinator
