#include "coordinator/metrics/rpc_metrics_interceptor.h"

#include <google/protobuf/descriptor.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dropless::coordinator {
namespace {

class RpcMetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  RpcMetricsInterceptor(CoordinatorMetrics* metrics, std::string method)
      : metrics_(metrics), method_(std::move(method)), start_(absl::Now()) {}

  ~RpcMetricsInterceptor() override {
    // A call that ended without sending a status (the client went away) still counts.
    if (!recorded_) Record("CANCELLED");
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      Record(StatusCodeName(methods->GetSendStatus().error_code()));
    }
    methods->Proceed();
  }

 private:
  void Record(absl::string_view code) {
    recorded_ = true;
    metrics_->RecordRpc(method_, code, absl::ToDoubleSeconds(absl::Now() - start_));
  }

  CoordinatorMetrics* metrics_;
  const std::string method_;
  const absl::Time start_;
  bool recorded_ = false;
};

bool IsKnownMethod(absl::string_view service, absl::string_view method) {
  static const char* const kFixed[] = {
      "grpc.health.v1.Health/Check", "grpc.health.v1.Health/Watch",
      "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"};
  std::string joined = absl::StrCat(service, "/", method);
  for (const char* fixed : kFixed) {
    if (joined == fixed) return true;
  }
  if (!absl::StartsWith(service, "dropless.v1.")) return false;
  const google::protobuf::ServiceDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(std::string(service));
  return descriptor != nullptr && descriptor->FindMethodByName(std::string(method)) != nullptr;
}

}  // namespace

std::string RpcMethodLabel(absl::string_view full_method) {
  if (!absl::ConsumePrefix(&full_method, "/")) return "other";
  size_t slash = full_method.find('/');
  if (slash == absl::string_view::npos) return "other";
  absl::string_view service = full_method.substr(0, slash);
  absl::string_view method = full_method.substr(slash + 1);
  if (!IsKnownMethod(service, method)) return "other";
  size_t dot = service.rfind('.');
  return absl::StrCat(service.substr(dot + 1), "/", method);
}

absl::string_view StatusCodeName(int code) {
  static const char* const kNames[] = {
      "OK",          "CANCELLED",          "UNKNOWN",        "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND",    "ALREADY_EXISTS", "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",         "UNAVAILABLE",    "DATA_LOSS",
      "UNAUTHENTICATED"};
  if (code < 0 || code >= static_cast<int>(sizeof(kNames) / sizeof(kNames[0]))) return "UNKNOWN";
  return kNames[code];
}

grpc::experimental::Interceptor* RpcMetricsInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new RpcMetricsInterceptor(metrics_, RpcMethodLabel(info->method()));
}

}  // namespace dropless::coordinator
