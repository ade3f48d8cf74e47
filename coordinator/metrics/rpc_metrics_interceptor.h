// A gRPC server interceptor that counts every call by method and status code and times it
// (dropless_coordinator_rpcs_total, dropless_coordinator_rpc_duration_seconds). Method labels are
// limited to the coordinator's own services, health and reflection; anything else is "other", so
// a client cannot mint label values.
#ifndef DROPLESS_COORDINATOR_METRICS_RPC_METRICS_INTERCEPTOR_H_
#define DROPLESS_COORDINATOR_METRICS_RPC_METRICS_INTERCEPTOR_H_

#include <memory>
#include <string>

#include <grpcpp/support/server_interceptor.h>

#include "absl/strings/string_view.h"
#include "coordinator/metrics/coordinator_metrics.h"

namespace dropless::coordinator {

class RpcMetricsInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsInterceptorFactory(CoordinatorMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  CoordinatorMetrics* metrics_;
};

// "/dropless.v1.JobService/SubmitJob" -> "JobService/SubmitJob"; unknown methods -> "other".
std::string RpcMethodLabel(absl::string_view full_method);
// grpc::StatusCode -> "OK", "NOT_FOUND", ...
absl::string_view StatusCodeName(int code);

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_METRICS_RPC_METRICS_INTERCEPTOR_H_
