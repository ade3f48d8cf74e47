// ToJson and ToYaml: small emitters for Value, written here so that the output schema is exactly
// the documented one (no proto field names or enum prefixes leak through).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/output/value.h"

namespace dropless::cli {
namespace {

// Shortest decimal text that reads back as the same double.
std::string Number(double d) {
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  return buf;
}

// The C1 control character (U+0080-U+009F: UTF-8 0xc2 0x80-0x9f) at s[i], or -1. U+009B is a
// terminal's CSI: both formats write C1 escaped, so that output read on a terminal cannot drive it
// (YAML must escape it anyway: C1 is not printable in YAML).
int C1ControlAt(const std::string& s, size_t i) {
  if (static_cast<unsigned char>(s[i]) != 0xc2 || i + 1 >= s.size()) return -1;
  const unsigned char next = static_cast<unsigned char>(s[i + 1]);
  return next >= 0x80 && next <= 0x9f ? next : -1;
}

void AppendJsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (const int c1 = C1ControlAt(s, i); c1 >= 0) {
      absl::StrAppendFormat(out, "\\u%04x", c1);
      ++i;
      continue;
    }
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          absl::StrAppendFormat(out, "\\u%04x", c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void AppendJson(const Value& v, std::string* out) {
  switch (v.kind()) {
    case Value::Kind::kNull: *out += "null"; return;
    case Value::Kind::kBool: *out += v.bool_value() ? "true" : "false"; return;
    case Value::Kind::kInt: absl::StrAppend(out, v.int_value()); return;
    case Value::Kind::kDouble:
      *out += std::isfinite(v.double_value()) ? Number(v.double_value()) : "null";
      return;
    case Value::Kind::kString: AppendJsonString(v.string_value(), out); return;
    case Value::Kind::kArray: {
      out->push_back('[');
      for (size_t i = 0; i < v.elements().size(); ++i) {
        if (i > 0) out->push_back(',');
        AppendJson(v.elements()[i], out);
      }
      out->push_back(']');
      return;
    }
    case Value::Kind::kObject: {
      out->push_back('{');
      for (size_t i = 0; i < v.fields().size(); ++i) {
        if (i > 0) out->push_back(',');
        AppendJsonString(v.fields()[i].first, out);
        out->push_back(':');
        AppendJson(v.fields()[i].second, out);
      }
      out->push_back('}');
      return;
    }
  }
}

// A plain YAML scalar that no reader could take for a number, boolean or null.
bool IsSafePlain(const std::string& s) {
  if (s.empty() || !absl::ascii_isalpha(static_cast<unsigned char>(s[0]))) return false;
  for (unsigned char c : s) {
    if (!(absl::ascii_isalnum(c) || c == '_' || c == '-' || c == '.' || c == '/')) return false;
  }
  static const char* const kSpecial[] = {"true", "false", "yes", "no", "on", "off",
                                          "y",    "n",     "null", "nan", "inf"};
  const std::string lower = absl::AsciiStrToLower(s);
  for (const char* w : kSpecial) {
    if (lower == w) return false;
  }
  return true;
}

std::string YamlQuoted(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (const int c1 = C1ControlAt(s, i); c1 >= 0) {
      absl::StrAppendFormat(&out, "\\x%02x", c1);
      ++i;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          absl::StrAppendFormat(&out, "\\x%02x", c);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  return out + "\"";
}

// Multi-line text that a literal block (|) carries verbatim.
bool FitsLiteralBlock(const std::string& s) {
  if (s.find('\n') == std::string::npos || s[0] == ' ' || s[0] == '\n' || s[0] == '\t') {
    return false;
  }
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if ((c < 0x20 && c != '\n') || c == 0x7f || C1ControlAt(s, i) >= 0) return false;
  }
  return true;
}

std::string LiteralBlock(const std::string& s, int indent) {
  size_t trailing = 0;
  while (trailing < s.size() && s[s.size() - 1 - trailing] == '\n') ++trailing;
  std::string out = trailing == 0 ? "|-\n" : trailing == 1 ? "|\n" : "|+\n";
  const std::string pad(indent, ' ');
  size_t start = 0;
  const std::string body = s.substr(0, s.size() - trailing);
  while (start <= body.size()) {
    size_t end = body.find('\n', start);
    if (end == std::string::npos) end = body.size();
    const std::string line = body.substr(start, end - start);
    out += line.empty() ? "\n" : pad + line + "\n";
    start = end + 1;
  }
  for (size_t i = 1; i < trailing; ++i) out += "\n";
  return out;
}

bool IsBlock(const Value& v) {
  return (v.kind() == Value::Kind::kObject && !v.fields().empty()) ||
         (v.kind() == Value::Kind::kArray && !v.elements().empty());
}

// The text after "key: " or "- " for a non-block value, ending with a newline.
std::string YamlInline(const Value& v, int indent) {
  switch (v.kind()) {
    case Value::Kind::kNull: return "null\n";
    case Value::Kind::kBool: return v.bool_value() ? "true\n" : "false\n";
    case Value::Kind::kInt: return absl::StrCat(v.int_value(), "\n");
    case Value::Kind::kDouble: {
      const double d = v.double_value();
      return std::isfinite(d) ? Number(d) + "\n" : std::string("null\n");
    }
    case Value::Kind::kString: {
      const std::string& s = v.string_value();
      if (IsSafePlain(s)) return s + "\n";
      if (FitsLiteralBlock(s)) return LiteralBlock(s, indent);
      return YamlQuoted(s) + "\n";
    }
    case Value::Kind::kArray: return "[]\n";
    case Value::Kind::kObject: return "{}\n";
  }
  return "null\n";
}

void AppendYamlBlock(const Value& v, int indent, std::string* out) {
  const std::string pad(indent, ' ');
  if (v.kind() == Value::Kind::kObject) {
    for (const auto& [key, child] : v.fields()) {
      *out += pad + (IsSafePlain(key) ? key : YamlQuoted(key)) + ":";
      if (IsBlock(child)) {
        *out += "\n";
        AppendYamlBlock(child, indent + 2, out);
      } else {
        *out += " " + YamlInline(child, indent + 2);
      }
    }
    return;
  }
  for (const Value& element : v.elements()) {
    if (IsBlock(element)) {
      // The element's block, with the first line's indentation turned into "- ".
      std::string block;
      AppendYamlBlock(element, indent + 2, &block);
      *out += pad + "- " + block.substr(indent + 2);
    } else {
      *out += pad + "- " + YamlInline(element, indent + 2);
    }
  }
}

}  // namespace

std::string ToJson(const Value& v) {
  std::string out;
  AppendJson(v, &out);
  return out;
}

std::string ToYaml(const Value& v) {
  if (!IsBlock(v)) return YamlInline(v, 2);
  std::string out;
  AppendYamlBlock(v, 0, &out);
  return out;
}

}  // namespace dropless::cli
