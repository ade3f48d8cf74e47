#include "common/utf8.h"

#include <cstdint>

namespace dropless {
namespace {

constexpr absl::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed sequence at text[i] (Unicode table 3-7), 0 when there is none.
size_t SequenceLength(absl::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) return 1;
  size_t length;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  }
  return length;
}

}  // namespace

size_t Utf8PrefixLength(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text.size();
  size_t end = max_bytes;
  // Back off over continuation bytes (at most three) to the start of the character at the cut.
  for (int k = 0; k < 3 && end > 0 && (static_cast<uint8_t>(text[end]) & 0xC0) == 0x80; ++k) {
    --end;
  }
  if ((static_cast<uint8_t>(text[end]) & 0xC0) == 0x80) return max_bytes;  // not UTF-8 anyway
  return end;
}

std::string TruncateUtf8(absl::string_view text, size_t max_bytes) {
  return std::string(text.substr(0, Utf8PrefixLength(text, max_bytes)));
}

bool IsValidUtf8(absl::string_view text) {
  for (size_t i = 0; i < text.size();) {
    size_t n = SequenceLength(text, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string ToValidUtf8(absl::string_view text) {
  if (IsValidUtf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 16);
  for (size_t i = 0; i < text.size();) {
    size_t n = SequenceLength(text, i);
    if (n == 0) {
      out.append(kReplacement.data(), kReplacement.size());
      ++i;
    } else {
      out.append(text.data() + i, n);
      i += n;
    }
  }
  return out;
}

namespace {

// Bytes of the control character at the start of `text` (valid UTF-8), 0 if it does not start
// with one.
size_t ControlCharacterBytes(absl::string_view text) {
  const unsigned char c = static_cast<unsigned char>(text[0]);
  if (c < 0x20 || c == 0x7f) return 1;
  if (c == 0xc2 && text.size() > 1) {
    const unsigned char next = static_cast<unsigned char>(text[1]);
    if (next >= 0x80 && next <= 0x9f) return 2;  // U+0080-U+009F
  }
  return 0;
}

}  // namespace

bool HasControlCharacters(absl::string_view utf8) {
  for (size_t i = 0; i < utf8.size(); ++i) {
    if (ControlCharacterBytes(utf8.substr(i)) > 0) return true;
  }
  return false;
}

std::string ReplaceControlCharacters(absl::string_view utf8) {
  std::string out;
  out.reserve(utf8.size());
  for (size_t i = 0; i < utf8.size();) {
    const size_t n = ControlCharacterBytes(utf8.substr(i));
    if (n > 0) {
      out.push_back('?');
      i += n;
    } else {
      out.push_back(utf8[i++]);
    }
  }
  return out;
}

std::string SanitizedText(absl::string_view text, size_t max_bytes) {
  return ReplaceControlCharacters(TruncateUtf8(ToValidUtf8(text), max_bytes));
}

}  // namespace dropless
