// Command-line parsing for a kubectl-style CLI. Hand-written rather than absl::Flags: absl's flags
// are process-global (`-f` is a file for submit and "follow" for logs), and absl exits 1 on a bad
// flag where this CLI promises exit code 2 for usage errors.
//
// Accepted forms: `-o json`, `-o=json`, `--output json`, `--output=json`, `-f` (boolean), `--`
// (everything after is positional). Flags may come before or after positional arguments.
#ifndef DROPLESS_CLI_ARGS_H_
#define DROPLESS_CLI_ARGS_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/grpc_security.h"

namespace dropless::cli {

struct FlagSpec {
  std::vector<std::string> names;  // e.g. {"-o", "--output"}; names[0]'s bare form is the key
  bool takes_value = false;
  std::string value_name;          // for help: "FILE"
  std::string help;
};

class ParsedArgs {
 public:
  // InvalidArgument for an unknown flag or a missing value.
  static absl::StatusOr<ParsedArgs> Parse(const std::vector<std::string>& args,
                                          const std::vector<FlagSpec>& specs);

  // Key: the longest name without dashes ("output" for {"-o", "--output"}).
  bool Has(const std::string& key) const { return values_.count(key) > 0; }
  // The last value given for the key, or `fallback`.
  std::string Get(const std::string& key, const std::string& fallback = "") const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

std::string FlagKey(const FlagSpec& spec);
// "  -o, --output FORMAT   help" lines.
std::string FlagHelp(const std::vector<FlagSpec>& specs);

enum class OutputFormat { kText, kJson, kYaml };

// A connection setting and where its value came from, for messages: "--token-file",
// "$DROPLESS_TOKEN_FILE", ...; `from` is empty when the setting is not given.
struct Setting {
  std::string value;
  std::string from;
  bool given() const { return !from.empty(); }
};

// Flags every command takes. The connection settings (address, CA, token) are only collected
// here: they are checked and their files read when a command makes a client (Client::Connect),
// so that a command that makes no call (version --client, completion) never fails on them.
struct GlobalOptions {
  Setting coordinator;  // host:port; not given: localhost:7070
  absl::Duration timeout = absl::Seconds(10);
  OutputFormat output = OutputFormat::kText;
  bool insecure = false;  // plaintext (--insecure, $DROPLESS_INSECURE=1): no CA, no token
  Setting tls_ca;         // CA file; not given: the system's CAs
  // The bearer token, by kTokenPrecedence: a file (token_file) or the token itself (token); at
  // most one of the two is given.
  Setting token_file;
  Setting token;
};

// Where the bearer token comes from, the first one set winning: a flag beats an environment
// variable, and a file beats a token given inline.
inline constexpr char kTokenPrecedence[] =
    "--token-file, else --token, else $DROPLESS_TOKEN_FILE, else $DROPLESS_TOKEN";

const std::vector<FlagSpec>& GlobalFlagSpecs();
// Longest duration a flag takes: 10 years. Beyond it a deadline or an age means nothing, and
// absl::Time arithmetic would saturate to infinity (no deadline at all).
inline constexpr absl::Duration kMaxFlagDuration = absl::Hours(24 * 365 * 10);
// A duration flag's value: "10s", "500ms", "2m", "1h30m", or a bare number of seconds.
// InvalidArgument naming the flag when it is not one, not positive, not finite (nan, inf) or
// longer than kMaxFlagDuration.
absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& flag, const std::string& text);
// The value of an environment variable, "" when it is not set.
using Environment = std::function<std::string(const std::string& name)>;
Environment ProcessEnvironment();
// The global flags of `args`, with the environment for what they leave out: --coordinator, else
// $DROPLESS_COORDINATOR, else localhost:7070; the CA and the token (kTokenPrecedence). Nothing is
// read from disk. InvalidArgument for a bad --timeout or -o.
absl::StatusOr<GlobalOptions> ReadGlobalOptions(const ParsedArgs& args,
                                                const Environment& env = ProcessEnvironment());
// The channel's credentials: reads the CA file and the token file (Client::Connect calls it).
// Errors name the flag or the variable the bad value came from ("$DROPLESS_TOKEN_FILE /x: cannot
// open ...").
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ReadChannelCredentials(
    const GlobalOptions& options);
// The bearer token options name ("" for none): the token file's text, trimmed, or the token.
// A token file its group or others may read or write, or owned by neither this user nor root, is
// refused (FailedPrecondition naming the mode and `chmod 600`, or the owner and `chown`; links
// followed), as ssh refuses such a private key (ReadPrivateFile, common/private_file.h).
absl::StatusOr<std::string> ReadBearerToken(const GlobalOptions& options);

}  // namespace dropless::cli

#endif  // DROPLESS_CLI_ARGS_H_
