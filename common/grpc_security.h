// How a dropless process secures its gRPC connections: TLS with PEM files from disk (mutual TLS for
// the worker daemon and its ranks, server-verified TLS plus a bearer token for the CLI), or
// plaintext when the operator asked for it explicitly (--insecure, a development setting).
#ifndef DROPLESS_COMMON_GRPC_SECURITY_H_
#define DROPLESS_COMMON_GRPC_SECURITY_H_

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/security/credentials.h>

#include "absl/status/statusor.h"

namespace dropless {

// PEM file paths. `ca` verifies the other side (empty on a client: the system's roots);
// `cert` and `key` are this side's certificate chain and private key (a client may have none).
struct TlsFiles {
  std::string ca;
  std::string cert;
  std::string key;
};

struct ChannelSecurity {
  bool insecure = false;  // plaintext; tls is ignored
  TlsFiles tls;
  std::string bearer_token;  // sent as `authorization: Bearer <token>` on every call; TLS only
};

// PEM files are parsed when read, so that a wrong file fails at start with an error naming `what`
// and the path, rather than as a listener that cannot start or a handshake retried forever.
// NotFound when the file cannot be read; InvalidArgument when it holds no certificate or a
// malformed PEM block, or (a pair) the certificate has expired, the key is encrypted, does not
// parse or is not the certificate's key. A CA bundle may hold expired certificates (TLS skips
// them).
absl::StatusOr<std::string> ReadPemCertificates(const std::string& path, const std::string& what);
struct PemKeyPair {
  std::string cert_chain;   // PEM, the first certificate is the key's
  std::string private_key;  // PEM
};
absl::StatusOr<PemKeyPair> ReadPemKeyPair(const std::string& cert_path,
                                          const std::string& cert_what, const std::string& key_path,
                                          const std::string& key_what);

// Channel credentials for `security`; errors name the file that could not be used. A cert
// without a key (or the reverse) is an error.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ChannelSecurity& security);

// The rank processes' settings, handed down by the worker daemon in their environment
// (DROPLESS_INSECURE=1, DROPLESS_TLS_CA, DROPLESS_TLS_CERT, DROPLESS_TLS_KEY).
ChannelSecurity ChannelSecurityFromEnvironment();
// "KEY=VALUE" entries that ChannelSecurityFromEnvironment reads back as `security` (no token).
std::vector<std::string> ChannelSecurityEnvironment(const ChannelSecurity& security);

}  // namespace dropless

#endif  // DROPLESS_COMMON_GRPC_SECURITY_H_
