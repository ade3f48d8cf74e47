// YamlTree: loads one small YAML document from an untrusted source into a plain tree.
//
// Why not YAML::Load: it resolves aliases, so a "billion laughs" document expands when walked, it
// keeps duplicate keys silently, and it forgets whether a scalar was quoted ("64" vs 64). This loader
// drives yaml-cpp's event parser and builds its own tree, rejecting aliases and anchors outright,
// explicit tags, duplicate keys, non-scalar keys and second documents. Errors are InvalidArgument
// with the path of the offending node first ("model.hidden: ...", "spec: ..." for the whole document).
#ifndef DROPLESS_COMMON_YAML_TREE_H_
#define DROPLESS_COMMON_YAML_TREE_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace dropless::yaml {

struct Node {
  enum class Kind { kNull, kScalar, kSequence, kMap };

  Kind kind = Kind::kNull;
  std::string scalar;       // kScalar: the text, unquoted
  bool quoted = false;      // kScalar: written quoted or as a block scalar, so always a string
  int line = 0;             // 1-based position in the document, for messages
  int column = 0;
  std::vector<Node> items;  // kSequence: the elements; kMap: key, value, key, value, ...

  size_t map_size() const { return items.size() / 2; }
  const Node& key(size_t i) const { return items[2 * i]; }
  const Node& value(size_t i) const { return items[2 * i + 1]; }
};

// Name used in messages for the whole document.
inline constexpr char kRootPath[] = "spec";

// "map", "sequence", "string", "null": for "got ..." in messages.
const char* KindName(const Node& node);

// Parses `text` as exactly one YAML document of at most `max_bytes` bytes.
absl::StatusOr<Node> LoadSingleDocument(std::string_view text, size_t max_bytes);

}  // namespace dropless::yaml

#endif  // DROPLESS_COMMON_YAML_TREE_H_
