// absl::Status <-> grpc::Status: the codes are numerically identical by design of both.
#ifndef DROPLESS_COORDINATOR_UTIL_GRPC_STATUS_H_
#define DROPLESS_COORDINATOR_UTIL_GRPC_STATUS_H_

#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace dropless::coordinator {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_UTIL_GRPC_STATUS_H_
