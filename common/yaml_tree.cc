#include "common/yaml_tree.h"

#include <algorithm>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/exceptions.h"
#include "yaml-cpp/mark.h"
#include "yaml-cpp/parser.h"

namespace dropless::yaml {
namespace {

// Deeper than any job spec needs; keeps the tree (and its recursive destructor) shallow.
constexpr int kMaxDepth = 32;

bool IsNullText(const std::string& s) {
  return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL";
}

// "x" of "x[0][0][0]...": where list indices say little (deep nesting, syntax errors).
std::string FieldPart(const std::string& path) {
  const std::string field = path.substr(0, path.find('['));
  return field.empty() ? std::string(kRootPath) : field;
}

// yaml-cpp marks untagged plain scalars "?" and untagged quoted/block scalars "!"; collections
// without a tag carry "" or "?". Anything else was written by the user (!!str, !foo, ...).
bool IsExplicitTag(const std::string& tag) { return !(tag.empty() || tag == "?" || tag == "!"); }

// Of the keys of `map` that repeat an earlier one, the first: its index and that of the key's
// first occurrence. Sorted, not compared pairwise: a spec of thousands of short keys must not cost
// the square of that on every submission; a sort, unlike a hash set, has no input that is slow.
std::optional<std::pair<size_t, size_t>> FirstDuplicateKey(const Node& map) {
  std::vector<size_t> order(map.map_size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&map](size_t a, size_t b) {
    const int c = map.key(a).scalar.compare(map.key(b).scalar);
    return c != 0 ? c < 0 : a < b;
  });
  std::optional<std::pair<size_t, size_t>> found;
  // In a run of equal keys, the first is the original and the second the first repeat.
  for (size_t k = 1; k < order.size(); ++k) {
    const size_t first = order[k - 1];
    const size_t repeat = order[k];
    if (map.key(first).scalar != map.key(repeat).scalar) continue;
    if (k >= 2 && map.key(order[k - 2]).scalar == map.key(first).scalar) continue;
    if (!found.has_value() || repeat < found->first) found = std::make_pair(repeat, first);
  }
  return found;
}

// Builds the tree from parser events. Records the first error and ignores everything after it.
class TreeBuilder : public YAML::EventHandler {
 public:
  const absl::Status& status() const { return status_; }
  Node TakeRoot() { return std::move(root_); }
  bool has_root() const { return has_root_; }

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}

  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    Node n;
    n.kind = Node::Kind::kNull;
    Add(std::move(n), mark, anchor, "", /*opens=*/false);
  }

  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override {
    Fail(mark, "YAML aliases (*name) are not allowed in a job spec");
  }

  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    Node n;
    n.quoted = (tag == "!");
    n.kind = (!n.quoted && IsNullText(value)) ? Node::Kind::kNull : Node::Kind::kScalar;
    n.scalar = value;
    Add(std::move(n), mark, anchor, tag, /*opens=*/false);
  }

  void OnSequenceStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    Node n;
    n.kind = Node::Kind::kSequence;
    Add(std::move(n), mark, anchor, tag, /*opens=*/true);
  }
  void OnSequenceEnd() override { Close(); }

  void OnMapStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    Node n;
    n.kind = Node::Kind::kMap;
    Add(std::move(n), mark, anchor, tag, /*opens=*/true);
  }
  void OnMapEnd() override { Close(); }

  void OnAnchor(const YAML::Mark& mark, const std::string& name) override {
    Fail(mark, absl::StrCat("YAML anchors (&", name, ") are not allowed in a job spec"));
  }

 private:
  // Path of a node under the open containers, e.g. "optimizer.betas[1]": of the node about to be
  // added, or (last_placed) of the innermost container's last child.
  std::string PathOf(bool last_placed) const {
    std::string path;
    for (size_t i = 0; i < open_.size(); ++i) {
      const Node* c = open_[i];
      const bool child_placed = last_placed || i + 1 < open_.size();
      const size_t n = c->items.size();
      if (c->kind == Node::Kind::kSequence) {
        absl::StrAppend(&path, "[", child_placed ? n - 1 : n, "]");
        continue;
      }
      const Node* key = nullptr;
      if (child_placed && n >= 2) key = &c->items[n - 2];
      if (!child_placed && n % 2 == 1) key = &c->items.back();
      if (key == nullptr) continue;  // a key of this map: the map's own path names it best
      absl::StrAppend(&path, path.empty() ? "" : ".",
                      key->kind == Node::Kind::kScalar ? key->scalar : "?");
    }
    return path.empty() ? std::string(kRootPath) : path;
  }

 public:
  std::string PathOfNext() const { return PathOf(false); }

 private:
  void Fail(const YAML::Mark& mark, const std::string& what, bool field_only = false) {
    if (!status_.ok()) return;
    const std::string path = field_only ? FieldPart(PathOfNext()) : PathOfNext();
    status_ = absl::InvalidArgumentError(absl::StrFormat(
        "%s: %s (line %d, column %d)", path, what, mark.line + 1, mark.column + 1));
  }

  void Add(Node n, const YAML::Mark& mark, YAML::anchor_t anchor, const std::string& tag,
           bool opens) {
    if (!status_.ok()) return;
    if (anchor != YAML::NullAnchor) {
      return Fail(mark, "YAML anchors (&name) are not allowed in a job spec");
    }
    if (IsExplicitTag(tag)) {
      return Fail(mark, absl::StrCat("explicit YAML tags (", tag, ") are not allowed"));
    }
    if (opens && static_cast<int>(open_.size()) >= kMaxDepth) {
      return Fail(mark, absl::StrCat("nested deeper than ", kMaxDepth, " levels"),
                  /*field_only=*/true);
    }
    n.line = mark.line + 1;
    n.column = mark.column + 1;
    Node* placed = nullptr;
    if (open_.empty()) {
      if (has_root_) return Fail(mark, "more than one root node");
      root_ = std::move(n);
      has_root_ = true;
      placed = &root_;
    } else {
      Node* parent = open_.back();
      if (parent->kind == Node::Kind::kMap && parent->items.size() % 2 == 0 &&
          n.kind != Node::Kind::kScalar) {
        return Fail(mark, absl::StrCat("map keys must be plain names, got a ", KindName(n)));
      }
      // Pointers in open_ stay valid: only the innermost open container ever grows.
      parent->items.push_back(std::move(n));
      placed = &parent->items.back();
    }
    if (opens) open_.push_back(placed);
  }

  void Close() {
    if (!status_.ok() || open_.empty()) return;
    Node* closing = open_.back();
    open_.pop_back();
    if (closing->kind != Node::Kind::kMap) return;
    // Duplicate keys: YAML says they are an error; yaml-cpp keeps both and reads the first.
    const std::optional<std::pair<size_t, size_t>> duplicate = FirstDuplicateKey(*closing);
    if (!duplicate.has_value()) return;
    const auto [i, first] = *duplicate;
    std::string path = open_.empty() ? "" : PathOf(true);
    if (path == kRootPath) path.clear();
    status_ = absl::InvalidArgumentError(absl::StrFormat(
        "%s%s%s: duplicate key (line %d, first at line %d)", path, path.empty() ? "" : ".",
        closing->key(i).scalar, closing->key(i).line, closing->key(first).line));
  }

  absl::Status status_;
  Node root_;
  bool has_root_ = false;
  std::vector<Node*> open_;
};

