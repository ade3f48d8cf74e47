#include "cli/args.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/host_port.h"

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
      {{"--timeout"}, true, "DURATION", "deadline of each request, e.g. 10s, 500ms (default 10s)"},
      {{"-o", "--output"}, true, "FORMAT", "output format of get/describe/watch: json | yaml"},
      {{"--token-file"}, true, "FILE",
       "file holding your bearer token (default $DROPLESS_TOKEN_FILE; or $DROPLESS_TOKEN)"},
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
    d = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(text, &d)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": not a duration: '", text, "' (e.g. 10s, 500ms, 2m)"));
  }
  if (d <= absl::ZeroDuration()) return absl::InvalidArgumentError(flag + " must be positive");
  return d;
}

namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

// TLS and the bearer token: flags, else the environment.
absl::StatusOr<ChannelSecurity> ReadChannelSecurity(const ParsedArgs& args) {
  ChannelSecurity security;
  security.insecure = args.Has("insecure") || Env("DROPLESS_INSECURE") == "1";
  if (security.insecure) return security;
  security.tls.ca = args.Get("tls-ca", Env("DROPLESS_TLS_CA"));
  std::string token_file = args.Get("token-file", Env("DROPLESS_TOKEN_FILE"));
  if (args.Has("token")) {
    security.bearer_token = args.Get("token");
  } else if (!token_file.empty()) {
    std::ifstream in(token_file, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("--token-file ", token_file, ": cannot open"));
    std::ostringstream text;
    text << in.rdbuf();
    security.bearer_token = std::string(absl::StripAsciiWhitespace(text.str()));
    if (security.bearer_token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--token-file ", token_file, ": empty"));
    }
  } else {
    security.bearer_token = Env("DROPLESS_TOKEN");
  }
  return security;
}

}  // namespace

absl::StatusOr<GlobalOptions> ReadGlobalOptions(const ParsedArgs& args) {
  GlobalOptions options;
  options.help = args.Has("help");
  const char* env = std::getenv("DROPLESS_COORDINATOR");
  options.coordinator =
      args.Get("coordinator", env != nullptr && *env != '\0' ? env : "localhost:7070");
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("--coordinator must not be empty");
  }
  const bool from_env = !args.Has("coordinator") && env != nullptr && *env != '\0';
  if (absl::Status s = ParseHostPort(from_env ? "$DROPLESS_COORDINATOR" : "--coordinator",
                                     options.coordinator, 1)
                           .status();
      !s.ok()) {
    return s;
  }
  if (args.Has("timeout")) {
    absl::StatusOr<absl::Duration> timeout = ParseDurationFlag("--timeout", args.Get("timeout"));
    if (!timeout.ok()) return timeout.status();
    options.timeout = *timeout;
  }
  absl::StatusOr<ChannelSecurity> security = ReadChannelSecurity(args);
  if (!security.ok()) return security.status();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(*security);
  if (!credentials.ok()) return credentials.status();
  options.credentials = *credentials;
  options.insecure = security->insecure;
  const std::string output = args.Get("output", "text");
  if (output == "json") {
    options.output = OutputFormat::kJson;
  } else if (output == "yaml") {
    options.output = OutputFormat::kYaml;
  } else if (output != "text" && output != "table") {
    return absl::InvalidArgumentError(
        absl::StrCat("-o: unknown output format '", output, "' (json | yaml)"));
  }
  return options;
}

}  // namespace dropless::cli
