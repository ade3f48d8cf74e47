#include "cli/output/terminal_text.h"

#include <unistd.h>

#include "common/utf8.h"

namespace dropless::cli {

std::string TerminalSafe(absl::string_view text) {
  const std::string utf8 = ToValidUtf8(text);
  // ReplaceControlCharacters replaces newlines and tabs too: the text between them goes through it,
  // and they are kept.
  std::string out;
  out.reserve(utf8.size());
  size_t start = 0;
  while (true) {
    const size_t end = utf8.find_first_of("\n\t", start);
    out += ReplaceControlCharacters(
        absl::string_view(utf8).substr(start, end == std::string::npos ? end : end - start));
    if (end == std::string::npos) return out;
    out.push_back(utf8[end]);
    start = end + 1;
  }
}

bool IsTty(int fd) { return isatty(fd) == 1; }

std::string ForDisplay(absl::string_view text, int fd) {
  return IsTty(fd) ? TerminalSafe(text) : std::string(text);
}

}  // namespace dropless::cli
