// The CLI's global settings (cli/args.h): duration flags, and the connection settings: the token's
// precedence, nothing read before a client is made, errors naming where a bad value came from.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/args.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string MessageOf(const absl::Status& status) { return std::string(status.message()); }

TEST(DurationFlagTest, AcceptsFiniteDurationsUpToTenYears) {
  EXPECT_EQ(*ParseDurationFlag("--timeout", "10s"), absl::Seconds(10));
  EXPECT_EQ(*ParseDurationFlag("--timeout", "500ms"), absl::Milliseconds(500));
  EXPECT_EQ(*ParseDurationFlag("--timeout", "1.5"), absl::Milliseconds(1500));
  EXPECT_EQ(*ParseDurationFlag("--since", "1h30m"), absl::Minutes(90));
  EXPECT_EQ(*ParseDurationFlag("--since", "87600h"), kMaxFlagDuration);
}

// absl::Seconds(NaN) is an infinite duration: `--timeout nan` would have removed the deadline.
TEST(DurationFlagTest, RefusesNonFiniteAndAbsurdValuesNamingTheFlag) {
  for (const char* text :
       {"nan", "NaN", "-nan", "inf", "+inf", "-inf", "infinity", "1e400", "-1e400", "1e400s",
        "1e300", "1e10", "87601h", "315400000", "0", "0s", "-1s", "soon", ""}) {
    absl::StatusOr<absl::Duration> d = ParseDurationFlag("--timeout", text);
    EXPECT_FALSE(d.ok()) << "'" << text << "' gave " << absl::FormatDuration(*d);
    if (!d.ok()) {
      EXPECT_THAT(MessageOf(d.status()), StartsWith("--timeout")) << text;
    }
  }
}

std::map<std::string, std::string> NoEnvironment() { return {}; }

// The global options of a command line, with `env` as the whole environment.
absl::StatusOr<GlobalOptions> Options(const std::vector<std::string>& args,
                                      const std::map<std::string, std::string>& env) {
  absl::StatusOr<ParsedArgs> parsed = ParsedArgs::Parse(args, GlobalFlagSpecs());
  if (!parsed.ok()) return parsed.status();
  return ReadGlobalOptions(*parsed, [env](const std::string& name) {
    auto it = env.find(name);
    return it == env.end() ? std::string() : it->second;
  });
}

class CredentialsTest : public ::testing::Test {
 protected:
  // A token file as it should be, readable by its owner only (or of `mode`).
  std::string WriteFile(const std::string& name, const std::string& text, mode_t mode = 0600) {
    const std::string path = ::testing::TempDir() + "/" + name;
    unlink(path.c_str());  // a 0400 one of an earlier run could not be written again
    std::ofstream(path, std::ios::binary) << text;
    EXPECT_EQ(chmod(path.c_str(), mode), 0) << path;
    return path;
  }
};

// Explicit flags beat environment variables, and a file beats an inline token:
// --token-file, --token, $DROPLESS_TOKEN_FILE, $DROPLESS_TOKEN (kTokenPrecedence).
TEST_F(CredentialsTest, TokenPrecedenceFlagsBeforeTheEnvironmentFileBeforeToken) {
  const std::string flag_file = WriteFile("flag.token", "from-flag-file\n");
  const std::string env_file = WriteFile("env.token", "  from-env-file  \n");
  const std::map<std::string, std::string> both_variables = {{"DROPLESS_TOKEN_FILE", env_file},
                                                             {"DROPLESS_TOKEN", "from-env-token"}};
  struct Case {
    std::vector<std::string> args;
    std::map<std::string, std::string> env;
    std::string token;
  };
  const std::vector<Case> cases = {
      {{"--token-file", flag_file, "--token", "from-flag"}, both_variables, "from-flag-file"},
      {{"--token", "from-flag", "--token-file", flag_file}, both_variables, "from-flag-file"},
      // The explicit --token wins over the token file the environment names.
      {{"--token", "from-flag"}, both_variables, "from-flag"},
      {{"--token=from-flag"}, {{"DROPLESS_TOKEN_FILE", env_file}}, "from-flag"},
      {{}, both_variables, "from-env-file"},
      {{}, {{"DROPLESS_TOKEN", "from-env-token"}}, "from-env-token"},
      {{"--token-file", flag_file}, {{"DROPLESS_TOKEN", "from-env-token"}}, "from-flag-file"},
      // Empty values count as not given.
      {{"--token-file="}, {{"DROPLESS_TOKEN_FILE", ""}, {"DROPLESS_TOKEN", "t"}}, "t"},
      {{}, {}, ""},
  };
  for (const Case& c : cases) {
    absl::StatusOr<GlobalOptions> options = Options(c.args, c.env);
    ASSERT_TRUE(options.ok()) << options.status();
    absl::StatusOr<std::string> token = ReadBearerToken(*options);
    ASSERT_TRUE(token.ok()) << token.status();
    EXPECT_EQ(*token, c.token) << ::testing::PrintToString(c.args);
  }
  // --insecure: no token at all, whatever is set.
  absl::StatusOr<GlobalOptions> insecure = Options({"--insecure", "--token", "x"}, both_variables);
  ASSERT_TRUE(insecure.ok());
  EXPECT_FALSE(insecure->token.given());
  EXPECT_FALSE(insecure->token_file.given());
}

