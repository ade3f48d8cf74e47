// Network addresses given as host:port ([v6]:port for IPv6): listen addresses and the address a
// client dials. One parser for every binary, so that each refuses the same malformed address with
// the same message.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dropless {

struct HostPort {
  std::string host;  // without the brackets of an IPv6 literal
  int port = 0;
};

// Splits `address`; InvalidArgument naming `field` unless the host is non-empty and the port is a
// decimal number in min_port..65535 (0 for "any free port" where a listen address allows it).
absl::StatusOr<HostPort> ParseHostPort(absl::string_view field, absl::string_view address,
                                       int min_port);

// Host part of host:port, [v6]:port or a bare host.
absl::string_view HostOf(absl::string_view address);

}  // namespace dropless
