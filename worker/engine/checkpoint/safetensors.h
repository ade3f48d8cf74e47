// safetensors files (https://github.com/huggingface/safetensors): u64 little-endian N, N bytes of
// JSON header {"__metadata__": {string: string}, "<name>": {"dtype": "F32", "shape": [...],
// "data_offsets": [begin, end]}, ...} padded with spaces to a multiple of 8, then the byte buffer
// (little-endian, row-major), every byte of it owned by exactly one tensor.
//
// The writer lays tensors out as the reference implementation does (by descending dtype, in its
// order BF16 < I32 < F32 < I64, then by name; "__metadata__" first, its keys sorted, compact JSON),
// so the same tensors and metadata give the same bytes. The reader validates strictly and refuses
// any damaged header with DataLoss (InvalidArgument for a valid file it cannot represent, e.g. an
// unsupported dtype), never crashing and never reading past the file.
#ifndef DROPLESS_WORKER_ENGINE_CHECKPOINT_SAFETENSORS_H_
#define DROPLESS_WORKER_ENGINE_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "worker/engine/checkpoint/file_io.h"

namespace dropless::engine {

// In the reference implementation's order (the writer sorts by it, descending).
enum class SafetensorsDtype { kBF16, kI32, kF32, kI64 };

int64_t SafetensorsDtypeBytes(SafetensorsDtype dtype);
const char* SafetensorsDtypeName(SafetensorsDtype dtype);

using SafetensorsMetadata = std::map<std::string, std::string>;

// The reference implementation refuses larger headers.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// A tensor to write: `data` holds product(shape) elements of `dtype`, little-endian, row-major.
struct SafetensorsTensorRef {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// A tensor of a parsed header; begin/end are offsets in the byte buffer.
struct SafetensorsTensorInfo {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;

  uint64_t bytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<SafetensorsTensorInfo> tensors;  // in buffer order
  SafetensorsMetadata metadata;
  uint64_t buffer_offset = 0;  // where the byte buffer starts in the file: 8 + N
  uint64_t buffer_bytes = 0;

  const SafetensorsTensorInfo* Find(absl::string_view name) const;
};

// The first 8 + N bytes of the file holding `tensors` and `metadata`, and the tensors in the order
// their data follows. InvalidArgument for an empty or duplicate name, a negative dimension, or a
// missing data pointer.
struct SafetensorsLayout {
  std::string header;
  std::vector<SafetensorsTensorRef> tensors;
};
absl::StatusOr<SafetensorsLayout> LayOutSafetensors(std::vector<SafetensorsTensorRef> tensors,
                                                    const SafetensorsMetadata& metadata);

// Writes a safetensors file through `writer` (already open; the caller commits it).
absl::Status WriteSafetensors(std::vector<SafetensorsTensorRef> tensors,
                              const SafetensorsMetadata& metadata, AtomicFileWriter* writer);

// Parses and validates the N header bytes `json` of a file whose byte buffer has `buffer_bytes`.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json,
                                                         uint64_t buffer_bytes);

class SafetensorsReader {
 public:
  // Opens `path` and validates its header. NotFound when there is no such file, DataLoss when it
  // is not a valid safetensors file.
  static absl::StatusOr<SafetensorsReader> Open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  uint64_t file_size() const { return file_.size(); }
  const SafetensorsHeader& header() const { return header_; }

  // Reads the bytes of one tensor into `out`, which must have exactly info.bytes().
  absl::Status Read(const SafetensorsTensorInfo& info, absl::Span<char> out) const;

  // Reads every tensor in buffer order to destination(info), which returns where its info.bytes()
  // go (or an error, which ReadAll returns), and returns the CRC-32C of the whole file.
  using Destination = absl::FunctionRef<absl::StatusOr<void*>(const SafetensorsTensorInfo&)>;
  absl::StatusOr<uint32_t> ReadAll(Destination destination) const;

 private:
  ReadOnlyFile file_;
  std::string raw_header_;  // the first 8 + N bytes
  SafetensorsHeader header_;
};

}  // namespace dropless::engine

#endif  // DROPLESS_WORKER_ENGINE_CHECKPOINT_SAFETENSORS_H_
