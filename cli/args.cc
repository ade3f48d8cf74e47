#include "cli/args.h"

#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/private_file.h"
#include "common/status_context.h"

namespace dropless::cli {

std::string FlagKey(const FlagSpec& spec) {
  std::string best;
  for (const std::string& n : spec.names) {
    std::string bare = n.substr(n.find_first_not_of('-'));
    if (bare.size() > best.size()) best = bare;
  }
  return best;
}

absl::StatusOr<ParsedArgs> ParsedArgs::Parse(const std::vector<std::string>& args,
                                             const std::vector<FlagSpec>& specs) {
  ParsedArgs parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      parsed.positional_.insert(parsed.positional_.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      parsed.positional_.push_back(arg);
      continue;
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const FlagSpec* spec = nullptr;
    for (const FlagSpec& s : specs) {
      for (const std::string& n : s.names) {
        if (n == name) spec = &s;
      }
    }
    if (spec == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag ", name));
    std::vector<std::string>& values = parsed.values_[FlagKey(*spec)];
    if (!spec->takes_value) {
      if (eq != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat("flag ", name, " takes no value"));
      }
      values.push_back("true");
    } else if (eq != std::string::npos) {
      values.push_back(arg.substr(eq + 1));
    } else if (i + 1 < args.size()) {
      values.push_back(args[++i]);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("flag ", name, " needs a value (", spec->value_name, ")"));
    }
  }
  return parsed;
}

std::string ParsedArgs::Get(const std::string& key, const std::string& fallback) const {
  auto it = values_.find(key);
  return it == values_.end() || it->second.empty() ? fallback : it->second.back();
}

std::string FlagHelp(const std::vector<FlagSpec>& specs) {
  std::string out;
  for (const FlagSpec& s : specs) {
    std::string names;
    for (const std::string& n : s.names) absl::StrAppend(&names, names.empty() ? "" : ", ", n);
    if (s.takes_value) absl::StrAppend(&names, " ", s.value_name);
    absl::StrAppendFormat(&out, "  %-28s %s\n", names, s.help);
  }
  return out;
}

const std::vector<FlagSpec>& GlobalFlagSpecs() {
  static const std::vector<FlagSpec>* specs = new std::vector<FlagSpec>{
      {{"--coordinator"}, true, "ADDR",
       "coordinator address host:port (default $DROPLESS_COORDINATOR, else localhost:7070)"},
      {{"--timeout"}, true, "DURATION",
       "deadline of each request, e.g. 10s, 500ms (default 10s); streams (logs, logs -f, watch, "
       "submit --wait) wait this long for their first answer only"},
      {{"-o", "--output"}, true, "FORMAT", "output format of get/describe/watch: json | yaml"},
      {{"--token-file"}, true, "FILE",
       absl::StrCat("file holding your bearer token; the token is the first of: ",
                    kTokenPrecedence)},
      {{"--token"}, true, "TOKEN", "bearer token (visible to `ps`: prefer --token-file)"},
      {{"--tls-ca"}, true, "FILE",
       "CA certificate that signed the coordinator's (default $DROPLESS_TLS_CA, else the "
       "system's CAs)"},
      {{"--insecure"}, false, "",
       "plaintext, no token: only for a coordinator run with --insecure (or $DROPLESS_INSECURE=1)"},
      {{"-h", "--help"}, false, "", "show help"},
  };
  return *specs;
}

absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& flag, const std::string& text) {
  absl::Duration d;
  double seconds = 0;
  if (absl::SimpleAtod(text, &seconds)) {
    // absl::Seconds(NaN) is an infinite duration: `--timeout nan` would remove the deadline.
    if (!std::isfinite(seconds)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": not a finite duration: '", text, "'"));
    }
    d = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(text, &d)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": not a duration: '", text, "' (e.g. 10s, 500ms, 2m)"));
  }
  if (d <= absl::ZeroDuration()) return absl::InvalidArgumentError(flag + " must be positive");
  // "inf" parses as absl::InfiniteDuration(); 1e400 saturates to it.
  if (d > kMaxFlagDuration) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", text, "' is too long (at most ",
                                                   absl::FormatDuration(kMaxFlagDuration), ")"));
  }
  return d;
}

