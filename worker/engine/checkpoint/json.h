// The small JSON subset the checkpoint files need, strictly (RFC 8259): a parser into a value tree
// that keeps numbers as their text (so 64-bit integers stay exact) and refuses duplicate object
// keys, invalid UTF-8 and nesting deeper than a limit; and string quoting for writers. It never
// crashes on any input: every defect is an InvalidArgument naming the byte offset.
#ifndef DROPLESS_WORKER_ENGINE_CHECKPOINT_JSON_H_
#define DROPLESS_WORKER_ENGINE_CHECKPOINT_JSON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dropless::engine::json {

class Value {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  Kind kind() const { return kind_; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kNumber; }

  bool boolean() const { return boolean_; }
  // A string's decoded text, or a number's text as written.
  const std::string& text() const { return text_; }
  // An array's elements, or an object's values in the order written.
  const std::vector<Value>& items() const { return items_; }
  // An object's keys, parallel to items().
  const std::vector<std::string>& keys() const { return keys_; }
  // An object's member named `key`, or null.
  const Value* Find(absl::string_view key) const;

 private:
  friend class Parser;
  Kind kind_ = Kind::kNull;
  bool boolean_ = false;
  std::string text_;
  std::vector<Value> items_;
  std::vector<std::string> keys_;
};

inline constexpr int kDefaultMaxDepth = 64;
// Values (of any kind, containers included) a document may hold: a tree of ~100 bytes a value,
// so a crafted text of small values ("[0,0,...]") costs at most ~100 MiB, not 50x its size.
inline constexpr int64_t kDefaultMaxValues = int64_t{1} << 20;

// Parses `text`: one value, with only JSON whitespace around it.
absl::StatusOr<Value> Parse(absl::string_view text, int max_depth = kDefaultMaxDepth,
                            int64_t max_values = kDefaultMaxValues);

// A number that is a plain non-negative integer (no sign, fraction or exponent) within range.
absl::StatusOr<uint64_t> ToUint64(const Value& value);
absl::StatusOr<int64_t> ToNonNegativeInt64(const Value& value);

// The member `key` of `object` as a JSON integer: a number with no fraction or exponent, within
// int64. InvalidArgument otherwise, naming the field and what it is instead (missing, the string
// "1", 1.0, a boolean): for a field whose type is part of the format, such as a format version.
absl::StatusOr<int64_t> IntegerMember(const Value& object, absl::string_view key);

// A JSON string literal for `text` (UTF-8), escaped as serde_json does: \" \\ \b \f \n \r \t, other
// control characters as \u00xx, everything else as is.
std::string Quote(absl::string_view text);

// Quote for an error message, for text that came from a file: such messages reach logs that
// another user may print to a terminal. Bytes that are not UTF-8 become U+FFFD and the control
// characters that JSON leaves as they are (DEL, C1 such as U+009B, a terminal's CSI) '?'
// (common/utf8.h); C0 ones (ESC, BEL, newline) are escaped as Quote escapes them.
std::string QuoteForMessage(absl::string_view text);

// A human-readable name of the kind ("an object", "a string", ...), for error messages.
const char* KindName(Value::Kind kind);

}  // namespace dropless::engine::json

#endif  // DROPLESS_WORKER_ENGINE_CHECKPOINT_JSON_H_
