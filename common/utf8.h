// UTF-8 for text that crosses the API: proto3 `string` fields must hold valid UTF-8, and a
// message with a bad one is refused whole by the receiver's parser. Rank output is arbitrary
// bytes, and a cut at a byte limit can split a character, so both go through here first.
#ifndef DROPLESS_COMMON_UTF8_H_
#define DROPLESS_COMMON_UTF8_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace dropless {

// The longest prefix of `text` of at most `max_bytes` that does not end inside a multi-byte
// character (of valid UTF-8 `text`, a valid UTF-8 prefix): its length.
size_t Utf8PrefixLength(absl::string_view text, size_t max_bytes);

// `text` cut to at most max_bytes without splitting a character.
std::string TruncateUtf8(absl::string_view text, size_t max_bytes);

// `text` with every byte that is not part of a well-formed UTF-8 sequence (stray continuation
// bytes, overlong forms, surrogates, code points past U+10FFFF, cut sequences) replaced by
// U+FFFD. Valid text comes back unchanged.
std::string ToValidUtf8(absl::string_view text);

bool IsValidUtf8(absl::string_view text);

// Control characters of valid UTF-8 text: C0 (U+0000-U+001F: newline, tab, ESC), DEL (U+007F) and
// C1 (U+0080-U+009F, e.g. U+009B, a terminal's CSI). Text that a user reads back in a log, an
// event or a terminal must not hold them: a newline forges a line, an escape rewrites the screen.
bool HasControlCharacters(absl::string_view utf8);
// `utf8` with each control character replaced by '?'.
std::string ReplaceControlCharacters(absl::string_view utf8);

// Text from elsewhere (a worker's report) made fit for a log, an event or a terminal: valid UTF-8,
// at most max_bytes, control characters replaced.
std::string SanitizedText(absl::string_view text, size_t max_bytes);

}  // namespace dropless

#endif  // DROPLESS_COMMON_UTF8_H_