// Reading the options reads no file: commands that make no call (completion, version --client)
// do not fail on credentials they do not use. The client's credentials then name the source of a
// bad value.
TEST_F(CredentialsTest, FilesAreReadOnlyForAClientAndErrorsNameTheirSource) {
  const std::map<std::string, std::string> env = {{"DROPLESS_TOKEN_FILE", "/nonexistent/token"},
                                                  {"DROPLESS_TLS_CA", "/nonexistent/ca.pem"}};
  absl::StatusOr<GlobalOptions> options = Options({}, env);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->token_file.from, "$DROPLESS_TOKEN_FILE");
  EXPECT_EQ(options->tls_ca.from, "$DROPLESS_TLS_CA");

  absl::StatusOr<std::string> token = ReadBearerToken(*options);
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(MessageOf(token.status()),
              StartsWith("$DROPLESS_TOKEN_FILE /nonexistent/token: cannot open"));
  auto credentials = ReadChannelCredentials(*options);
  ASSERT_FALSE(credentials.ok());
  EXPECT_THAT(MessageOf(credentials.status()), StartsWith("$DROPLESS_TOKEN_FILE /nonexistent"));

  // The flag, when it is the flag.
  options = Options({"--token-file", "/nonexistent/flag.token"}, env);
  ASSERT_TRUE(options.ok());
  credentials = ReadChannelCredentials(*options);
  ASSERT_FALSE(credentials.ok());
  EXPECT_THAT(MessageOf(credentials.status()),
              StartsWith("--token-file /nonexistent/flag.token: cannot open"));
  const std::string empty = WriteFile("empty.token", " \n");
  options = Options({}, {{"DROPLESS_TOKEN_FILE", empty}});
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(MessageOf(ReadBearerToken(*options).status()),
            "$DROPLESS_TOKEN_FILE " + empty + ": empty");

  // The CA: from the variable, or from the flag.
  options = Options({"--token", "t"}, env);
  ASSERT_TRUE(options.ok());
  credentials = ReadChannelCredentials(*options);
  ASSERT_FALSE(credentials.ok());
  EXPECT_THAT(MessageOf(credentials.status()), StartsWith("$DROPLESS_TLS_CA: "));
  EXPECT_THAT(MessageOf(credentials.status()), HasSubstr("/nonexistent/ca.pem"));
  options = Options({"--token", "t", "--tls-ca", "/nonexistent/flag-ca.pem"}, env);
  ASSERT_TRUE(options.ok());
  credentials = ReadChannelCredentials(*options);
  ASSERT_FALSE(credentials.ok());
  EXPECT_THAT(MessageOf(credentials.status()), StartsWith("--tls-ca: "));

  // Plaintext needs neither.
  options = Options({}, {{"DROPLESS_INSECURE", "1"}, {"DROPLESS_TOKEN_FILE", "/nonexistent"}});
  ASSERT_TRUE(options.ok());
  EXPECT_TRUE(ReadChannelCredentials(*options).ok());
}