// Swallows the events of a second document: only whether one exists matters.
class NullHandler : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// `path`: where the parser had got to, the best hint yaml-cpp's exception allows.
absl::Status SyntaxError(const YAML::Exception& e, const std::string& path) {
  // An alias to an undefined anchor fails inside yaml-cpp before our handler sees it; either way
  // the rule the user needs to know is that aliases are not allowed.
  const std::string what = e.msg == YAML::ErrorMsg::UNKNOWN_ANCHOR
                               ? "YAML aliases (*name) are not allowed in a job spec"
                               : absl::StrCat("invalid YAML: ", e.msg);
  if (e.mark.is_null()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: %s (line %d, column %d)", path, what, e.mark.line + 1, e.mark.column + 1));
}

}  // namespace

const char* KindName(const Node& node) {
  switch (node.kind) {
    case Node::Kind::kNull: return "null";
    case Node::Kind::kScalar: return node.quoted ? "quoted string" : "scalar";
    case Node::Kind::kSequence: return "list";
    case Node::Kind::kMap: return "map";
  }
  return "?";
}

absl::StatusOr<Node> LoadSingleDocument(std::string_view text, size_t max_bytes) {
  if (text.size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: document is %d bytes, over the limit of %d bytes", kRootPath, text.size(), max_bytes));
  }
  if (text.find('\0') != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(kRootPath, ": document contains a NUL byte"));
  }
  std::istringstream in{std::string(text)};
  TreeBuilder builder;
  try {
    YAML::Parser parser(in);
    if (!parser.HandleNextDocument(builder) || (builder.status().ok() && !builder.has_root())) {
      return absl::InvalidArgumentError(absl::StrCat(kRootPath, ": empty document"));
    }
    if (!builder.status().ok()) return builder.status();
    NullHandler rest;
    if (parser.HandleNextDocument(rest)) {
      return absl::InvalidArgumentError(absl::StrCat(
          kRootPath, ": more than one YAML document ('---'); a job spec is one document"));
    }
  } catch (const YAML::Exception& e) {
    if (!builder.status().ok()) return builder.status();
    return SyntaxError(e, FieldPart(builder.PathOfNext()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(kRootPath, ": invalid YAML: ", e.what()));
  }
  return builder.TakeRoot();
}

}  // namespace dropless::yaml
