#include "common/host_port.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dropless {

absl::StatusOr<HostPort> ParseHostPort(absl::string_view field, absl::string_view address,
                                       int min_port) {
  auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", why, " (got '", address, "'; expected host:port or [v6]:port)"));
  };
  HostPort out;
  absl::string_view port;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos) return invalid("the IPv6 host has no closing ']'");
    out.host = std::string(address.substr(1, close - 1));
    absl::string_view rest = address.substr(close + 1);
    if (!absl::StartsWith(rest, ":")) return invalid("no port after the IPv6 host");
    port = rest.substr(1);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) return invalid("no port");
    if (address.find(':') != colon) return invalid("an IPv6 host must be in brackets");
    out.host = std::string(address.substr(0, colon));
    port = address.substr(colon + 1);
  }
  if (out.host.empty()) return invalid("no host");
  bool digits = !port.empty() && port.size() <= 5;
  for (char c : port) digits = digits && absl::ascii_isdigit(static_cast<unsigned char>(c));
  if (!digits || !absl::SimpleAtoi(port, &out.port) || out.port < min_port || out.port > 65535) {
    return invalid(absl::StrCat("the port must be a number in ", min_port, "..65535"));
  }
  return out;
}

absl::string_view HostOf(absl::string_view address) {
  if (absl::StartsWith(address, "[")) {
    size_t close = address.find(']');
    return close == absl::string_view::npos ? address.substr(1) : address.substr(1, close - 1);
  }
  size_t colon = address.rfind(':');
  if (colon != absl::string_view::npos && address.find(':') == colon) {
    return address.substr(0, colon);
  }
  return address;
}

}  // namespace dropless
