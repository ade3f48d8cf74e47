#include "common/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace dropless {
namespace {

const std::string kE = "\xC3\xA9";               // é, 2 bytes
const std::string kEuro = "\xE2\x82\xAC";        // €, 3 bytes
const std::string kEmoji = "\xF0\x9F\x98\x80";   // U+1F600, 4 bytes
const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8Test, PrefixNeverEndsInsideACharacter) {
  const std::string text = "a" + kE + kEuro + kEmoji + "z";  // 1 + 2 + 3 + 4 + 1 bytes
  const size_t expected[] = {0, 1, 1, 3, 3, 3, 6, 6, 6, 6, 10, 11, 11};
  for (size_t max = 0; max <= text.size() + 1; ++max) {
    EXPECT_EQ(Utf8PrefixLength(text, max), expected[max]) << "max " << max;
    EXPECT_TRUE(IsValidUtf8(TruncateUtf8(text, max))) << "max " << max;
  }
}

TEST(Utf8Test, ValidTextIsUnchanged) {
  const std::string text = "loss=0.5 " + kE + kEuro + kEmoji;
  EXPECT_TRUE(IsValidUtf8(text));
  EXPECT_EQ(ToValidUtf8(text), text);
  EXPECT_EQ(ToValidUtf8(""), "");
}

TEST(Utf8Test, MalformedBytesBecomeReplacementCharacters) {
  struct Case {
    std::string in, out;
  };
  const Case cases[] = {
      {"a\x80z", "a" + kFffd + "z"},                    // stray continuation byte
      {"\xC3", kFffd},                                  // cut sequence at the end
      {"\xC0\xAF", kFffd + kFffd},                      // overlong '/'
      {"\xE0\x80\xAF", kFffd + kFffd + kFffd},          // overlong, 3 bytes
      {"\xED\xA0\x80", kFffd + kFffd + kFffd},          // surrogate U+D800
      {"\xF4\x90\x80\x80", kFffd + kFffd + kFffd + kFffd},  // past U+10FFFF
      {"\xFF" + kE, kFffd + kE},
      {kEuro.substr(0, 2) + "x", kFffd + kFffd + "x"},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(IsValidUtf8(c.in));
    EXPECT_EQ(ToValidUtf8(c.in), c.out);
    EXPECT_TRUE(IsValidUtf8(ToValidUtf8(c.in)));
  }
}

TEST(Utf8Test, ControlCharactersAreFoundAndReplaced) {
  EXPECT_FALSE(HasControlCharacters("plain text, \xc3\xa9t\xc3\xa9 and \xe2\x82\xac"));
  for (const char* bad : {"a\nb", "\x1b[2J", "tab\t", "del\x7f",
                          "csi\xc2\x9b"
                          "31m",
                          "\xc2\x80"}) {
    EXPECT_TRUE(HasControlCharacters(bad)) << bad;
  }
  EXPECT_EQ(ReplaceControlCharacters("a\nb\x1b[1m\xc2\x9b\xc3\xa9"), "a?b?[1m?\xc3\xa9");
  EXPECT_EQ(ReplaceControlCharacters("\xc2\xa0ok"), "\xc2\xa0ok");  // U+00A0 is not a control
}

// Worker-supplied text: valid UTF-8, cut without splitting a character, controls replaced.
TEST(Utf8Test, SanitizedTextIsValidBoundedAndFreeOfControls) {
  EXPECT_EQ(SanitizedText("a\nb\xff\x1b[1m", 64), "a?b\xef\xbf\xbd?[1m");
  EXPECT_EQ(SanitizedText("ab\xc3\xa9", 3), "ab");  // not half of the e-acute
  EXPECT_EQ(SanitizedText("phase", 32), "phase");
}

}  // namespace
}  // namespace dropless
