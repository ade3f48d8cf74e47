// The real `dropless` binary against the real `dropless-coordinator` on loopback with TLS and
// bearer tokens from scripts/dev-certs, as a cluster runs it: `get jobs --owner` for each role.
#include <sys/stat.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/cli/cli_fixture.h"

namespace dropless::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class SecureCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = MakeTempDir();
    certs_ = dir + "/certs";
    CommandResult made = RunCommand({"bash", SourcePath("scripts/dev-certs"), certs_, "node-a"});
    ASSERT_EQ(made.exit_code, 0) << made.out << made.err;
    port_ = PickFreePort();
    auto started = Process::Start({BinaryPath("dropless-coordinator"),
                                   absl::StrCat("--listen=127.0.0.1:", port_),
                                   absl::StrCat("--db=", dir, "/state.db"), "--metrics-port=0",
                                   absl::StrCat("--tls-cert=", certs_, "/coordinator.pem"),
                                   absl::StrCat("--tls-key=", certs_, "/coordinator.key"),
                                   absl::StrCat("--worker-ca=", certs_, "/ca.pem"),
                                   absl::StrCat("--tokens-file=", certs_, "/tokens.yaml")});
    ASSERT_TRUE(started.ok()) << started.status();
    coordinator_ = *std::move(started);
    ASSERT_TRUE(WaitForTcpPort(port_, absl::Seconds(30))) << "coordinator did not listen:\n"
                                                          << coordinator_->Output();
  }

  void TearDown() override {
    if (HasFailure() && coordinator_)
      std::cerr << "coordinator output:\n" << coordinator_->Output();
  }

  // The CLI as `user` (a token of scripts/dev-certs: admin, alice, bob, viewer).
  CommandResult Cli(const std::string& user, const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {BinaryPath("dropless"),
                                     "--coordinator",
                                     absl::StrCat("localhost:", port_),
                                     "--tls-ca",
                                     certs_ + "/ca.pem",
                                     "--token-file",
                                     absl::StrCat(certs_, "/tokens/", user, ".token"),
                                     "--timeout",
                                     "10s"};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, absl::Seconds(60));
  }

  std::string Submit(const std::string& user) {
    CommandResult r = Cli(user, {"submit", "-f", SourcePath("configs/jobs/tiny-cpu.yaml")});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return Trimmed(r.out);
  }

  // `get jobs -o json [args]` as `user`: the ids listed, each checked to have `owner` when set.
  std::vector<std::string> ListedIds(const std::string& user, std::vector<std::string> args,
                                     const std::string& owner = "") {
    args.insert(args.begin(), {"get", "jobs", "-o", "json"});
    CommandResult r = Cli(user, args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> ids;
    if (r.exit_code != 0) return ids;
    google::protobuf::Struct root = ParseJson(r.out);
    for (const auto& job : root.fields().at("jobs").list_value().values()) {
      ids.push_back(Str(job.struct_value(), "id"));
      if (!owner.empty()) EXPECT_EQ(Str(job.struct_value(), "owner"), owner);
    }
    return ids;
  }

  std::string certs_;
  int port_ = 0;
  std::unique_ptr<Process> coordinator_;
};

TEST_F(SecureCliTest, GetJobsOwnerFiltersWithinTheUsersRole) {
  const std::string alices = Submit("alice");
  const std::string bobs = Submit("bob");
  ASSERT_FALSE(alices.empty() || bobs.empty());
  // A viewer and an admin list anyone's jobs, or everyone's.
  EXPECT_THAT(ListedIds("viewer", {"--owner", "alice"}, "alice"), ElementsAre(alices));
  EXPECT_THAT(ListedIds("admin", {"--owner", "bob"}, "bob"), ElementsAre(bobs));
  EXPECT_THAT(ListedIds("admin", {}), ElementsAre(alices, bobs));
  EXPECT_TRUE(ListedIds("viewer", {"--owner", "carol"}).empty());
  // With the other filters: alice's job is pending, none of hers is running.
  EXPECT_THAT(ListedIds("viewer", {"--owner", "alice", "--state", "pending"}), ElementsAre(alices));
  EXPECT_TRUE(ListedIds("viewer", {"--owner", "alice", "--state", "running"}).empty());
  // A submitter sees their own jobs, with or without naming themself; another user's is refused.
  EXPECT_THAT(ListedIds("bob", {}), ElementsAre(bobs));
  EXPECT_THAT(ListedIds("bob", {"--owner", "bob"}, "bob"), ElementsAre(bobs));
  CommandResult refused = Cli("bob", {"get", "jobs", "--owner", "alice"});
  EXPECT_EQ(refused.exit_code, 1) << refused.out << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("user bob (role submitter) may only list their own jobs, "
                                     "not user alice's"));
  EXPECT_EQ(refused.out, "");
  // The table and usage errors.
  CommandResult table = Cli("viewer", {"get", "jobs", "--owner", "bob"});
  EXPECT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr(bobs));
  EXPECT_THAT(table.out, ::testing::Not(HasSubstr(alices)));
  CommandResult with_id = Cli("viewer", {"get", "job", alices, "--owner", "alice"});
  EXPECT_EQ(with_id.exit_code, 2);
  EXPECT_THAT(with_id.err, HasSubstr("--owner"));
  CommandResult empty = Cli("viewer", {"get", "jobs", "--owner", " "});
  EXPECT_EQ(empty.exit_code, 2);
  EXPECT_THAT(empty.err, HasSubstr("--owner: no user name given"));
}

