#include "coordinator/auth/caller.h"

#include <grpc/grpc_security_constants.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "coordinator/store/job_not_found.h"

namespace dropless::coordinator {

Caller CallerOf(const grpc::ServerContext& context, const UserTokens* tokens) {
  Caller caller;  // the anonymous admin of a plaintext listener
  if (tokens == nullptr) return caller;
  // The call's own header (never the connection's AuthContext, which its calls share); its only
  // one: CallAuthorizer refuses a call with several.
  // A call without a known token (CallAuthorizer refuses those before any handler): a submitter
  // whose name no job's owner can have, so it may act on no job, ownerless ones included.
  caller.role = Role::kSubmitter;
  caller.user = std::string(1, '\0');
  const auto& metadata = context.client_metadata();
  auto header = metadata.find("authorization");
  if (header == metadata.end()) return caller;
  const absl::string_view token =
      BearerToken(absl::string_view(header->second.data(), header->second.size()));
  if (token.empty()) return caller;
  const TokenGrant* grant = tokens->Find(token);
  if (grant == nullptr) return caller;
  caller.user = grant->user;
  caller.role = grant->role;
  caller.token_expires = grant->expires;
  return caller;
}

absl::string_view BearerToken(absl::string_view header) {
  return absl::ConsumePrefix(&header, "Bearer ") ? header : absl::string_view();
}

absl::Status CheckJobAccess(const Caller& caller, const std::string& job_id,
                            const std::string& owner) {
  if (caller.CanAccessJobOf(owner)) return absl::OkStatus();
  return JobNotFoundError(job_id);
}

absl::StatusOr<std::optional<std::string>> ListedOwner(const Caller& caller,
                                                       const std::string& requested) {
  if (requested.empty()) {
    if (caller.role == Role::kSubmitter) return std::optional<std::string>(caller.user);
    return std::optional<std::string>();
  }
  if (!caller.CanAccessJobOf(requested)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "owner: user ", caller.user, " (role submitter) may only list their own jobs, not user ",
        requested, "'s"));
  }
  return std::optional<std::string>(requested);
}

std::string CertifiedNode(const grpc::AuthContext& context) {
  std::vector<grpc::string_ref> values = context.FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
  return values.empty() ? std::string() : std::string(values[0].data(), values[0].size());
}

std::string NodeOf(const grpc::ServerContext& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  return auth == nullptr ? std::string() : CertifiedNode(*auth);
}

absl::Status CheckNodeIdentity(const grpc::ServerContext& context, const std::string& node) {
  const std::string certified = NodeOf(context);
  if (certified.empty() || certified == node) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("node \"", node, "\" does not match the client certificate, which is node \"",
                   certified, "\": a worker may only register and report as itself"));
}

}  // namespace dropless::coordinator
