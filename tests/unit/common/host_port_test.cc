// common/host_port.h: host:port addresses, the one parser behind every binary's address fields.
#include "common/host_port.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless {
namespace {

using ::testing::HasSubstr;

TEST(HostPortTest, SplitsNamesIPv4AndBracketedIPv6) {
  absl::StatusOr<HostPort> a = ParseHostPort("listen", "coordinator.cluster:7070", 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "coordinator.cluster");
  EXPECT_EQ(a->port, 7070);
  absl::StatusOr<HostPort> b = ParseHostPort("listen", "[::1]:65535", 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 65535);
  absl::StatusOr<HostPort> any = ParseHostPort("listen", "0.0.0.0:0", 0);
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ(any->port, 0);
}

TEST(HostPortTest, RefusesWhatWouldWrapOrMisparseNamingTheField) {
  for (const char* bad :
       {"host:65536", "host:70000", "host:99999999999", "host:-1", "host:+80", "host:", "host",
        ":7070", "::1:7070", "[::1", "[::1]7070", "host:80x", "host: 80"}) {
    absl::Status s = ParseHostPort("--coordinator", bad, 1).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr("--coordinator: ")) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr(bad)) << bad;
  }
  // Port 0 only where the caller allows it (a listen address: any free port).
  EXPECT_FALSE(ParseHostPort("--coordinator", "host:0", 1).ok());
}

TEST(HostPortTest, HostOfTakesTheHostPart) {
  EXPECT_EQ(HostOf("a.b:1"), "a.b");
  EXPECT_EQ(HostOf("[fe80::1]:7070"), "fe80::1");
  EXPECT_EQ(HostOf("bare"), "bare");
}

}  // namespace
}  // namespace dropless