// TLS files are parsed at start: a key that is not the certificate's, a key given as the CA or a
// certificate as the key fails the coordinator, the CLI and the worker daemon at once, naming the
// file, instead of a listener that "could not listen" or handshakes retried forever.
TEST(TlsFilesTest, MismatchedOrWrongPemFilesFailAtStartNamingTheFile) {
  const std::string certs = MakeTempDir() + "/certs";
  CommandResult made = RunCommand({"bash", SourcePath("scripts/dev-certs"), certs, "node-a"});
  ASSERT_EQ(made.exit_code, 0) << made.out << made.err;
  auto coordinator_with = [&](const std::string& key, const std::string& worker_ca) {
    return RunCommand(
        {BinaryPath("dropless-coordinator"), absl::StrCat("--listen=127.0.0.1:", PickFreePort()),
         absl::StrCat("--db=", MakeTempDir(), "/state.db"), "--metrics-port=0",
         "--tls-cert=" + certs + "/coordinator.pem", "--tls-key=" + certs + key,
         "--worker-ca=" + certs + worker_ca, "--tokens-file=" + certs + "/tokens.yaml"},
        absl::Seconds(30));
  };
  CommandResult coordinator = coordinator_with("/ca.key", "/ca.pem");
  EXPECT_NE(coordinator.exit_code, 0);
  EXPECT_THAT(coordinator.err,
              HasSubstr("tls_key " + certs + "/ca.key: is not the key of tls_cert"))
      << coordinator.err;
  CommandResult ca_is_a_key = coordinator_with("/coordinator.key", "/ca.key");
  EXPECT_NE(ca_is_a_key.exit_code, 0);
  EXPECT_THAT(ca_is_a_key.err,
              HasSubstr("worker_ca " + certs + "/ca.key: holds no PEM certificate"))
      << ca_is_a_key.err;

  // An encrypted key is refused by name (OpenSSL would otherwise prompt for its passphrase on
  // the terminal, and gRPC could not use it anyway).
  CommandResult encrypt =
      RunCommand({"openssl", "pkey", "-in", certs + "/coordinator.key", "-aes256", "-passout",
                  "pass:secret", "-out", certs + "/encrypted.key"});
  ASSERT_EQ(encrypt.exit_code, 0) << encrypt.err;
  CommandResult encrypted = coordinator_with("/encrypted.key", "/ca.pem");
  EXPECT_NE(encrypted.exit_code, 0);
  EXPECT_THAT(encrypted.err, HasSubstr("tls_key " + certs + "/encrypted.key: is encrypted"))
      << encrypted.err;

  CommandResult cli = RunCommand({BinaryPath("dropless"), "--coordinator", "localhost:7070",
                                  "--tls-ca", certs + "/ca.key", "get", "jobs"},
                                 absl::Seconds(30));
  EXPECT_EQ(cli.exit_code, 2) << cli.err;
  EXPECT_THAT(cli.err,
              HasSubstr("TLS CA certificate " + certs + "/ca.key: holds no PEM certificate"))
      << cli.err;

  CommandResult worker = RunCommand(
      {BinaryPath("dropless-worker"), "--coordinator=localhost:7070", "--node=node-a",
       "--cpu-slots=1", "--metrics-port=0", "--tls-ca=" + certs + "/ca.pem",
       "--tls-cert=" + certs + "/workers/node-a.pem", "--tls-key=" + certs + "/workers/node-a.pem"},
      absl::Seconds(30));
  EXPECT_NE(worker.exit_code, 0);
  EXPECT_THAT(worker.err,
              HasSubstr("TLS key " + certs + "/workers/node-a.pem: holds no PEM private key"))
      << worker.err;
}

// What a submitter learns of another user's job through the CLI: nothing, it answers as a job
// that does not exist (exit 3, the coordinator's words); and a token file others may read is not
// sent (exit 2, naming the file, its mode and the fix).
TEST_F(SecureCliTest, AnotherUsersJobIsNotFoundAndAnOpenTokenFileIsRefused) {
  const std::string alices = Submit("alice");
  ASSERT_FALSE(alices.empty());
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"get", "job", alices}, {"describe", "job", alices},
        {"cancel", alices}}) {
    CommandResult r = Cli("bob", args);
    EXPECT_EQ(r.exit_code, 3) << args[0] << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("job \"" + alices + "\" not found")) << args[0];
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("alice"))) << args[0];
  }
  const std::string token = certs_ + "/tokens/bob.token";
  ASSERT_EQ(chmod(token.c_str(), 0644), 0);
  CommandResult refused = Cli("bob", {"get", "jobs"});
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_THAT(refused.err,
              HasSubstr("--token-file " + token +
                        ": mode 0644 gives others than its owner access (group read, others "
                        "read); a file of bearer tokens must be readable by its owner only: "
                        "chmod 600 " + token));
  ASSERT_EQ(chmod(token.c_str(), 0600), 0);
  EXPECT_EQ(Cli("bob", {"get", "jobs"}).exit_code, 0);
}

}  // namespace
}  // namespace dropless::testing
