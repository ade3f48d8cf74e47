#include "worker/engine/checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_context.h"
#include "worker/engine/checkpoint/crc32c.h"
#include "worker/engine/checkpoint/json.h"

namespace dropless::engine {
namespace {

constexpr SafetensorsDtype kDtypes[] = {SafetensorsDtype::kBF16, SafetensorsDtype::kI32,
                                        SafetensorsDtype::kF32, SafetensorsDtype::kI64};
// The header nests three deep (header, tensor, shape); anything deeper is refused early.
constexpr int kMaxHeaderDepth = 4;

// product(shape) * element_bytes, or false on a negative dimension or overflow.
bool ByteCount(const std::vector<int64_t>& shape, int64_t element_bytes, uint64_t* bytes) {
  uint64_t n = static_cast<uint64_t>(element_bytes);
  for (const int64_t dim : shape) {
    if (dim < 0) return false;
    const uint64_t d = static_cast<uint64_t>(dim);
    if (d != 0 && n > UINT64_MAX / d) return false;
    n *= d;
  }
  *bytes = n;
  return true;
}

std::string LittleEndian64(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}

absl::Status HeaderError(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("safetensors header: ", what));
}

absl::StatusOr<SafetensorsTensorInfo> ParseTensor(const std::string& name,
                                                  const json::Value& entry) {
  const std::string where = absl::StrCat("tensor ", json::QuoteForMessage(name));
  if (!entry.is_object()) return HeaderError(absl::StrCat(where, " is not an object"));
  SafetensorsTensorInfo info;
  info.name = name;
  for (const std::string& key : entry.keys()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return HeaderError(absl::StrCat(where, " has an unknown field ", json::QuoteForMessage(key)));
    }
  }
  const json::Value* dtype = entry.Find("dtype");
  const json::Value* shape = entry.Find("shape");
  const json::Value* offsets = entry.Find("data_offsets");
  if (dtype == nullptr || shape == nullptr || offsets == nullptr) {
    return HeaderError(absl::StrCat(where, " needs dtype, shape and data_offsets"));
  }
  if (!dtype->is_string()) return HeaderError(absl::StrCat(where, ": dtype is not a string"));
  bool known = false;
  for (const SafetensorsDtype d : kDtypes) {
    if (dtype->text() == SafetensorsDtypeName(d)) {
      info.dtype = d;
      known = true;
    }
  }
  if (!known) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors header: ", where, " has dtype ", json::QuoteForMessage(dtype->text()),
        ", which dropless does not read (BF16, I32, F32, I64)"));
  }
  if (!shape->is_array()) return HeaderError(absl::StrCat(where, ": shape is not an array"));
  for (const json::Value& dim : shape->items()) {
    absl::StatusOr<int64_t> d = json::ToNonNegativeInt64(dim);
    if (!d.ok()) return HeaderError(absl::StrCat(where, ": shape: ", d.status().message()));
    info.shape.push_back(*d);
  }
  if (!offsets->is_array() || offsets->items().size() != 2) {
    return HeaderError(absl::StrCat(where, ": data_offsets is not an array of two integers"));
  }
  absl::StatusOr<uint64_t> begin = json::ToUint64(offsets->items()[0]);
  absl::StatusOr<uint64_t> end = json::ToUint64(offsets->items()[1]);
  if (!begin.ok() || !end.ok()) {
    return HeaderError(
        absl::StrCat(where, ": data_offsets: ", (begin.ok() ? end : begin).status().message()));
  }
  info.begin = *begin;
  info.end = *end;
  uint64_t bytes = 0;
  if (!ByteCount(info.shape, SafetensorsDtypeBytes(info.dtype), &bytes)) {
    return HeaderError(absl::StrCat(where, ": the shape's byte count overflows"));
  }
  if (info.end < info.begin || info.end - info.begin != bytes) {
    return HeaderError(absl::StrCat(where, ": data_offsets [", info.begin, ", ", info.end,
                                    "] do not hold the ", bytes, " bytes of its dtype and shape"));
  }
  return info;
}

}  // namespace

int64_t SafetensorsDtypeBytes(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kBF16:
      return 2;
    case SafetensorsDtype::kI32:
      return 4;
    case SafetensorsDtype::kF32:
      return 4;
    case SafetensorsDtype::kI64:
      return 8;
  }
  return 0;
}

const char* SafetensorsDtypeName(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kBF16:
      return "BF16";
    case SafetensorsDtype::kI32:
      return "I32";
    case SafetensorsDtype::kF32:
      return "F32";
    case SafetensorsDtype::kI64:
      return "I64";
  }
  return "?";
}

const SafetensorsTensorInfo* SafetensorsHeader::Find(absl::string_view name) const {
  for (const SafetensorsTensorInfo& info : tensors) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

absl::StatusOr<SafetensorsLayout> LayOutSafetensors(std::vector<SafetensorsTensorRef> tensors,
                                                    const SafetensorsMetadata& metadata) {
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    if (a.dtype != b.dtype) return a.dtype > b.dtype;
    return a.name < b.name;
  });
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      absl::StrAppend(&json, first ? "" : ",", json::Quote(key), ":", json::Quote(value));
      first = false;
    }
    json += "}";
  }
  uint64_t offset = 0;
  std::set<absl::string_view> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsTensorRef& t = tensors[i];
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: bad or duplicate tensor name ",
                                                     json::QuoteForMessage(t.name)));
    }
    uint64_t bytes = 0;
    if (!ByteCount(t.shape, SafetensorsDtypeBytes(t.dtype), &bytes) || offset + bytes < offset) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor ",
                                                     json::QuoteForMessage(t.name),
                                                     " has a negative or too large shape"));
    }
    if (bytes > 0 && t.data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor ", json::QuoteForMessage(t.name), " has no data"));
    }
    absl::StrAppend(&json, metadata.empty() && i == 0 ? "" : ",", json::Quote(t.name),
                    ":{\"dtype\":\"", SafetensorsDtypeName(t.dtype), "\",\"shape\":[",
                    absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", offset, ",",
                    offset + bytes, "]}");
    offset += bytes;
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');
  SafetensorsLayout layout;
  layout.header = LittleEndian64(json.size()) + json;
  layout.tensors = std::move(tensors);
  return layout;
}

