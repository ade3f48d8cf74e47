// common/grpc_security.h: PEM files parsed when read. The certificates are made here with
// OpenSSL (a self-signed one per case, valid or expired), so every case runs without the CLI.
#include "common/grpc_security.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <openssl/x509.h>
#include <stdlib.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless {
namespace {

using ::testing::HasSubstr;

struct KeyAndCert {
  std::string key_pem;
  std::string cert_pem;
};

std::string Pem(int (*write)(BIO*, void*), void* object) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
  EXPECT_EQ(write(bio.get(), object), 1);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

// A fresh RSA key and a self-signed certificate valid from `from_days` to `to_days` (from now).
KeyAndCert Make(long from_days, long to_days, const EVP_CIPHER* encrypt_key = nullptr) {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_RSA_gen(2048), &EVP_PKEY_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), &X509_free);
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), from_days * 86400);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), to_days * 86400);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("test"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  X509_set_pubkey(cert.get(), key.get());
  EXPECT_GT(X509_sign(cert.get(), key.get(), EVP_sha256()), 0);
  KeyAndCert out;
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
  static const char kPass[] = "secret";
  EXPECT_EQ(PEM_write_bio_PrivateKey(
                bio.get(), key.get(), encrypt_key,
                encrypt_key ? reinterpret_cast<unsigned char*>(const_cast<char*>(kPass)) : nullptr,
                encrypt_key ? 6 : 0, nullptr, nullptr),
            1);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  out.key_pem.assign(data, static_cast<size_t>(n));
  out.cert_pem =
      Pem([](BIO* b, void* x) { return PEM_write_bio_X509(b, static_cast<X509*>(x)); }, cert.get());
  return out;
}

class PemFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/dropless-pem-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string dir_;
};

TEST_F(PemFilesTest, AMatchingCurrentPairIsReadAndEveryWrongFileIsNamed) {
  const KeyAndCert good = Make(-1, 30);
  const KeyAndCert other = Make(-1, 30);
  const std::string cert = Write("cert.pem", good.cert_pem);
  const std::string key = Write("key.pem", good.key_pem);
  absl::StatusOr<PemKeyPair> pair = ReadPemKeyPair(cert, "tls_cert", key, "tls_key");
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ(pair->cert_chain, good.cert_pem);
  EXPECT_EQ(pair->private_key, good.key_pem);

  const std::string other_key = Write("other.key", other.key_pem);
  EXPECT_THAT(ReadPemKeyPair(cert, "tls_cert", other_key, "tls_key").status().message(),
              HasSubstr("tls_key " + other_key + ": is not the key of tls_cert " + cert));
  const KeyAndCert expired = Make(-10, -1);
  const std::string old_cert = Write("old.pem", expired.cert_pem);
  const std::string old_key = Write("old.key", expired.key_pem);
  EXPECT_THAT(ReadPemKeyPair(old_cert, "tls_cert", old_key, "tls_key").status().message(),
              HasSubstr("tls_cert " + old_cert + ": the certificate has expired"));
  const KeyAndCert locked = Make(-1, 30, EVP_aes_256_cbc());
  const std::string locked_key = Write("locked.key", locked.key_pem);
  const std::string locked_cert = Write("locked.pem", locked.cert_pem);
  EXPECT_THAT(ReadPemKeyPair(locked_cert, "tls_cert", locked_key, "tls_key").status().message(),
              HasSubstr("tls_key " + locked_key + ": is encrypted"));
  EXPECT_THAT(ReadPemKeyPair(cert, "tls_cert", cert, "tls_key").status().message(),
              HasSubstr("holds no PEM private key"));
  EXPECT_EQ(ReadPemKeyPair(dir_ + "/missing.pem", "tls_cert", key, "tls_key").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(PemFilesTest, ACaBundleMayHoldExpiredCertificatesButNoMalformedBlock) {
  const std::string bundle = Write("bundle.pem", Make(-10, -1).cert_pem + Make(-1, 30).cert_pem);
  absl::StatusOr<std::string> read = ReadPemCertificates(bundle, "worker_ca");
  ASSERT_TRUE(read.ok()) << read.status();
  const std::string key_only = Write("key-only.pem", Make(-1, 30).key_pem);
  EXPECT_THAT(ReadPemCertificates(key_only, "worker_ca").status().message(),
              HasSubstr("worker_ca " + key_only + ": holds no PEM certificate"));
  std::string broken = Make(-1, 30).cert_pem;
  broken += "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n";
  const std::string broken_path = Write("broken.pem", broken);
  EXPECT_THAT(ReadPemCertificates(broken_path, "worker_ca").status().message(),
              HasSubstr("a malformed PEM block after 1 certificate(s)"));
}

}  // namespace
}  // namespace dropless
