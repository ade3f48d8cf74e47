#include "coordinator/service/rendezvous_service.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/util/duration_field.h"
#include "coordinator/util/grpc_status.h"

namespace dropless::coordinator {

namespace {

absl::Status CheckScopeFields(const v1::Scope& scope) {
  if (scope.job_id().empty()) return absl::InvalidArgumentError("scope.job_id: must not be empty");
  if (scope.attempt() <= 0) return absl::InvalidArgumentError("scope.attempt: must be positive");
  return absl::OkStatus();
}

}  // namespace

absl::Status RendezvousServiceImpl::CheckScope(const v1::Scope& scope) const {
  if (absl::Status s = CheckScopeFields(scope); !s.ok()) return s;
  return store_->Authorize(scope.job_id(), scope.attempt(), scope.secret());
}

grpc::Status RendezvousServiceImpl::Put(grpc::ServerContext*, const v1::PutRequest* request,
                                        v1::PutResponse*) {
  if (absl::Status s = CheckScope(request->scope()); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(coordinator_->RendezvousPut(request->scope().job_id(),
                                                  request->scope().attempt(), request->key(),
                                                  request->value()));
}

grpc::Status RendezvousServiceImpl::Get(grpc::ServerContext*, const v1::GetRequest* request,
                                        v1::GetResponse* response) {
  if (absl::Status s = CheckScope(request->scope()); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<std::string> value =
      store_->Get(request->scope().job_id(), request->scope().attempt(), request->key());
  if (absl::IsNotFound(value.status())) {
    response->set_found(false);
    return grpc::Status::OK;
  }
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_found(true);
  response->set_value(std::move(*value));
  return grpc::Status::OK;
}

grpc::Status RendezvousServiceImpl::Wait(grpc::ServerContext* context,
                                         const v1::WaitRequest* request, v1::WaitResponse*) {
  if (absl::Status s = CheckScope(request->scope()); !s.ok()) return ToGrpcStatus(s);
  int64_t timeout_ms = request->timeout_ms();
  if (request->has_timeout()) {
    absl::StatusOr<int64_t> ms = NonNegativeDurationMs(request->timeout(), "timeout");
    if (!ms.ok()) return ToGrpcStatus(ms.status());
    timeout_ms = *ms;
  } else if (timeout_ms < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "timeout_ms: must not be negative");
  }
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  return ToGrpcStatus(store_->Wait(request->scope().job_id(), request->scope().attempt(), keys,
                                   absl::Milliseconds(timeout_ms),
                                   [context] { return context->IsCancelled(); }));
}

}  // namespace dropless::coordinator