// As ssh with a private key: a token file its group or others may read or write is refused
// (the token is not sent), naming where the file came from, its mode and the fix; the mode is the
// link's target's.
TEST_F(CredentialsTest, ATokenFileOthersMayReadIsRefused) {
  const std::string open = WriteFile("open.token", "t0ken\n", 0644);
  absl::StatusOr<GlobalOptions> options = Options({}, {{"DROPLESS_TOKEN_FILE", open}});
  ASSERT_TRUE(options.ok());
  absl::StatusOr<std::string> token = ReadBearerToken(*options);
  EXPECT_EQ(token.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MessageOf(token.status()),
            "$DROPLESS_TOKEN_FILE " + open +
                ": mode 0644 gives others than its owner access (group read, others read); a "
                "file of bearer tokens must be readable by its owner only: chmod 600 " + open);
  const std::string group = WriteFile("group.token", "t0ken\n", 0660);
  options = Options({"--token-file", group}, NoEnvironment());
  ASSERT_TRUE(options.ok());
  auto credentials = ReadChannelCredentials(*options);
  ASSERT_FALSE(credentials.ok());
  EXPECT_THAT(MessageOf(credentials.status()),
              StartsWith("--token-file " + group + ": mode 0660 gives others than its owner "
                         "access (group read, group write)"));
  const std::string link = ::testing::TempDir() + "/link.token";
  unlink(link.c_str());
  ASSERT_EQ(symlink(open.c_str(), link.c_str()), 0);
  options = Options({"--token-file", link}, NoEnvironment());
  ASSERT_TRUE(options.ok());
  EXPECT_THAT(MessageOf(ReadBearerToken(*options).status()), HasSubstr(": mode 0644 gives"));
  // Owner-only files are read, whichever of 0600 and 0400.
  for (mode_t mode : {0600, 0400}) {
    const std::string own = WriteFile(absl::StrCat("own-", mode, ".token"), "t0ken\n", mode);
    options = Options({"--token-file", own}, NoEnvironment());
    ASSERT_TRUE(options.ok());
    absl::StatusOr<std::string> read = ReadBearerToken(*options);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, "t0ken");
  }
}

// A token file of another user is not sent, whatever its mode (as ssh with such a key). Only root
// can give a file away, so this needs root (as the CI runs).
TEST_F(CredentialsTest, ATokenFileOfAnotherUserIsRefused) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "only root can make a file owned by another user (chown); the CI runs as root";
  }
  const std::string theirs = WriteFile("theirs.token", "t0ken\n", 0600);
  ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0);
  absl::StatusOr<GlobalOptions> options = Options({"--token-file", theirs}, NoEnvironment());
  ASSERT_TRUE(options.ok());
  absl::StatusOr<std::string> token = ReadBearerToken(*options);
  EXPECT_EQ(token.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MessageOf(token.status()),
            "--token-file " + theirs +
                ": owned by uid 65534, neither this process's user (uid 0) nor root; a file of "
                "bearer tokens must belong to the user who reads it: chown 0 " + theirs);
}

TEST(GlobalOptionsTest, CoordinatorFromTheFlagElseTheEnvironmentElseLocalhost) {
  absl::StatusOr<GlobalOptions> options =
      Options({"--coordinator", "a:1"}, {{"DROPLESS_COORDINATOR", "b:2"}});
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->coordinator.value, "a:1");
  EXPECT_EQ(options->coordinator.from, "--coordinator");
  options = Options({}, {{"DROPLESS_COORDINATOR", "b:2"}});
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->coordinator.value, "b:2");
  EXPECT_EQ(options->coordinator.from, "$DROPLESS_COORDINATOR");
  options = Options({}, NoEnvironment());
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->coordinator.value, "localhost:7070");
  EXPECT_FALSE(options->coordinator.given());
  // Bad flags the user typed are still refused at once.
  EXPECT_THAT(MessageOf(Options({"--timeout", "nan"}, NoEnvironment()).status()),
              StartsWith("--timeout"));
  EXPECT_THAT(MessageOf(Options({"-o", "xml"}, NoEnvironment()).status()), StartsWith("-o"));
}

}  // namespace
}  // namespace dropless::cli
