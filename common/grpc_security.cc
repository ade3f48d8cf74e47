#include "common/grpc_security.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dropless {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

absl::StatusOr<std::string> ReadText(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(what, " ", path, ": cannot open (", strerror(errno), ")"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// OpenSSL's reason for the last failure, its queue cleared.
std::string OpensslError() {
  const unsigned long code = ERR_peek_last_error();
  char text[256] = "unknown error";
  if (code != 0) ERR_error_string_n(code, text, sizeof(text));
  ERR_clear_error();
  return text;
}

using X509Ptr = std::unique_ptr<X509, decltype(&X509_free)>;

// Refuses to prompt for a passphrase (OpenSSL's default asks on the terminal): gRPC takes the
// key as PEM text and cannot use an encrypted one anyway.
int NoPassphrase(char* /*buf*/, int /*size*/, int /*rwflag*/, void* /*userdata*/) { return -1; }

// Every certificate of a PEM text: at least one, every block well-formed (a malformed block is
// an error, not the end of the file). A CA bundle may hold expired certificates, which TLS
// verification skips; a certificate chain's own (the first) must not have expired.
absl::StatusOr<std::vector<X509Ptr>> ParseCertificates(const std::string& pem,
                                                       const std::string& path,
                                                       const std::string& what,
                                                       bool first_must_be_current) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
  std::vector<X509Ptr> certs;
  ERR_clear_error();
  // _AUX also reads "TRUSTED CERTIFICATE" blocks, as CA bundles have them.
  while (X509* cert = PEM_read_bio_X509_AUX(bio.get(), nullptr, NoPassphrase, nullptr)) {
    certs.emplace_back(cert, &X509_free);
  }
  // Reading stops with "no start line" at the end of the text; any other reason is a bad block.
  const unsigned long stop = ERR_peek_last_error();
  const bool clean_end = stop == 0 || (ERR_GET_LIB(stop) == ERR_LIB_PEM &&
                                       ERR_GET_REASON(stop) == PEM_R_NO_START_LINE);
  if (!clean_end) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path,
                                                   ": a malformed PEM block after ", certs.size(),
                                                   " certificate(s) (", OpensslError(), ")"));
  }
  ERR_clear_error();
  if (certs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": holds no PEM certificate (is it a key, or DER?)"));
  }
  if (first_must_be_current && X509_cmp_current_time(X509_get0_notAfter(certs.front().get())) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": the certificate has expired"));
  }
  return certs;
}

}  // namespace

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
    absl::StatusOr<std::string> ca = ReadPemCertificates(files.ca, "TLS CA certificate");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
  }
  if (!files.cert.empty()) {
    absl::StatusOr<PemKeyPair> pair =
        ReadPemKeyPair(files.cert, "TLS certificate", files.key, "TLS key");
    if (!pair.ok()) return pair.status();
    options.pem_cert_chain = std::move(pair->cert_chain);
    options.pem_private_key = std::move(pair->private_key);
  }
  std::shared_ptr<grpc::ChannelCredentials> channel = grpc::SslCredentials(options);
  if (security.bearer_token.empty()) return channel;
  // AccessTokenCredentials sends `authorization: Bearer <token>`, and only over a secure channel.
  return grpc::CompositeChannelCredentials(channel,
                                           grpc::AccessTokenCredentials(security.bearer_token));
}

absl::StatusOr<std::string> ReadPemCertificates(const std::string& path, const std::string& what) {
  absl::StatusOr<std::string> text = ReadText(path, what);
  if (!text.ok()) return text.status();
  if (absl::Status s =
          ParseCertificates(*text, path, what, /*first_must_be_current=*/false).status();
      !s.ok()) {
    return s;
  }
  return text;
}

absl::StatusOr<PemKeyPair> ReadPemKeyPair(const std::string& cert_path,
                                          const std::string& cert_what, const std::string& key_path,
                                          const std::string& key_what) {
  PemKeyPair pair;
  absl::StatusOr<std::string> cert_text = ReadText(cert_path, cert_what);
  if (!cert_text.ok()) return cert_text.status();
  absl::StatusOr<std::vector<X509Ptr>> certs =
      ParseCertificates(*cert_text, cert_path, cert_what, /*first_must_be_current=*/true);
  if (!certs.ok()) return certs.status();
  absl::StatusOr<std::string> key_text = ReadText(key_path, key_what);
  if (!key_text.ok()) return key_text.status();
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(key_text->data(), static_cast<int>(key_text->size())), &BIO_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr), &EVP_PKEY_free);
  if (key == nullptr) {
    const bool encrypted = absl::StrContains(*key_text, "ENCRYPTED");
    return absl::InvalidArgumentError(
        absl::StrCat(key_what, " ", key_path,
                     encrypted ? ": is encrypted; give the key without a passphrase"
                               : ": holds no PEM private key",
                     " (", OpensslError(), ")"));
  }
  if (X509_check_private_key(certs->front().get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(key_what, " ", key_path, ": is not the key of ", cert_what, " ", cert_path));
  }
  ERR_clear_error();
  pair.cert_chain = *std::move(cert_text);
  pair.private_key = *std::move(key_text);
  return pair;
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
