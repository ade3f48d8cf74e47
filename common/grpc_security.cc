#include "common/grpc_security.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dropless {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  if (!absl::StrContains(text.str(), "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": holds no PEM block"));
  }
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ChannelSecurity& security) {
  if (security.insecure) return grpc::InsecureChannelCredentials();
  const TlsFiles& files = security.tls;
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        "TLS: a client certificate needs its key and the key its certificate (--tls-cert with "
        "--tls-key)");
  }
  grpc::SslCredentialsOptions options;
  if (!files.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile(files.ca, "TLS CA certificate");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
  }
  if (!files.cert.empty()) {
    absl::StatusOr<std::string> cert = ReadPemFile(files.cert, "TLS certificate");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPemFile(files.key, "TLS key");
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *cert;
    options.pem_private_key = *key;
  }
  std::shared_ptr<grpc::ChannelCredentials> channel = grpc::SslCredentials(options);
  if (security.bearer_token.empty()) return channel;
  // AccessTokenCredentials sends `authorization: Bearer <token>`, and only over a secure channel.
  return grpc::CompositeChannelCredentials(channel,
                                           grpc::AccessTokenCredentials(security.bearer_token));
}

ChannelSecurity ChannelSecurityFromEnvironment() {
  ChannelSecurity security;
  security.insecure = Env("DROPLESS_INSECURE") == "1";
  security.tls.ca = Env("DROPLESS_TLS_CA");
  security.tls.cert = Env("DROPLESS_TLS_CERT");
  security.tls.key = Env("DROPLESS_TLS_KEY");
  return security;
}

std::vector<std::string> ChannelSecurityEnvironment(const ChannelSecurity& security) {
  if (security.insecure) return {"DROPLESS_INSECURE=1"};
  return {"DROPLESS_INSECURE=0", absl::StrCat("DROPLESS_TLS_CA=", security.tls.ca),
          absl::StrCat("DROPLESS_TLS_CERT=", security.tls.cert),
          absl::StrCat("DROPLESS_TLS_KEY=", security.tls.key)};
}

}  // namespace dropless
