// The tokens file and the submission rate limiter behind CallAuthorizer, and whose jobs a caller
// lists (docs/security.md).
#include "coordinator/auth/caller.h"
#include "coordinator/auth/submit_rate_limiter.h"
#include "coordinator/auth/user_tokens.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

using ::testing::HasSubstr;

// A tokens file of mode `mode` in a folder of its own; "" when it could not be made.
std::string WriteTokensFile(const std::string& name, mode_t mode) {
  const std::string path = ::testing::TempDir() + "/" + name;
  unlink(path.c_str());
  std::ofstream(path) << "tokens:\n  - {token: aaaaaaaaaaaaaaaaaaaa, user: alice, role: admin}\n";
  return chmod(path.c_str(), mode) == 0 ? path : "";
}

TEST(UserTokensTest, ReadsUsersRolesAndExpiry) {
  absl::StatusOr<UserTokens> tokens = UserTokens::ParseYaml(R"(
tokens:
  - {token: aaaaaaaaaaaaaaaaaaaa, user: alice, role: submitter}
  - {token: bbbbbbbbbbbbbbbbbbbb, user: ops, role: admin, expires: "2030-01-02T03:04:05Z"}
)");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(tokens->size(), 2u);
  const TokenGrant* alice = tokens->Find("aaaaaaaaaaaaaaaaaaaa");
  ASSERT_NE(alice, nullptr);
  EXPECT_EQ(alice->user, "alice");
  EXPECT_EQ(alice->role, Role::kSubmitter);
  EXPECT_EQ(alice->expires, absl::InfiniteFuture());
  const TokenGrant* ops = tokens->Find("bbbbbbbbbbbbbbbbbbbb");
  ASSERT_NE(ops, nullptr);
  EXPECT_EQ(ops->expires, absl::FromUnixSeconds(1893553445));
  EXPECT_EQ(tokens->Find("cccccccccccccccccccc"), nullptr);
}

TEST(UserTokensTest, ErrorsNameTheEntryButNeverTheToken) {
  auto error = [](const std::string& yaml) {
    return std::string(UserTokens::ParseYaml(yaml).status().message());
  };
  EXPECT_THAT(error("tokens:\n  - {token: short, user: a, role: admin}\n"),
              HasSubstr("tokens[0] (user a): a token must have at least 16 characters"));
  EXPECT_THAT(error("tokens:\n  - {token: aaaaaaaaaaaaaaaaaaaa, user: a, role: root}\n"),
              HasSubstr("role \"root\" is none of viewer, submitter, admin"));
  EXPECT_THAT(error("tokens:\n  - {token: aaaaaaaaaaaaaaaaaaaa, role: admin}\n"),
              HasSubstr("tokens[0]: user is missing"));
  const std::string twice =
      error("tokens:\n  - {token: aaaaaaaaaaaaaaaaaaaa, user: a, role: admin}\n"
            "  - {token: aaaaaaaaaaaaaaaaaaaa, user: b, role: viewer}\n");
  EXPECT_THAT(twice, HasSubstr("tokens[1] (user b): the same token twice"));
  EXPECT_THAT(twice, ::testing::Not(HasSubstr("aaaaaaaaaaaaaaaaaaaa")));
  EXPECT_THAT(error("tokens:\n  - {token: aaaaaaaaaaaaaaaaaaaa, user: a, role: admin, "
                    "expires: tomorrow}\n"),
              HasSubstr("expires: not RFC 3339"));
  EXPECT_THAT(error("users: []\n"), HasSubstr("a list `tokens`"));
  EXPECT_EQ(UserTokens::LoadFile("/nonexistent/tokens.yaml").status().code(),
            absl::StatusCode::kNotFound);
}

// As ssh refuses a private key others may read: the coordinator does not start on a tokens file
// its group or others may read or write, and says which bits and how to fix it.
TEST(UserTokensTest, LoadFileRefusesAFileOthersMayReadOrWrite) {
  for (const auto& [mode, who] : {std::pair<mode_t, const char*>{0644, "group read, others read"},
                                  {0640, "group read"},
                                  {0620, "group write"},
                                  {0602, "others write"},
                                  {0666, "group read, group write, others read, others write"}}) {
    const std::string path = WriteTokensFile("tokens-refused.yaml", mode);
    ASSERT_FALSE(path.empty());
    absl::StatusOr<UserTokens> tokens = UserTokens::LoadFile(path);
    EXPECT_EQ(tokens.status().code(), absl::StatusCode::kFailedPrecondition) << mode;
    EXPECT_EQ(std::string(tokens.status().message()),
              absl::StrCat("tokens file ", path, ": mode 0", absl::StrFormat("%o", mode),
                           " gives others than its owner access (", who,
                           "); a file of bearer tokens must be readable by its owner only: "
                           "chmod 600 ", path));
  }
  for (mode_t mode : {0600, 0400, 0700}) {
    const std::string path = WriteTokensFile("tokens-private.yaml", mode);
    ASSERT_FALSE(path.empty());
    absl::StatusOr<UserTokens> tokens = UserTokens::LoadFile(path);
    EXPECT_TRUE(tokens.ok()) << mode << ": " << tokens.status();
  }
}

