// CallAuthorizer: who is calling and whether they may, decided for every call on a TLS listener
// before any handler runs, with the call refused there when not.
//
// It is the listener's grpc::AuthMetadataProcessor rather than a ServerInterceptor: gRPC 1.51's C++
// server interceptors cannot end a call with a status (grpc/grpc#24017), the auth processor can,
// and it sees the method (:path), the metadata and the TLS peer.
//
//   dropless.v1.JobService/*        one `authorization: Bearer <token>` header (never two) with a
//                                   token from the tokens file, not expired, with the method's role
//                                   (kMethodRoles); SubmitJob also within the caller's submission
//                                   rate.
//   dropless.v1.WorkerService/*,    a client certificate verified against the worker CA (mutual
//   dropless.v1.RendezvousService/* TLS); its common name is the node the caller may act as.
//   grpc.health.v1.Health/*         anyone who completed the TLS handshake.
//   reflection, any other service   a valid bearer token (any role) or a verified worker
//                                   certificate; an unknown service is then UNIMPLEMENTED.
//
// It records nothing: gRPC shares one AuthContext among all the calls of a connection, so a
// caller stored there would answer for every later call on it (one client sending several users'
// tokens). The handlers find each call's caller again from the call's own `authorization` header
// (CallerOf, caller.h, with the same tokens) and the node from the connection's verified
// certificate (NodeOf).
#ifndef DROPLESS_COORDINATOR_AUTH_CALL_AUTHORIZER_H_
#define DROPLESS_COORDINATOR_AUTH_CALL_AUTHORIZER_H_

#include <memory>
#include <string>

#include <grpcpp/security/auth_metadata_processor.h>

#include "coordinator/auth/submit_rate_limiter.h"
#include "coordinator/auth/user_tokens.h"

namespace dropless::coordinator {

class CallAuthorizer final : public grpc::AuthMetadataProcessor {
 public:
  CallAuthorizer(std::shared_ptr<const UserTokens> tokens,
                 std::shared_ptr<SubmitRateLimiter> submit_limiter)
      : tokens_(std::move(tokens)), submit_limiter_(std::move(submit_limiter)) {}

  bool IsBlocking() const override { return false; }  // lookups in memory only
  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed, OutputMetadata* response) override;

  // The tokens the calls were authorized with (CallerOf reads the caller from them).
  const UserTokens* tokens() const { return tokens_.get(); }

 private:
  // A known, unexpired bearer token in the one `authorization` header (UNAUTHENTICATED naming the
  // problem, several headers included: CallerOf reads the call's one).
  grpc::Status CheckToken(const InputMetadata& metadata, const TokenGrant** grant);
  grpc::Status AuthorizeUser(absl::string_view method, const InputMetadata& metadata);
  grpc::Status AuthorizeWorker(absl::string_view service, const grpc::AuthContext& context);

  const std::shared_ptr<const UserTokens> tokens_;
  const std::shared_ptr<SubmitRateLimiter> submit_limiter_;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_AUTH_CALL_AUTHORIZER_H_
