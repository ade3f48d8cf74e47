// Value: the tree that `-o json` and `-o yaml` print. Commands build one Value per object from the
// API messages (views.h) and hand it to an emitter, so both formats always carry the same fields.
#ifndef DROPLESS_CLI_OUTPUT_VALUE_H_
#define DROPLESS_CLI_OUTPUT_VALUE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dropless::cli {

class Value {
 public:
  enum class Kind { kNull, kBool, kInt, kDouble, kString, kArray, kObject };

  Value() = default;  // null
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Double(double d);  // NaN and infinities print as null
  static Value String(std::string s);
  static Value Array();
  static Value Object();

  // Object: appends a field (keys keep insertion order; callers do not repeat a key).
  Value& Set(std::string key, Value v);
  // Array: appends an element.
  Value& Push(Value v);

  Kind kind() const { return kind_; }
  bool bool_value() const { return bool_; }
  int64_t int_value() const { return int_; }
  double double_value() const { return double_; }
  const std::string& string_value() const { return string_; }
  const std::vector<Value>& elements() const { return elements_; }
  const std::vector<std::pair<std::string, Value>>& fields() const { return fields_; }
  // Object field by key, or nullptr.
  const Value* Find(const std::string& key) const;

 private:
  Kind kind_ = Kind::kNull;
  bool bool_ = false;
  int64_t int_ = 0;
  double double_ = 0;
  std::string string_;
  std::vector<Value> elements_;
  std::vector<std::pair<std::string, Value>> fields_;
};

// One line of compact JSON (no trailing newline).
std::string ToJson(const Value& v);
// A block-style YAML document (ends with a newline).
std::string ToYaml(const Value& v);

}  // namespace dropless::cli

#endif  // DROPLESS_CLI_OUTPUT_VALUE_H_
