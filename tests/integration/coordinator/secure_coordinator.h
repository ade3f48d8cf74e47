// The security tests' coordinator: the real dropless-coordinator on loopback with TLS, worker
// certificates and user tokens from scripts/dev-certs, and the channels and calls of its users
// and workers (coordinator_auth_test.cc, coordinator_access_test.cc).
#ifndef DROPLESS_TESTS_INTEGRATION_COORDINATOR_SECURE_COORDINATOR_H_
#define DROPLESS_TESTS_INTEGRATION_COORDINATOR_SECURE_COORDINATOR_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dropless/v1/job_service.grpc.pb.h"
#include "tests/integration/coordinator/coordinator_test_support.h"

namespace dropless::testing {

std::string ReadWholeFile(const std::string& path);

// scripts/dev-certs DIR for nodes node-a and node-b; empty on failure (the test then fails).
std::string MakeCerts();

// The token of `user` (admin, alice, bob, viewer) that scripts/dev-certs wrote into certs.
std::string Token(const std::string& certs, const std::string& user);

grpc::SslCredentialsOptions TlsOptions(const std::string& ca_dir, const std::string& cert_base);
std::shared_ptr<grpc::Channel> Connect(int port, std::shared_ptr<grpc::ChannelCredentials> creds);
// A user's channel: TLS verified with ca_dir's CA, and the bearer token (none when empty).
std::shared_ptr<grpc::Channel> UserChannel(int port, const std::string& ca_dir,
                                           const std::string& token);
// A worker's channel: mutual TLS with the certificate at cert_base (.pem/.key) or none.
std::shared_ptr<grpc::Channel> WorkerChannel(int port, const std::string& ca_dir,
                                             const std::string& cert_base);

template <typename T>
void SetDeadline(T* context, std::chrono::seconds seconds = std::chrono::seconds(20)) {
  context->set_deadline(std::chrono::system_clock::now() + seconds);
}

// JobService calls of one user, each with a deadline of 20 s.
grpc::Status Submit(const std::shared_ptr<grpc::Channel>& channel, v1::Job* job,
                    bool dry_run = false);
grpc::Status GetJob(const std::shared_ptr<grpc::Channel>& channel, const std::string& id);
grpc::Status CancelJob(const std::shared_ptr<grpc::Channel>& channel, const std::string& id);

// The command line of dropless-coordinator with TLS on 127.0.0.1:`port`, its store in `dir`, the
// certificates of `certs` (scripts/dev-certs) and the tokens file `tokens_file`.
std::vector<std::string> SecureCoordinatorArgv(const std::string& certs, const std::string& dir,
                                               int port, const std::string& tokens_file);

// dropless-coordinator with TLS, worker certificates from certs/ca.pem and its tokens file (plus
// an expired token for user "former", and `extra_tokens`: more entries of the `tokens` list, each
// a line "  - {token: ..., user: ..., role: ...}"), written readable by the owner only;
// optionally workers on a listener of their own.
class SecureCoordinator {
 public:
  SecureCoordinator(const std::string& certs, bool worker_listener,
                    std::vector<std::string> extra_flags = {},
                    const std::vector<std::string>& extra_tokens = {});

  static constexpr char kExpiredToken[] = "expired-token-0123456789abcdef";
  int user_port() const { return user_port_; }
  int worker_port() const { return worker_port_ != 0 ? worker_port_ : user_port_; }
  std::string Output() const { return process_ != nullptr ? process_->Output() : ""; }

 private:
  int user_port_;
  int worker_port_;
  std::unique_ptr<Process> process_;
};

}  // namespace dropless::testing

#endif  // DROPLESS_TESTS_INTEGRATION_COORDINATOR_SECURE_COORDINATOR_H_
