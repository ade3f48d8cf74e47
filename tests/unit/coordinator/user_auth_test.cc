// The tokens file and the submission rate limiter behind CallAuthorizer, and whose jobs a caller
// lists (docs/security.md).
#include "coordinator/auth/caller.h"
#include "coordinator/auth/submit_rate_limiter.h"
#include "coordinator/auth/user_tokens.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

using ::testing::HasSubstr;

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