// A Kubernetes Secret volume's files are symbolic links (tokens.yaml -> ..data/tokens.yaml, the
// link itself 0777): the mode checked is the target's.
TEST(UserTokensTest, LoadFileChecksTheModeOfALinksTarget) {
  const std::string dir = ::testing::TempDir() + "/secret-volume";
  mkdir(dir.c_str(), 0700);
  mkdir((dir + "/..data").c_str(), 0700);
  const std::string link = dir + "/tokens.yaml";
  for (const auto& [mode, ok] : {std::pair<mode_t, bool>{0400, true}, {0644, false}}) {
    const std::string target = WriteTokensFile("secret-volume/..data/tokens.yaml", mode);
    ASSERT_FALSE(target.empty());
    unlink(link.c_str());
    ASSERT_EQ(symlink("..data/tokens.yaml", link.c_str()), 0);
    absl::StatusOr<UserTokens> tokens = UserTokens::LoadFile(link);
    EXPECT_EQ(tokens.ok(), ok) << mode << ": " << tokens.status();
    if (!ok) {
      EXPECT_THAT(tokens.status().message(), HasSubstr(absl::StrCat("tokens file ", link,
                                                                    ": mode 0644 gives")));
    }
  }
}

// Another user's tokens file (mode 0600 or not) is refused: whoever owns it could have given
// themselves any role. Only root can give a file away, so this needs root (as the CI runs).
TEST(UserTokensTest, LoadFileRefusesAFileOfAnotherUser) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "only root can make a file owned by another user (chown); the CI runs as root";
  }
  const std::string path = WriteTokensFile("tokens-of-nobody.yaml", 0600);
  ASSERT_FALSE(path.empty());
  ASSERT_EQ(chown(path.c_str(), 65534, 65534), 0);
  absl::StatusOr<UserTokens> tokens = UserTokens::LoadFile(path);
  EXPECT_EQ(tokens.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(tokens.status().message()),
            absl::StrCat("tokens file ", path,
                         ": owned by uid 65534, neither this process's user (uid 0) nor root; a "
                         "file of bearer tokens must belong to the user who reads it: chown 0 ",
                         path));
}

TEST(UserTokensTest, AnExpiredTokenIsNamedByItsUserAndExpiry) {
  const absl::Time expires = absl::FromUnixSeconds(1893553445);  // 2030-01-02T03:04:05+00:00
  EXPECT_TRUE(CheckTokenUnexpired("ops", expires, expires - absl::Seconds(1)).ok());
  EXPECT_TRUE(CheckTokenUnexpired("ops", absl::InfiniteFuture(), absl::Now()).ok());
  for (absl::Time now : {expires, expires + absl::Hours(1)}) {
    absl::Status expired = CheckTokenUnexpired("ops", expires, now);
    EXPECT_EQ(expired.code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(std::string(expired.message()),
              "expired bearer token of user ops (expired 2030-01-02T03:04:05+00:00)");
  }
}

// Another user's job is answered as one that does not exist: the same code and words as the job
// store's for an unknown id (the security tests compare both over the wire), never the owner.
TEST(JobAccessTest, AJobTheCallerMayNotSeeIsNotFound) {
  const Caller bob{"bob", Role::kSubmitter};
  for (const char* owner : {"alice", ""}) {  // "": a job made before owners
    absl::Status refused = CheckJobAccess(bob, "j-000007", owner);
    EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(std::string(refused.message()), "job \"j-000007\" not found");
  }
  EXPECT_TRUE(CheckJobAccess(bob, "j-000008", "bob").ok());
  EXPECT_TRUE(CheckJobAccess(Caller{"vera", Role::kViewer}, "j-000007", "alice").ok());
  EXPECT_TRUE(CheckJobAccess(Caller{"ops", Role::kAdmin}, "j-000007", "").ok());
}

TEST(SubmitRateLimiterTest, BurstThenRefillPerCaller) {
  SubmitRateLimiter limiter(/*per_second=*/2, /*burst=*/3);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.TryTake("a", t0)) << i;
  EXPECT_FALSE(limiter.TryTake("a", t0));
  EXPECT_TRUE(limiter.TryTake("b", t0));  // each caller has its own bucket
  EXPECT_FALSE(limiter.TryTake("a", t0 + absl::Milliseconds(400)));
  EXPECT_TRUE(limiter.TryTake("a", t0 + absl::Milliseconds(500)));  // one refilled at 2/s
  EXPECT_FALSE(limiter.TryTake("a", t0 + absl::Milliseconds(500)));
  // Never more than the burst, however long the pause.
  const absl::Time later = t0 + absl::Hours(1);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.TryTake("a", later)) << i;
  EXPECT_FALSE(limiter.TryTake("a", later));
  SubmitRateLimiter unlimited(0, 1);
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(unlimited.TryTake("a", t0));
}

TEST(ListedOwnerTest, SubmittersListTheirOwnJobsOthersPickAnOwner) {
  const Caller bob{"bob", Role::kSubmitter};
  const Caller viewer{"vera", Role::kViewer};
  const Caller anonymous;  // plaintext listener: the anonymous admin
  EXPECT_EQ(ListedOwner(bob, "").value(), std::optional<std::string>("bob"));
  EXPECT_EQ(ListedOwner(bob, "bob").value(), std::optional<std::string>("bob"));
  absl::StatusOr<std::optional<std::string>> refused = ListedOwner(bob, "alice");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("user bob (role submitter) may only list"));
  EXPECT_EQ(ListedOwner(viewer, "").value(), std::nullopt);
  EXPECT_EQ(ListedOwner(viewer, "alice").value(), std::optional<std::string>("alice"));
  EXPECT_EQ(ListedOwner(anonymous, "").value(), std::nullopt);
  EXPECT_EQ(ListedOwner(anonymous, "alice").value(), std::optional<std::string>("alice"));
}

}  // namespace
}  // namespace dropless::coordinator