Environment ProcessEnvironment() {
  return [](const std::string& name) {
    const char* value = std::getenv(name.c_str());
    return value == nullptr ? std::string() : std::string(value);
  };
}

namespace {

// The flag's value when given, else the variable's when set; empty values count as not given.
Setting FlagOrEnvironment(const ParsedArgs& args, const std::string& key, const Environment& env,
                          const std::string& variable) {
  if (std::string value = args.Get(key); !value.empty()) return {value, "--" + key};
  if (std::string value = env(variable); !value.empty()) return {value, "$" + variable};
  return {};
}

}  // namespace

absl::StatusOr<GlobalOptions> ReadGlobalOptions(const ParsedArgs& args, const Environment& env) {
  GlobalOptions options;
  // An empty --coordinator is an error (Client::Connect); an empty variable counts as not set.
  if (args.Has("coordinator")) {
    options.coordinator = {args.Get("coordinator"), "--coordinator"};
  } else if (std::string address = env("DROPLESS_COORDINATOR"); !address.empty()) {
    options.coordinator = {address, "$DROPLESS_COORDINATOR"};
  } else {
    options.coordinator.value = "localhost:7070";
  }
  if (args.Has("timeout")) {
    absl::StatusOr<absl::Duration> timeout = ParseDurationFlag("--timeout", args.Get("timeout"));
    if (!timeout.ok()) return timeout.status();
    options.timeout = *timeout;
  }
  const std::string output = args.Get("output", "text");
  if (output == "json") {
    options.output = OutputFormat::kJson;
  } else if (output == "yaml") {
    options.output = OutputFormat::kYaml;
  } else if (output != "text" && output != "table") {
    return absl::InvalidArgumentError(
        absl::StrCat("-o: unknown output format '", output, "' (json | yaml)"));
  }
  options.insecure = args.Has("insecure") || env("DROPLESS_INSECURE") == "1";
  if (options.insecure) return options;  // plaintext: no CA, no token
  options.tls_ca = FlagOrEnvironment(args, "tls-ca", env, "DROPLESS_TLS_CA");
  // kTokenPrecedence: both flags before either variable.
  const std::string flag_file = args.Get("token-file");
  const std::string flag_token = args.Get("token");
  const std::string env_file = env("DROPLESS_TOKEN_FILE");
  const std::string env_token = env("DROPLESS_TOKEN");
  if (!flag_file.empty()) {
    options.token_file = {flag_file, "--token-file"};
  } else if (!flag_token.empty()) {
    options.token = {flag_token, "--token"};
  } else if (!env_file.empty()) {
    options.token_file = {env_file, "$DROPLESS_TOKEN_FILE"};
  } else if (!env_token.empty()) {
    options.token = {env_token, "$DROPLESS_TOKEN"};
  }
  return options;
}

absl::StatusOr<std::string> ReadBearerToken(const GlobalOptions& options) {
  if (!options.token_file.given()) return options.token.value;
  const Setting& file = options.token_file;
  // As ssh with a private key: a token others may read, or another user's, is refused, not sent.
  absl::StatusOr<std::string> text = ReadPrivateFile(file.value);
  if (!text.ok()) return WithContext(absl::StrCat(file.from, " ", file.value), text.status());
  std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(file.from, " ", file.value, ": empty"));
  }
  return token;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ReadChannelCredentials(
    const GlobalOptions& options) {
  ChannelSecurity security;
  security.insecure = options.insecure;
  if (!security.insecure) {
    security.tls.ca = options.tls_ca.value;
    absl::StatusOr<std::string> token = ReadBearerToken(options);
    if (!token.ok()) return token.status();
    security.bearer_token = *std::move(token);
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(security);
  // The CLI gives no client certificate: an error is about the CA file.
  if (!credentials.ok() && options.tls_ca.given()) {
    return absl::Status(credentials.status().code(),
                        absl::StrCat(options.tls_ca.from, ": ", credentials.status().message()));
  }
  return credentials;
}

}  // namespace dropless::cli
