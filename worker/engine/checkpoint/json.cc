#include "worker/engine/checkpoint/json.h"

#include <unordered_set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/utf8.h"

namespace dropless::engine::json {

const Value* Value::Find(absl::string_view key) const {
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i] == key) return &items_[i];
  }
  return nullptr;
}

const char* KindName(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::kNull:
      return "null";
    case Value::Kind::kBool:
      return "a boolean";
    case Value::Kind::kNumber:
      return "a number";
    case Value::Kind::kString:
      return "a string";
    case Value::Kind::kArray:
      return "an array";
    case Value::Kind::kObject:
      return "an object";
  }
  return "?";
}

class Parser {
 public:
  Parser(absl::string_view text, int max_depth, int64_t max_values)
      : text_(text), max_depth_(max_depth), values_left_(max_values) {}

  absl::StatusOr<Value> ParseDocument() {
    Value value;
    SkipWhitespace();
    if (absl::Status s = ParseValue(0, &value); !s.ok()) return s;
    SkipWhitespace();
    if (pos_ != text_.size()) return Error("unexpected text after the value");
    return value;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrFormat("JSON offset %d: %s", pos_, what));
  }
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return text_[pos_]; }

  void SkipWhitespace() {
    while (!AtEnd() && (Peek() == ' ' || Peek() == '\t' || Peek() == '\n' || Peek() == '\r'))
      ++pos_;
  }

  bool Consume(absl::string_view literal) {
    if (text_.substr(pos_, literal.size()) != literal) return false;
    pos_ += literal.size();
    return true;
  }

  absl::Status ParseValue(int depth, Value* out) {
    if (depth > max_depth_) return Error("nested too deeply");
    if (--values_left_ < 0) return Error("more values than the document may hold");
    if (AtEnd()) return Error("unexpected end of text");
    switch (Peek()) {
      case '{':
        return ParseObject(depth, out);
      case '[':
        return ParseArray(depth, out);
      case '"':
        out->kind_ = Value::Kind::kString;
        return ParseString(&out->text_);
      case 't':
      case 'f':
        out->kind_ = Value::Kind::kBool;
        out->boolean_ = Peek() == 't';
        return Consume(out->boolean_ ? "true" : "false") ? absl::OkStatus() : Error("bad literal");
      case 'n':
        out->kind_ = Value::Kind::kNull;
        return Consume("null") ? absl::OkStatus() : Error("bad literal");
      default:
        out->kind_ = Value::Kind::kNumber;
        return ParseNumber(&out->text_);
    }
  }

  absl::Status ParseObject(int depth, Value* out) {
    out->kind_ = Value::Kind::kObject;
    ++pos_;  // '{'
    SkipWhitespace();
    if (!AtEnd() && Peek() == '}') {
      ++pos_;
      return absl::OkStatus();
    }
    std::unordered_set<std::string> seen;  // a hash set: a huge object must not take n^2 time
    while (true) {
      SkipWhitespace();
      if (AtEnd() || Peek() != '"') return Error("expected a string key");
      std::string key;
      if (absl::Status s = ParseString(&key); !s.ok()) return s;
      if (!seen.insert(key).second) {
        return Error(absl::StrCat("duplicate key ", QuoteForMessage(key)));
      }
      SkipWhitespace();
      if (AtEnd() || Peek() != ':') return Error("expected ':'");
      ++pos_;
      SkipWhitespace();
      out->keys_.push_back(std::move(key));
      out->items_.emplace_back();
      if (absl::Status s = ParseValue(depth + 1, &out->items_.back()); !s.ok()) return s;
      SkipWhitespace();
      if (AtEnd()) return Error("unterminated object");
      if (Peek() == '}') {
        ++pos_;
        return absl::OkStatus();
      }
      if (Peek() != ',') return Error("expected ',' or '}'");
      ++pos_;
    }
  }

  absl::Status ParseArray(int depth, Value* out) {
    out->kind_ = Value::Kind::kArray;
    ++pos_;  // '['
    SkipWhitespace();
    if (!AtEnd() && Peek() == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      SkipWhitespace();
      out->items_.emplace_back();
      if (absl::Status s = ParseValue(depth + 1, &out->items_.back()); !s.ok()) return s;
      SkipWhitespace();
      if (AtEnd()) return Error("unterminated array");
      if (Peek() == ']') {
        ++pos_;
        return absl::OkStatus();
      }
      if (Peek() != ',') return Error("expected ',' or ']'");
      ++pos_;
    }
  }

  size_t Digits() {
    const size_t start = pos_;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') ++pos_;
    return pos_ - start;
  }

  absl::Status ParseNumber(std::string* out) {
    const size_t start = pos_;
    if (!AtEnd() && Peek() == '-') ++pos_;
    if (AtEnd() || Peek() < '0' || Peek() > '9') return Error("expected a value");
    if (Peek() == '0') {
      ++pos_;
    } else {
      Digits();
    }
    if (!AtEnd() && Peek() == '.') {
      ++pos_;
      if (Digits() == 0) return Error("expected a digit after '.'");
    }
    if (!AtEnd() && (Peek() == 'e' || Peek() == 'E')) {
      ++pos_;
      if (!AtEnd() && (Peek() == '+' || Peek() == '-')) ++pos_;
      if (Digits() == 0) return Error("expected a digit in the exponent");
    }
    out->assign(text_.data() + start, pos_ - start);
    return absl::OkStatus();
  }

  absl::StatusOr<uint32_t> Hex4() {
    if (text_.size() - pos_ < 4) return Error("truncated \\u escape");
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      value <<= 4;
      if (c >= '0' && c <= '9') {
        value |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        value |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        value |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return Error("bad hex digit in \\u escape");
      }
    }
    return value;
  }

  static void AppendUtf8(uint32_t code, std::string* out) {
    if (code < 0x80) {
      out->push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out->push_back(static_cast<char>(0xc0 | (code >> 6)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3f)));
    } else if (code < 0x10000) {
      out->push_back(static_cast<char>(0xe0 | (code >> 12)));
      out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3f)));
    } else {
      out->push_back(static_cast<char>(0xf0 | (code >> 18)));
      out->push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3f)));
    }
  }

  absl::Status ParseEscape(std::string* out) {
    if (AtEnd()) return Error("unterminated string");
    const char c = text_[pos_++];
    switch (c) {
      case '"':
        out->push_back('"');
        return absl::OkStatus();
      case '\\':
        out->push_back('\\');
        return absl::OkStatus();
      case '/':
        out->push_back('/');
        return absl::OkStatus();
      case 'b':
        out->push_back('\b');
        return absl::OkStatus();
      case 'f':
        out->push_back('\f');
        return absl::OkStatus();
      case 'n':
        out->push_back('\n');
        return absl::OkStatus();
      case 'r':
        out->push_back('\r');
        return absl::OkStatus();
      case 't':
        out->push_back('\t');
        return absl::OkStatus();
      case 'u':
        break;
      default:
        return Error("bad escape in string");
    }
    absl::StatusOr<uint32_t> code = Hex4();
    if (!code.ok()) return code.status();
    if (*code >= 0xdc00 && *code <= 0xdfff) return Error("lone trailing surrogate in \\u escape");
    if (*code >= 0xd800 && *code <= 0xdbff) {
      if (!Consume("\\u")) return Error("lone leading surrogate in \\u escape");
      absl::StatusOr<uint32_t> low = Hex4();
      if (!low.ok()) return low.status();
      if (*low < 0xdc00 || *low > 0xdfff) return Error("bad trailing surrogate in \\u escape");
      *code = 0x10000 + ((*code - 0xd800) << 10) + (*low - 0xdc00);
    }
    AppendUtf8(*code, out);
    return absl::OkStatus();
  }

  // Copies one UTF-8 encoded character of 2 to 4 bytes starting at pos_, validating it.
  absl::Status CopyUtf8(std::string* out) {
    const auto byte = [&](size_t i) { return static_cast<unsigned char>(text_[pos_ + i]); };
    const unsigned char lead = byte(0);
    size_t length = 0;
    unsigned char low = 0x80, high = 0xbf;  // bounds of the second byte
    if (lead >= 0xc2 && lead <= 0xdf) {
      length = 2;
    } else if (lead >= 0xe0 && lead <= 0xef) {
      length = 3;
      if (lead == 0xe0) low = 0xa0;
      if (lead == 0xed) high = 0x9f;  // no surrogates
    } else if (lead >= 0xf0 && lead <= 0xf4) {
      length = 4;
      if (lead == 0xf0) low = 0x90;
      if (lead == 0xf4) high = 0x8f;
    } else {
      return Error("invalid UTF-8 in string");
    }
    if (text_.size() - pos_ < length) return Error("invalid UTF-8 in string");
    for (size_t i = 1; i < length; ++i) {
      const unsigned char lo = i == 1 ? low : 0x80, hi = i == 1 ? high : 0xbf;
      if (byte(i) < lo || byte(i) > hi) return Error("invalid UTF-8 in string");
    }
    out->append(text_.data() + pos_, length);
    pos_ += length;
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string* out) {
    ++pos_;  // '"'
    while (true) {
      if (AtEnd()) return Error("unterminated string");
      const unsigned char c = static_cast<unsigned char>(Peek());
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (c < 0x20) return Error("control character in string");
      if (c == '\\') {
        ++pos_;
        if (absl::Status s = ParseEscape(out); !s.ok()) return s;
      } else if (c >= 0x80) {
        if (absl::Status s = CopyUtf8(out); !s.ok()) return s;
      } else {
        out->push_back(static_cast<char>(c));
        ++pos_;
      }
    }
  }

  absl::string_view text_;
  int max_depth_;
  int64_t values_left_;
  size_t pos_ = 0;
};

