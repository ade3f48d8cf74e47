// Terminal text: much of what the CLI prints was written by users or their programs: rank output
// (`logs`), job names, labels and messages, event text, node names, a coordinator's error messages.
// A control character in it, printed raw to a terminal, drives that terminal: ESC [2J clears the
// screen, OSC 52 writes the clipboard, CR overwrites a line. So the CLI's human output bound for a
// terminal goes through TerminalSafe. Output to a pipe or a file keeps its bytes (a script, grep,
// a saved log get what the job wrote), as does `logs --raw`; -o json|yaml escape control
// characters as those formats do.
#ifndef DROPLESS_CLI_OUTPUT_TERMINAL_TEXT_H_
#define DROPLESS_CLI_OUTPUT_TERMINAL_TEXT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace dropless::cli {

// `text` with every control character but newline and tab (C0, ESC included; DEL; the C1 controls,
// e.g. U+009B, a terminal's CSI) replaced by '?', and every byte that is not part of valid UTF-8
// by U+FFFD (a lone 0x9b is a CSI to a terminal that is not in UTF-8 mode).
std::string TerminalSafe(absl::string_view text);

// Whether file descriptor `fd` is a terminal.
bool IsTty(int fd);

// `text` as it may be written to `fd`: TerminalSafe when `fd` is a terminal, else unchanged.
std::string ForDisplay(absl::string_view text, int fd);

}  // namespace dropless::cli

#endif  // DROPLESS_CLI_OUTPUT_TERMINAL_TEXT_H_
