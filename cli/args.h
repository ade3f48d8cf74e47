// Command-line parsing for a kubectl-style CLI. Hand-written rather than absl::Flags: absl's flags
// are process-global (`-f` is a file for submit and "follow" for logs), and absl exits 1 on a bad
// flag where this CLI promises exit code 2 for usage errors.
//
// Accepted forms: `-o json`, `-o=json`, `--output json`, `--output=json`, `-f` (boolean), `--`
// (everything after is positional). Flags may come before or after positional arguments.
#ifndef DROPLESS_CLI_ARGS_H_
#define DROPLESS_CLI_ARGS_H_

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

// Flags every command takes.
struct GlobalOptions {
  std::string coordinator;  // host:port
  absl::Duration timeout = absl::Seconds(10);
  OutputFormat output = OutputFormat::kText;
  bool help = false;
  bool insecure = false;  // plaintext (--insecure)
  // TLS (CA from --tls-ca) with the bearer token, or plaintext with --insecure.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

const std::vector<FlagSpec>& GlobalFlagSpecs();
// A duration flag's value: "10s", "500ms", "2m", "1h30m", or a bare number of seconds.
// InvalidArgument naming the flag when it is not one or not positive.
absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& flag, const std::string& text);
// --coordinator, else $DROPLESS_COORDINATOR, else localhost:7070; the channel's credentials
// (errors name a CA or token file that cannot be read).
absl::StatusOr<GlobalOptions> ReadGlobalOptions(const ParsedArgs& args);

}  // namespace dropless::cli

#endif  // DROPLESS_CLI_ARGS_H_