absl::Status WriteSafetensors(std::vector<SafetensorsTensorRef> tensors,
                              const SafetensorsMetadata& metadata, AtomicFileWriter* writer) {
  absl::StatusOr<SafetensorsLayout> layout = LayOutSafetensors(std::move(tensors), metadata);
  if (!layout.ok()) return layout.status();
  if (absl::Status s = writer->Append(layout->header.data(), layout->header.size()); !s.ok()) {
    return s;
  }
  for (const SafetensorsTensorRef& t : layout->tensors) {
    uint64_t bytes = 0;
    ByteCount(t.shape, SafetensorsDtypeBytes(t.dtype), &bytes);  // checked by LayOutSafetensors
    if (absl::Status s = writer->Append(t.data, bytes); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json,
                                                         uint64_t buffer_bytes) {
  if (json.empty() || json[0] != '{') return HeaderError("does not start with '{'");
  absl::StatusOr<json::Value> root = json::Parse(json, kMaxHeaderDepth);
  if (!root.ok()) return HeaderError(root.status().message());
  if (!root->is_object()) return HeaderError("is not a JSON object");
  SafetensorsHeader header;
  header.buffer_bytes = buffer_bytes;
  for (size_t i = 0; i < root->keys().size(); ++i) {
    const std::string& key = root->keys()[i];
    const json::Value& entry = root->items()[i];
    if (key == "__metadata__") {
      if (!entry.is_object()) return HeaderError("__metadata__ is not an object");
      for (size_t j = 0; j < entry.keys().size(); ++j) {
        if (!entry.items()[j].is_string()) {
          return HeaderError(absl::StrCat("__metadata__ value of ",
                                          json::QuoteForMessage(entry.keys()[j]),
                                          " is not a string"));
        }
        header.metadata[entry.keys()[j]] = entry.items()[j].text();
      }
      continue;
    }
    absl::StatusOr<SafetensorsTensorInfo> info = ParseTensor(key, entry);
    if (!info.ok()) return info.status();
    header.tensors.push_back(*std::move(info));
  }
  std::sort(header.tensors.begin(), header.tensors.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.begin, a.end) < std::make_pair(b.begin, b.end);
  });
  uint64_t covered = 0;
  for (const SafetensorsTensorInfo& info : header.tensors) {
    if (info.begin != covered) {
      return HeaderError(absl::StrCat(
          "tensor ", json::QuoteForMessage(info.name), " data_offsets [", info.begin, ", ",
          info.end, "] ", info.begin < covered ? "overlap another tensor" : "leave a gap",
          " (expected to begin at ", covered, ")"));
    }
    covered = info.end;
  }
  if (covered != buffer_bytes) {
    return HeaderError(absl::StrCat("the tensors cover ", covered, " bytes but the file's data is ",
                                    buffer_bytes, " bytes"));
  }
  return header;
}

absl::StatusOr<SafetensorsReader> SafetensorsReader::Open(const std::string& path) {
  SafetensorsReader reader;
  absl::StatusOr<ReadOnlyFile> file = ReadOnlyFile::Open(path);
  if (!file.ok()) return file.status();
  reader.file_ = *std::move(file);
  const uint64_t size = reader.file_.size();
  if (size < 8) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", size, " bytes, too short for a safetensors file"));
  }
  unsigned char length[8];
  if (absl::Status s = reader.file_.ReadAt(0, length, sizeof(length)); !s.ok()) return s;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length[i];
  if (n > kMaxSafetensorsHeaderBytes) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", n, " exceeds the limit of ",
                                            kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (n > size - 8) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", n,
                                            " runs past the end of the ", size, "-byte file"));
  }
  reader.raw_header_.resize(8 + n);
  if (absl::Status s = reader.file_.ReadAt(0, reader.raw_header_.data(), 8 + n); !s.ok()) return s;
  absl::StatusOr<SafetensorsHeader> header =
      ParseSafetensorsHeader(absl::string_view(reader.raw_header_).substr(8), size - 8 - n);
  if (!header.ok()) {
    return WithContext(path, header.status());
  }
  reader.header_ = *std::move(header);
  reader.header_.buffer_offset = 8 + n;
  return reader;
}

absl::Status SafetensorsReader::Read(const SafetensorsTensorInfo& info,
                                     absl::Span<char> out) const {
  if (out.size() != info.bytes() || info.end > header_.buffer_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path(), ": tensor ", json::QuoteForMessage(info.name), " has ", info.bytes(),
                     " bytes in the file, the destination ", out.size()));
  }
  return file_.ReadAt(header_.buffer_offset + info.begin, out.data(), out.size());
}

absl::StatusOr<uint32_t> SafetensorsReader::ReadAll(Destination destination) const {
  uint32_t crc = Crc32c(raw_header_.data(), raw_header_.size());
  for (const SafetensorsTensorInfo& info : header_.tensors) {
    absl::StatusOr<void*> out = destination(info);
    if (!out.ok()) return out.status();
    if (info.bytes() == 0) continue;
    if (absl::Status s = Read(info, absl::MakeSpan(static_cast<char*>(*out), info.bytes()));
        !s.ok()) {
      return s;
    }
    crc = Crc32cExtend(crc, *out, info.bytes());
  }
  return crc;
}

}  // namespace dropless::engine
