#include "coordinator/auth/caller.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/auth/call_authorizer.h"

namespace dropless::coordinator {
namespace {

std::string Property(const grpc::ServerContext& context, const char* name) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return std::string();
  std::vector<grpc::string_ref> values = auth->FindPropertyValues(name);
  return values.empty() ? std::string() : std::string(values[0].data(), values[0].size());
}

}  // namespace

Caller CallerOf(const grpc::ServerContext& context) {
  Caller caller;
  const std::string role = Property(context, kRoleProperty);
  if (role.empty()) return caller;  // plaintext listener: CallAuthorizer lets no call through
  caller.user = Property(context, kUserProperty);
  absl::StatusOr<Role> parsed = ParseRole(role);
  caller.role = parsed.ok() ? *parsed : Role::kViewer;
  return caller;
}

absl::Status CheckJobAccess(const Caller& caller, const std::string& job_id,
                            const std::string& owner) {
  if (caller.CanAccessJobOf(owner)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "job ", job_id, " belongs to ", owner.empty() ? std::string("nobody (made before users)")
                                                    : absl::StrCat("user ", owner),
      "; user ", caller.user, " (role submitter) may only use their own jobs"));
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

std::string NodeOf(const grpc::ServerContext& context) {
  return Property(context, kNodeProperty);
}

absl::Status CheckNodeIdentity(const grpc::ServerContext& context, const std::string& node) {
  const std::string certified = NodeOf(context);
  if (certified.empty() || certified == node) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("node \"", node, "\" does not match the client certificate, which is node \"",
                   certified, "\": a worker may only register and report as itself"));
}

}  // namespace dropless::coordinator
