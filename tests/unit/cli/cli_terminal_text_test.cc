// Terminal text (cli/output/terminal_text.h): what a user wrote reaches a terminal without control
// characters, and a pipe or -o json|yaml as written (or escaped by the format).
#include <pty.h>
#include <unistd.h>

#include <string>

#include "cli/output/terminal_text.h"
#include "cli/output/value.h"
#include "cli/output/views.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// An escape sequence of each kind a log line could carry: clear screen (CSI), OSC 52 (write the
// clipboard, BEL-terminated), a window title (OSC 0, ST-terminated), CR, DEL and the one-character
// CSI of C1 (U+009B).
constexpr char kHostile[] =
    "a\x1b[2Jb\x1b]52;c;cm0gLXJmIH4=\x07"
    "c\x1b]0;pwned\x1b\\d\re\x7f"
    "f\xc2\x9b"
    "31mg";

TEST(TerminalSafeTest, ReplacesEveryControlCharacterButNewlineAndTab) {
  EXPECT_EQ(TerminalSafe(kHostile), "a?[2Jb?]52;c;cm0gLXJmIH4=?c?]0;pwned?\\d?e?f?31mg");
  EXPECT_EQ(TerminalSafe("step 1\tloss 2.5\n\nstep 2\n"), "step 1\tloss 2.5\n\nstep 2\n");
  EXPECT_EQ(TerminalSafe("\n\x1b\n"), "\n?\n");
  EXPECT_EQ(TerminalSafe(""), "");
  // Text that is not control characters passes: UTF-8 beyond ASCII, U+00A0.
  EXPECT_EQ(TerminalSafe("caf\xc3\xa9 \xe2\x9c\x93 \xc2\xa0"), "caf\xc3\xa9 \xe2\x9c\x93 \xc2\xa0");
  // A lone 0x9b (CSI to a terminal that is not in UTF-8 mode) is not UTF-8: U+FFFD.
  EXPECT_EQ(TerminalSafe("x\x9b[2Jy"), "x\xef\xbf\xbd[2Jy");
}

TEST(LogLineTextTest, TerminalSafeOnlyWhenAsked) {
  v1::LogLine line;
  line.set_rank(3);
  line.set_text(kHostile);
  EXPECT_EQ(LogLineText(line, /*with_rank=*/true, /*terminal_safe=*/true),
            "[rank 3] a?[2Jb?]52;c;cm0gLXJmIH4=?c?]0;pwned?\\d?e?f?31mg\n");
  EXPECT_EQ(LogLineText(line, /*with_rank=*/false, /*terminal_safe=*/false),
            std::string(kHostile) + "\n");
  line.set_text("done\n");
  EXPECT_EQ(LogLineText(line, /*with_rank=*/false, /*terminal_safe=*/true), "done\n");
  line.set_text("");
  EXPECT_EQ(LogLineText(line, /*with_rank=*/true, /*terminal_safe=*/true), "[rank 3] \n");
}

TEST(ForDisplayTest, CleansForATerminalAndKeepsBytesForAPipe) {
  int master = -1, terminal = -1;
  ASSERT_EQ(openpty(&master, &terminal, nullptr, nullptr, nullptr), 0);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  EXPECT_TRUE(IsTty(terminal));
  EXPECT_FALSE(IsTty(pipe_fds[1]));
  EXPECT_EQ(ForDisplay(kHostile, terminal), TerminalSafe(kHostile));
  EXPECT_EQ(ForDisplay(kHostile, pipe_fds[1]), kHostile);
  for (int fd : {master, terminal, pipe_fds[0], pipe_fds[1]}) close(fd);
}

// -o json and -o yaml keep the text, every control character escaped; C1 ones too (YAML must:
// they are not printable there).
TEST(StructuredOutputTest, EscapesControlCharactersC1Included) {
  const Value v = Value::Object().Set("text", Value::String("a\x1b[2J\xc2\x9b"
                                                            "b\xc3\xa9"));
  const std::string json = ToJson(v);
  EXPECT_EQ(json, "{\"text\":\"a\\u001b[2J\\u009bb\xc3\xa9\"}");
  const std::string yaml = ToYaml(v);
  EXPECT_EQ(yaml, "text: \"a\\x1b[2J\\x9bb\xc3\xa9\"\n");
  // A multi-line value with a C1 control is quoted, not a literal block.
  const std::string block = ToYaml(Value::Object().Set("text", Value::String("a\n\xc2\x9b\n")));
  EXPECT_THAT(block, HasSubstr("\\x9b"));
  EXPECT_THAT(block, Not(HasSubstr("\xc2\x9b")));
}

}  // namespace
}  // namespace dropless::cli
