#include "coordinator/auth/call_authorizer.h"

#include <grpc/grpc_security_constants.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "coordinator/auth/caller.h"
#include "coordinator/util/grpc_status.h"

namespace dropless::coordinator {
namespace {

// The least role each JobService method needs. A method missing here is refused: a new one has
// to be given a role before anyone can call it.
struct MethodRole {
  const char* method;
  Role role;
};
constexpr MethodRole kMethodRoles[] = {
    {"SubmitJob", Role::kSubmitter},    {"CancelJob", Role::kSubmitter},
    {"GetJob", Role::kViewer},          {"ListJobs", Role::kViewer},
    {"WatchJob", Role::kViewer},        {"ListEvents", Role::kViewer},
    {"GetLogs", Role::kViewer},         {"ListWorkers", Role::kViewer},
    {"ListStepMetrics", Role::kViewer}, {"GetVersion", Role::kViewer},
};

constexpr absl::string_view kJobService = "dropless.v1.JobService";
constexpr absl::string_view kHealthService = "grpc.health.v1.Health";

absl::string_view Find(const grpc::AuthMetadataProcessor::InputMetadata& metadata,
                       absl::string_view key) {
  for (const auto& [k, v] : metadata) {
    if (absl::string_view(k.data(), k.size()) == key) return absl::string_view(v.data(), v.size());
  }
  return absl::string_view();
}

size_t Count(const grpc::AuthMetadataProcessor::InputMetadata& metadata, absl::string_view key) {
  return metadata.count(grpc::string_ref(key.data(), key.size()));
}

}  // namespace

grpc::Status CallAuthorizer::Process(const InputMetadata& metadata, grpc::AuthContext* context,
                                     OutputMetadata*, OutputMetadata*) {
  absl::string_view path = Find(metadata, ":path");
  absl::ConsumePrefix(&path, "/");
  const size_t slash = path.find('/');
  const absl::string_view service = path.substr(0, slash);
  const absl::string_view method =
      slash == absl::string_view::npos ? absl::string_view() : path.substr(slash + 1);
  if (service == kJobService) return AuthorizeUser(method, metadata);
  if (service == "dropless.v1.WorkerService" || service == "dropless.v1.RendezvousService") {
    return AuthorizeWorker(service, *context);
  }
  // Health checks answer anyone who completed the handshake (probes carry no token; the server's
  // thread quota bounds them). Reflection and unknown services (answered UNIMPLEMENTED) need a
  // known caller: each reflection stream holds a server thread, anonymous ones could take all.
  if (service == kHealthService) return grpc::Status::OK;
  if (!CertifiedNode(*context).empty()) return grpc::Status::OK;
  if (Find(metadata, "authorization").empty()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat(service,
                                     " needs a bearer token (`authorization: Bearer <token>`) or a "
                                     "worker's client certificate"));
  }
  const TokenGrant* grant = nullptr;
  return CheckToken(metadata, &grant);
}

grpc::Status CallAuthorizer::CheckToken(const InputMetadata& metadata, const TokenGrant** grant) {
  // One header, or the call would have two callers: this check and the handler's CallerOf could
  // each pick another one (a user's token authorized, an admin's acted on).
  if (const size_t headers = Count(metadata, "authorization"); headers > 1) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat("the call has ", headers,
                                     " authorization headers; send exactly one `authorization: "
                                     "Bearer <token>`"));
  }
  const absl::string_view header = Find(metadata, "authorization");
  if (header.empty()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing bearer token: JobService calls need `authorization: Bearer "
                        "<token>` (dropless --token, $DROPLESS_TOKEN or --token-file)");
  }
  const absl::string_view token = BearerToken(header);
  if (token.empty()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "malformed authorization header: expected `Bearer <token>`");
  }
  const TokenGrant* found = tokens_->Find(token);
  if (found == nullptr) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "unknown bearer token: it is not in the coordinator's tokens file");
  }
  if (absl::Status s = CheckTokenUnexpired(found->user, found->expires, absl::Now()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  *grant = found;
  return grpc::Status::OK;
}

grpc::Status CallAuthorizer::AuthorizeUser(absl::string_view method,
                                           const InputMetadata& metadata) {
  const TokenGrant* grant = nullptr;
  if (grpc::Status s = CheckToken(metadata, &grant); !s.ok()) return s;
  const absl::string_view token = BearerToken(Find(metadata, "authorization"));
  const absl::Time now = absl::Now();
  const MethodRole* needed = nullptr;
  for (const MethodRole& entry : kMethodRoles) {
    if (method == entry.method) needed = &entry;
  }
  if (needed == nullptr) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("JobService/", method, " has no role assigned"));
  }
  if (grant->role < needed->role) {
    return grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        absl::StrCat("user ", grant->user, " has role ", RoleName(grant->role), "; ", method,
                     " needs role ", RoleName(needed->role), " or higher"));
  }
  if (method == "SubmitJob" && !submit_limiter_->TryTake(std::string(token), now)) {
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrFormat("submission rate limit of user %s exceeded: at most %g submissions per "
                        "second per token (burst %g; --submit-rate-per-second)",
                        grant->user, submit_limiter_->per_second(), submit_limiter_->burst()));
  }
  // Nothing is recorded on the (connection-wide) AuthContext: CallerOf reads this call's header.
  return grpc::Status::OK;
}

grpc::Status CallAuthorizer::AuthorizeWorker(absl::string_view service,
                                             const grpc::AuthContext& context) {
  if (CertifiedNode(context).empty()) {
    return grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        absl::StrCat(service, " needs a worker's client certificate (mutual TLS; the node name "
                              "is its common name): none was presented"));
  }
  return grpc::Status::OK;
}

}  // namespace dropless::coordinator
