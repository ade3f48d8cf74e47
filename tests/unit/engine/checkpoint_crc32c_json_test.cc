// The checkpoint library's building blocks: CRC-32C against published check values and the
// table implementation, and the strict JSON parser / quoting.
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/engine/checkpoint/crc32c.h"
#include "worker/engine/checkpoint/json.h"

namespace dropless::engine {
namespace {

TEST(Crc32cTest, MatchesPublishedCheckValues) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xe3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8a9136aau);  // RFC 3720 B.4
  EXPECT_EQ(Crc32c(ones.data(), ones.size()), 0x62a8ab43u);
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
}

TEST(Crc32cTest, HardwareAndTablesAgreeAndExtendConcatenates) {
  std::mt19937_64 rng(7);
  std::vector<unsigned char> data(4099);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (size_t offset : {0, 1, 3, 8}) {
    for (size_t size : {0, 1, 7, 8, 9, 63, 64, 65, 4000}) {
      const unsigned char* p = data.data() + offset;
      const uint32_t whole = Crc32c(p, size);
      EXPECT_EQ(whole, crc32c_internal::ExtendPortable(0, p, size)) << offset << " " << size;
      for (size_t cut : {size_t{0}, size / 3, size}) {
        EXPECT_EQ(Crc32cExtend(Crc32c(p, cut), p + cut, size - cut), whole);
      }
    }
  }
}

TEST(JsonTest, ParsesAValueTreeKeepingIntegersExact) {
  absl::StatusOr<json::Value> v = json::Parse(
      " {\"a\": [1, -2.5e3, 18446744073709551615], \"b\": {\"c\": \"x\\u00e9\\ud83d\\ude00\\n\"},"
      " \"t\": true, \"n\": null} ");
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_TRUE(v->is_object());
  EXPECT_EQ(v->keys(), (std::vector<std::string>{"a", "b", "t", "n"}));
  const json::Value* a = v->Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items().size(), 3u);
  EXPECT_EQ(*json::ToUint64(a->items()[2]), UINT64_MAX);
  EXPECT_EQ(a->items()[1].text(), "-2.5e3");
  EXPECT_FALSE(json::ToUint64(a->items()[1]).ok());
  EXPECT_FALSE(json::ToNonNegativeInt64(a->items()[2]).ok());
  EXPECT_EQ(v->Find("b")->Find("c")->text(), "x\xc3\xa9\xf0\x9f\x98\x80\n");
  EXPECT_TRUE(v->Find("t")->boolean());
  EXPECT_EQ(v->Find("n")->kind(), json::Value::Kind::kNull);
  EXPECT_EQ(v->Find("zz"), nullptr);
}

TEST(JsonTest, RefusesWhatRfc8259Refuses) {
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  const std::vector<std::string> bad = {"",
                                        " ",
                                        "{",
                                        "}",
                                        "{\"a\":1,}",
                                        "[1,]",
                                        "{\"a\" 1}",
                                        "{\"a\":1 \"b\":2}",
                                        "{a:1}",
                                        "{\"a\":1}x",
                                        "01",
                                        "1.",
                                        ".5",
                                        "-",
                                        "1e",
                                        "+1",
                                        "tru",
                                        "nul",
                                        "\"abc",
                                        "\"a\\x\"",
                                        "\"\\u12\"",
                                        "\"\\ud800\"",
                                        "\"\\udc00\"",
                                        "\"\\ud800\\u0041\"",
                                        std::string("\"a\x01\""),
                                        "\"\xff\"",
                                        "\"\xc0\xaf\"",
                                        "\"\xed\xa0\x80\"",
                                        "\"\xf4\x90\x80\x80\"",
                                        "\"\xe2\x82\"",
                                        "{\"a\":1,\"a\":2}",
                                        deep,
                                        std::string("{\"a\":1}\0", 8),
                                        "[1] [2]",
                                        "'a'",
                                        "NaN"};
  for (const std::string& text : bad) {
    absl::StatusOr<json::Value> v = json::Parse(text);
    EXPECT_FALSE(v.ok()) << "accepted: " << text;
    if (!v.ok()) EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(json::Parse(std::string(60, '[') + std::string(60, ']')).ok());
}

// A document of many small values is refused before its tree outgrows the text many times over:
// the budget counts every value, containers included.
TEST(JsonTest, RefusesMoreValuesThanItsBudget) {
  std::string zeros = "[0";
  for (int i = 1; i < 99; ++i) zeros += ",0";
  zeros += "]";  // 100 values: the array and 99 zeros
  EXPECT_TRUE(json::Parse(zeros, json::kDefaultMaxDepth, 100).ok());
  absl::StatusOr<json::Value> over = json::Parse(zeros, json::kDefaultMaxDepth, 99);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(over.status().message().find("more values"), std::string::npos) << over.status();
  std::string many = "[0";
  many.reserve(2 * json::kDefaultMaxValues + 2);
  while (static_cast<int64_t>(many.size()) < 2 * json::kDefaultMaxValues) many += ",0";
  many += "]";
  absl::StatusOr<json::Value> refused = json::Parse(many);  // ~2^20 + 1 values by default
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("more values"), std::string::npos) << refused.status();
}

// A field whose type is part of a format (a version) is a JSON integer or an error naming it and
// saying what is there instead.
TEST(JsonTest, IntegerMemberTakesOnlyJsonIntegers) {
  absl::StatusOr<json::Value> root = json::Parse(
      R"({"a": 1, "b": -7, "c": 9223372036854775807, "s": "1", "f": 1.0, "e": 1e0, "t": true,)"
      R"( "n": null, "x": [1], "o": {}, "big": 9223372036854775808, "\u001b": "\u001b"})");
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(*json::IntegerMember(*root, "a"), 1);
  EXPECT_EQ(*json::IntegerMember(*root, "b"), -7);
  EXPECT_EQ(*json::IntegerMember(*root, "c"), INT64_MAX);
  const std::pair<const char*, const char*> refused[] = {
      {"s", "field \"s\" is the string \"1\", expected a JSON integer"},
      {"f", "field \"f\" is 1.0, expected"},
      {"e", "field \"e\" is 1e0, expected"},
      {"t", "field \"t\" is a boolean, expected"},
      {"n", "field \"n\" is null, expected"},
      {"x", "field \"x\" is an array, expected"},
      {"o", "field \"o\" is an object, expected"},
      {"big", "field \"big\" is 9223372036854775808, expected a JSON integer (within 64 bits)"},
      {"missing", "field \"missing\" is missing"},
      {"\x1b", "field \"\\u001b\" is the string \"\\u001b\""},  // quoted for a terminal
  };
  for (const auto& [key, says] : refused) {
    const absl::Status s = json::IntegerMember(*root, key).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << key << ": " << s;
    EXPECT_EQ(s.message().substr(0, std::string(says).size()), says) << s;
  }
  EXPECT_FALSE(json::IntegerMember(*json::Parse("[1]"), "0").ok());  // not an object
}

TEST(JsonTest, QuoteEscapesLikeSerdeJsonAndRoundTrips) {
  const std::string text = "a\"b\\c\b\f\n\r\t\x01\x1f\x7f/\xc3\xa9";
  const std::string quoted = json::Quote(text);
  EXPECT_EQ(quoted, "\"a\\\"b\\\\c\\b\\f\\n\\r\\t\\u0001\\u001f\x7f/\xc3\xa9\"");
  absl::StatusOr<json::Value> back = json::Parse(quoted);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->text(), text);
}

}  // namespace
}  // namespace dropless::engine