absl::StatusOr<Value> Parse(absl::string_view text, int max_depth, int64_t max_values) {
  return Parser(text, max_depth, max_values).ParseDocument();
}

absl::StatusOr<uint64_t> ToUint64(const Value& value) {
  uint64_t result = 0;
  const std::string& t = value.text();
  const bool plain =
      value.is_number() && !t.empty() && t.find_first_not_of("0123456789") == std::string::npos;
  if (!plain || !absl::SimpleAtoi(t, &result)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected a non-negative integer below 2^64, got ",
        value.is_number() || value.is_string() ? QuoteForMessage(t) : KindName(value.kind())));
  }
  return result;
}

absl::StatusOr<int64_t> ToNonNegativeInt64(const Value& value) {
  absl::StatusOr<uint64_t> result = ToUint64(value);
  if (!result.ok()) return result.status();
  if (*result > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected an integer below 2^63, got ", value.text()));
  }
  return static_cast<int64_t>(*result);
}

absl::StatusOr<int64_t> IntegerMember(const Value& object, absl::string_view key) {
  const Value* value = object.Find(key);
  const std::string field = absl::StrCat("field ", QuoteForMessage(key));
  if (value == nullptr) return absl::InvalidArgumentError(absl::StrCat(field, " is missing"));
  int64_t result = 0;
  const std::string& t = value->text();
  // The parser keeps only valid JSON numbers, so no fraction or exponent means an integer.
  if (value->is_number() && t.find_first_of(".eE") == std::string::npos &&
      absl::SimpleAtoi(t, &result)) {
    return result;
  }
  std::string what;
  if (value->is_string()) {
    what = absl::StrCat("the string ", QuoteForMessage(t));
  } else if (value->is_number()) {
    what = t;  // the parser's: digits, sign, point, exponent
  } else {
    what = KindName(value->kind());
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is ", what, ", expected a JSON integer (within 64 bits)"));
}

std::string Quote(absl::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size() + 2);
  out.push_back('"');
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out.push_back(kHex[c >> 4]);
          out.push_back(kHex[c & 0xf]);
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
  return out;
}

std::string QuoteForMessage(absl::string_view text) {
  return ReplaceControlCharacters(Quote(ToValidUtf8(text)));
}

}  // namespace dropless::engine::json
