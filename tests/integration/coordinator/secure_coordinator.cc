#include "tests/integration/coordinator/secure_coordinator.h"

#include <sys/stat.h>

#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"

namespace dropless::testing {

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string MakeCerts() {
  const std::string dir = MakeTempDir() + "/certs";
  CommandResult r =
      RunCommand({"bash", SourcePath("scripts/dev-certs"), dir, "node-a", "node-b"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  return r.exit_code == 0 ? dir : "";
}

std::string Token(const std::string& certs, const std::string& user) {
  return std::string(
      absl::StripAsciiWhitespace(ReadWholeFile(certs + "/tokens/" + user + ".token")));
}

grpc::SslCredentialsOptions TlsOptions(const std::string& ca_dir, const std::string& cert_base) {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ReadWholeFile(ca_dir + "/ca.pem");
  if (!cert_base.empty()) {
    options.pem_cert_chain = ReadWholeFile(cert_base + ".pem");
    options.pem_private_key = ReadWholeFile(cert_base + ".key");
  }
  return options;
}

std::shared_ptr<grpc::Channel> Connect(int port, std::shared_ptr<grpc::ChannelCredentials> creds) {
  return grpc::CreateChannel(absl::StrCat("localhost:", port), std::move(creds));
}

std::shared_ptr<grpc::Channel> UserChannel(int port, const std::string& ca_dir,
                                           const std::string& token) {
  std::shared_ptr<grpc::ChannelCredentials> tls = grpc::SslCredentials(TlsOptions(ca_dir, ""));
  if (token.empty()) return Connect(port, tls);
  return Connect(port, grpc::CompositeChannelCredentials(tls, grpc::AccessTokenCredentials(token)));
}

std::shared_ptr<grpc::Channel> WorkerChannel(int port, const std::string& ca_dir,
                                             const std::string& cert_base) {
  return Connect(port, grpc::SslCredentials(TlsOptions(ca_dir, cert_base)));
}

grpc::Status Submit(const std::shared_ptr<grpc::Channel>& channel, v1::Job* job, bool dry_run) {
  auto stub = v1::JobService::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::SubmitJobRequest request;
  request.set_spec_yaml(TinySpec(1));
  request.set_dry_run(dry_run);
  return stub->SubmitJob(&context, request, job);
}

grpc::Status GetJob(const std::shared_ptr<grpc::Channel>& channel, const std::string& id) {
  auto stub = v1::JobService::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::GetJobRequest request;
  request.set_id(id);
  v1::Job job;
  return stub->GetJob(&context, request, &job);
}

grpc::Status CancelJob(const std::shared_ptr<grpc::Channel>& channel, const std::string& id) {
  auto stub = v1::JobService::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::CancelJobRequest request;
  request.set_id(id);
  v1::Job job;
  return stub->CancelJob(&context, request, &job);
}

std::vector<std::string> SecureCoordinatorArgv(const std::string& certs, const std::string& dir,
                                               int port, const std::string& tokens_file) {
  return {BinaryPath("dropless-coordinator"),
          absl::StrCat("--listen=127.0.0.1:", port),
          absl::StrCat("--db=", dir, "/coordinator.db"),
          "--metrics-port=0",
          absl::StrCat("--tls-cert=", certs, "/coordinator.pem"),
          absl::StrCat("--tls-key=", certs, "/coordinator.key"),
          absl::StrCat("--worker-ca=", certs, "/ca.pem"),
          absl::StrCat("--tokens-file=", tokens_file)};
}

SecureCoordinator::SecureCoordinator(const std::string& certs, bool worker_listener,
                                     std::vector<std::string> extra_flags,
                                     const std::vector<std::string>& extra_tokens)
    : user_port_(PickFreePort()), worker_port_(worker_listener ? PickFreePort() : 0) {
  // Each port was free when picked, but the kernel may give the same one twice (the coordinator
  // then refuses to start: worker_listen must differ from listen).
  for (int i = 0; i < 100 && worker_port_ == user_port_; ++i) worker_port_ = PickFreePort();
  const std::string dir = MakeTempDir();
  const std::string tokens = dir + "/tokens.yaml";
  {
    std::ofstream out(tokens);
    out << ReadWholeFile(certs + "/tokens.yaml") << "  - {token: " << kExpiredToken
        << ", user: former, role: admin, expires: \"2020-01-01T00:00:00Z\"}\n";
    for (const std::string& line : extra_tokens) out << line << "\n";
  }
  // The coordinator refuses a tokens file others may read (docs/security.md).
  EXPECT_EQ(chmod(tokens.c_str(), 0600), 0);
  std::vector<std::string> argv = SecureCoordinatorArgv(certs, dir, user_port_, tokens);
  if (worker_listener) argv.push_back(absl::StrCat("--worker-listen=127.0.0.1:", worker_port_));
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  absl::StatusOr<std::unique_ptr<Process>> started = Process::Start(argv);
  EXPECT_TRUE(started.ok()) << started.status();
  if (!started.ok()) return;
  process_ = *std::move(started);
  EXPECT_TRUE(WaitForTcpPort(user_port_, absl::Seconds(20))) << process_->Output();
  if (worker_listener) EXPECT_TRUE(WaitForTcpPort(worker_port_, absl::Seconds(20)));
}

}  // namespace dropless::testing
