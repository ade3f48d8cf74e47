// Who made a call: the user of the call's bearer token, or the node of the connection's worker
// certificate, both already checked by CallAuthorizer (call_authorizer.h).
// On a plaintext listener (--insecure, development only) nobody is authenticated: every caller is
// the anonymous admin, and ownership is not enforced.
#ifndef DROPLESS_COORDINATOR_AUTH_CALLER_H_
#define DROPLESS_COORDINATOR_AUTH_CALLER_H_

#include <grpcpp/server_context.h>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/auth/user_tokens.h"

namespace dropless::coordinator {

struct Caller {
  std::string user;  // "" for the anonymous caller of a plaintext listener
  Role role = Role::kAdmin;
  // When the call's token expires (TokenGrant::expires): a stream that outlives it ends then.
  absl::Time token_expires = absl::InfiniteFuture();

  // Whether this caller may see or cancel a job owned by `owner`: admins and viewers see every
  // job (viewers cannot cancel: their role stops them earlier), submitters their own.
  bool CanAccessJobOf(const std::string& owner) const {
    return role != Role::kSubmitter || owner == user;
  }
};

// The caller of this call: the user and role of its `authorization: Bearer` token in `tokens`
// (which CallAuthorizer already checked before the handler ran); the anonymous admin when
// `tokens` is null (a plaintext listener).
Caller CallerOf(const grpc::ServerContext& context, const UserTokens* tokens);

// The token of an `authorization: Bearer <token>` header; empty when the header is not one.
absl::string_view BearerToken(absl::string_view header);

// NotFound when `caller` may not see the job (another user's, for a submitter): word for word
// what the job store answers for a job that does not exist (JobNotFoundError,
// coordinator/store/job_not_found.h), since job ids are sequential and a refusal that differed (or
// named the owner) would tell anyone who runs which job.
absl::Status CheckJobAccess(const Caller& caller, const std::string& job_id,
                            const std::string& owner);

// Whose jobs a ListJobs by `caller` lists: `requested` (ListJobsRequest.owner) when set, else
// the caller's own when they are a submitter; nullopt: every owner's. PermissionDenied naming both
// users when a submitter asks for another user's jobs.
absl::StatusOr<std::optional<std::string>> ListedOwner(const Caller& caller,
                                                       const std::string& requested);

// A worker's call: OK when the certificate's node is `node` (or the listener is plaintext);
// PermissionDenied naming both otherwise.
absl::Status CheckNodeIdentity(const grpc::ServerContext& context, const std::string& node);
// The node of the caller's worker certificate; "" on a plaintext listener.
std::string NodeOf(const grpc::ServerContext& context);
// The common name of the connection's client certificate, set only when the TLS handshake
// verified it against the worker CA; "" without one.
std::string CertifiedNode(const grpc::AuthContext& context);

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_AUTH_CALLER_H_
