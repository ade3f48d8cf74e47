#include "worker/engine/checkpoint/moe_checkpoint.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/utf8.h"
#include "worker/engine/checkpoint/file_io.h"
#include "worker/engine/checkpoint/json.h"
#include "worker/engine/checkpoint/safetensors.h"

namespace dropless::engine {
namespace {

constexpr char kManifestFormat[] = "dropless-moe-checkpoint";
constexpr char kVersionKey[] = "dropless_checkpoint_version";
constexpr uint64_t kMaxManifestBytes = 1 << 20;

// One field of the identity as the files record it: as text in the data file's metadata, as a
// JSON number, string or boolean in the manifest's "identity".
struct IdentityField {
  std::string name;
  std::string text;
  json::Value::Kind kind = json::Value::Kind::kNumber;
  // The routing function (model.router, model.renormalize): named by its spec field in messages,
  // and absent from the checkpoints written before the files recorded it. Those are accepted
  // whatever the job's router: what they were trained with is unknown, and refusing them would
  // strand every job resuming from one.
  bool routing = false;
};

std::vector<IdentityField> IdentityFields(const MoeCheckpointIdentity& id) {
  using Kind = json::Value::Kind;
  return {{"rank", absl::StrCat(id.rank)},
          {"world_size", absl::StrCat(id.world_size)},
          {"ep", absl::StrCat(id.ep)},
          {"dp", absl::StrCat(id.dp)},
          {"hidden", absl::StrCat(id.hidden)},
          {"ffn", absl::StrCat(id.ffn)},
          {"experts", absl::StrCat(id.experts)},
          {"topk", absl::StrCat(id.topk)},
          {"shared_experts", absl::StrCat(id.shared_experts)},
          {"layers", absl::StrCat(id.layers)},
          {"seed", absl::StrCat(id.seed)},
          {"router", std::string(ToString(id.router)), Kind::kString, true},
          {"renormalize", id.renormalize ? "true" : "false", Kind::kBool, true}};
}

// How a message names a field, and shows a value of it.
std::string FieldLabel(const IdentityField& field) {
  return field.routing ? absl::StrCat("model.", field.name) : field.name;
}
std::string FieldValueText(const IdentityField& field, const std::string& text) {
  return field.kind == json::Value::Kind::kString ? json::QuoteForMessage(text) : text;
}

std::string DataFileName(int64_t rank, int64_t step) {
  return absl::StrCat("rank-", rank, "-step-", step, ".safetensors");
}

std::string RngState(const MoeCheckpointIdentity& id, int64_t step) {
  return absl::StrCat("{\"seed\":", id.seed, ",\"step\":", step, "}");
}

// A float32 tensor of the checkpoint and where it lives in the engine's buffers.
struct MoeTensor {
  std::string name;
  std::vector<int64_t> shape;
  float* data = nullptr;
};

// The parameter tensors of `replicated` and `experts` (flat buffers of `layout`), named `prefix` +
// their parameter name.
void AppendParameterTensors(const cpu::MoeParameterLayout& layout, const std::string& prefix,
                            float* replicated, float* experts, std::vector<MoeTensor>* out) {
  const cpu::MoeLayerShape& s = layout.layer_shape();
  const int64_t h = s.hidden, f = s.ffn;
  for (int64_t layer = 0; layer < layout.layers(); ++layer) {
    const cpu::MoeLayerGrads<float> w = layout.Grads<float>(replicated, experts, layer);
    const std::string base = absl::StrCat(prefix, "layers.", layer, ".");
    out->push_back({base + "router.weight", {h, s.experts}, w.router});
    for (int64_t e = 0; e < s.shared_experts; ++e) {
      const std::string shared = absl::StrCat(base, "shared_experts.", e, ".");
      out->push_back({shared + "w1", {h, 2 * f}, w.shared_w1 + e * h * 2 * f});
      out->push_back({shared + "w2", {f, h}, w.shared_w2 + e * f * h});
    }
    out->push_back({base + "experts.w1", {layout.local_experts(), h, 2 * f}, w.expert_w1});
    out->push_back({base + "experts.w2", {layout.local_experts(), f, h}, w.expert_w2});
  }
}

absl::StatusOr<std::vector<MoeTensor>> CheckpointTensors(const MoeCheckpointIdentity& id,
                                                         const cpu::MoeParameterLayout& layout,
                                                         const MoeOptimizerBuffers& replicated,
                                                         const MoeOptimizerBuffers& experts) {
  const cpu::MoeLayerShape& s = layout.layer_shape();
  const bool fits = id.ep > 0 && id.hidden == s.hidden && id.ffn == s.ffn &&
                    id.experts == s.experts && id.topk == s.topk &&
                    id.shared_experts == s.shared_experts && id.layers == layout.layers() &&
                    layout.local_experts() == id.experts / id.ep &&
                    layout.first_expert() == (id.rank % id.ep) * layout.local_experts();
  if (!fits) {
    std::vector<std::string> fields;
    for (const IdentityField& f : IdentityFields(id)) {
      fields.push_back(absl::StrCat(f.name, "=", FieldValueText(f, f.text)));
    }
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: the identity (",
                                                   absl::StrJoin(fields, ", "),
                                                   ") does not describe the parameter layout"));
  }
  struct Kind {
    const char* prefix;
    const char* what;
    absl::Span<float> replicated, experts;
  };
  const Kind kinds[] = {{"", "value", replicated.value, experts.value},
                        {"optimizer.exp_avg.", "m", replicated.m, experts.m},
                        {"optimizer.exp_avg_sq.", "v", replicated.v, experts.v}};
  std::vector<MoeTensor> tensors;
  for (const Kind& kind : kinds) {
    if (static_cast<int64_t>(kind.replicated.size()) != layout.replicated_size() ||
        static_cast<int64_t>(kind.experts.size()) != layout.experts_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint: buffers ", kind.what, " hold ", kind.replicated.size(),
                       " replicated and ", kind.experts.size(), " expert floats; the layout has ",
                       layout.replicated_size(), " and ", layout.experts_size()));
    }
    AppendParameterTensors(layout, kind.prefix, kind.replicated.data(), kind.experts.data(),
                           &tensors);
  }
  return tensors;
}

SafetensorsMetadata Metadata(const MoeCheckpointIdentity& id, int64_t step,
                             const cpu::MoeParameterLayout& layout) {
  SafetensorsMetadata metadata;
  for (IdentityField& f : IdentityFields(id)) metadata[f.name] = std::move(f.text);
  metadata["format"] = "pt";
  metadata[kVersionKey] = absl::StrCat(kMoeCheckpointVersion);
  metadata["step"] = absl::StrCat(step);
  metadata["first_expert"] = absl::StrCat(layout.first_expert());
  metadata["local_experts"] = absl::StrCat(layout.local_experts());
  metadata["rng_state"] = RngState(id, step);
  return metadata;
}

// One committed data file of a manifest.
struct ManifestEntry {
  int64_t step = 0;
  std::string file;
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

std::string EntryText(const ManifestEntry& e) {
  char crc_text[9];
  std::snprintf(crc_text, sizeof(crc_text), "%08" PRIx32, e.crc);
  return absl::StrCat("{\"name\": ", json::Quote(e.file), ", \"bytes\": ", e.bytes,
                      ", \"crc32c\": \"", crc_text, "\"}");
}

// `newest` is what the manifest commits ("step", "files"); `previous`, when set, the checkpoint
// before it, kept until every rank is known to hold a newer one ("previous": step and file).
std::string ManifestText(const MoeCheckpointIdentity& id, const ManifestEntry& newest,
                         const std::optional<ManifestEntry>& previous) {
  std::vector<std::string> identity;
  for (const IdentityField& f : IdentityFields(id)) {
    const std::string value = f.kind == json::Value::Kind::kString ? json::Quote(f.text) : f.text;
    identity.push_back(absl::StrCat(json::Quote(f.name), ": ", value));
  }
  std::string text = absl::StrCat(
      "{\n  \"format\": \"", kManifestFormat, "\",\n  \"version\": ", kMoeCheckpointVersion,
      ",\n  \"step\": ", newest.step, ",\n  \"identity\": {", absl::StrJoin(identity, ", "),
      "},\n  \"files\": [", EntryText(newest), "]");
  if (previous.has_value()) {
    absl::StrAppend(&text, ",\n  \"previous\": {\"step\": ", previous->step, ", \"files\": [",
                    EntryText(*previous), "]}");
  }
  absl::StrAppend(&text, "\n}\n");
  return text;
}

// This rank's data files (and their temp files) other than those in `keep`; best effort, after a
// commit.
void RemoveStaleDataFiles(const std::string& dir, int64_t rank,
                          const std::vector<std::string>& keep) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  const std::string prefix = absl::StrCat("rank-", rank, "-step-");
  while (const dirent* entry = readdir(d)) {
    const std::string name = entry->d_name;
    if (std::find(keep.begin(), keep.end(), name) != keep.end() ||
        !absl::StartsWith(name, prefix)) {
      continue;
    }
    if (absl::EndsWith(name, ".safetensors") || absl::EndsWith(name, ".safetensors.tmp")) {
      unlink((dir + "/" + name).c_str());
    }
  }
  closedir(d);
}

absl::Status DamagedError(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("checkpoint: ", path, ": ", what));
}

// A value read from a file, for a message.
std::string ValueText(const json::Value& value) {
  if (value.is_number()) return value.text();  // the parser's: digits, sign, point, exponent
  if (value.is_string()) return json::QuoteForMessage(value.text());
  return json::KindName(value.kind());
}

// Compares the manifest's "identity" object `recorded` with the job's identity; InvalidArgument
// naming every field that differs.
absl::Status CompareIdentity(const std::string& where, const MoeCheckpointIdentity& id,
                             const json::Value& recorded) {
  std::vector<std::string> differences;
  for (const IdentityField& field : IdentityFields(id)) {
    const json::Value* value = recorded.Find(field.name);
    if (value == nullptr && field.routing) continue;  // written before it was recorded: accepted
    if (value == nullptr || value->kind() != field.kind) {
      return DamagedError(where, absl::StrCat("identity field ", field.name, " is ",
                                              value ? ValueText(*value) : "missing", ", expected ",
                                              json::KindName(field.kind)));
    }
    const std::string text = field.kind == json::Value::Kind::kBool
                                 ? (value->boolean() ? "true" : "false")
                                 : value->text();
    if (text != field.text) {
      differences.push_back(absl::StrCat(FieldLabel(field), " is ", FieldValueText(field, text),
                                         " there, ", FieldValueText(field, field.text), " here"));
    }
  }
  if (differences.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("checkpoint: ", where,
                   " belongs to another job or layout: ", absl::StrJoin(differences, "; ")));
}

// The manifest's "version". Every build writes it as a JSON integer, so anything else (the string
// "1" too, or none) is damage: DataLoss naming the field and the file. Another integer is a
// format this build does not read: InvalidArgument.
absl::Status CheckFormatVersion(const std::string& path, const json::Value& root) {
  absl::StatusOr<int64_t> version = json::IntegerMember(root, "version");
  if (!version.ok()) return DamagedError(path, version.status().message());
  if (*version == kMoeCheckpointVersion) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", path, " has format version ",
                                                 *version, "; this build reads version ",
                                                 kMoeCheckpointVersion));
}

// A parsed manifest: the newest checkpoint it commits, then the one before it when kept.
struct Manifest {
  std::vector<ManifestEntry> entries;  // newest first, steps decreasing
};

// `holder`'s "step" and its one-element "files" list.
absl::StatusOr<ManifestEntry> ParseEntry(const std::string& path, const json::Value& holder,
                                         const std::string& what) {
  ManifestEntry entry;
  const json::Value* step = holder.Find("step");
  absl::StatusOr<int64_t> step_value =
      step ? json::ToNonNegativeInt64(*step) : absl::InvalidArgumentError("missing");
  if (!step_value.ok()) {
    return DamagedError(path, absl::StrCat(what, "step: ", step_value.status().message()));
  }
  entry.step = *step_value;
  const json::Value* files = holder.Find("files");
  if (files == nullptr || !files->is_array() || files->items().size() != 1 ||
      !files->items()[0].is_object()) {
    return DamagedError(path, absl::StrCat(what, "files must list one data file"));
  }
  const json::Value& file = files->items()[0];
  const json::Value* name = file.Find("name");
  const json::Value* bytes = file.Find("bytes");
  const json::Value* crc = file.Find("crc32c");
  absl::StatusOr<uint64_t> byte_count =
      bytes ? json::ToUint64(*bytes) : absl::InvalidArgumentError("missing");
  uint32_t crc_value = 0;
  // No control characters either: the name goes into paths, and those into error messages.
  if (name == nullptr || !name->is_string() || name->text().empty() ||
      name->text().find('/') != std::string::npos || name->text() == "." || name->text() == ".." ||
      HasControlCharacters(name->text()) || !byte_count.ok() || crc == nullptr ||
      !crc->is_string() || crc->text().size() != 8 ||
      !absl::SimpleHexAtoi(crc->text(), &crc_value)) {
    return DamagedError(path, absl::StrCat(what,
                                           "the data file entry needs a plain name, bytes "
                                           "and an 8-digit crc32c"));
  }
  entry.file = name->text();
  entry.bytes = *byte_count;
  entry.crc = crc_value;
  return entry;
}

absl::StatusOr<Manifest> ParseManifest(const std::string& path, const std::string& text,
                                       const MoeCheckpointIdentity& id) {
  absl::StatusOr<json::Value> root = json::Parse(text);
  if (!root.ok()) return DamagedError(path, root.status().message());
  const json::Value* format = root->is_object() ? root->Find("format") : nullptr;
  if (format == nullptr || format->text() != kManifestFormat) {
    return DamagedError(path, absl::StrCat("not a ", kManifestFormat, " manifest"));
  }
  if (absl::Status s = CheckFormatVersion(path, *root); !s.ok()) return s;
  const json::Value* identity = root->Find("identity");
  if (identity == nullptr || !identity->is_object()) return DamagedError(path, "no identity");
  if (absl::Status same = CompareIdentity(path, id, *identity); !same.ok()) return same;
  Manifest manifest;
  absl::StatusOr<ManifestEntry> newest = ParseEntry(path, *root, "");
  if (!newest.ok()) return newest.status();
  manifest.entries.push_back(*std::move(newest));
  if (const json::Value* previous = root->Find("previous"); previous != nullptr) {
    if (!previous->is_object()) return DamagedError(path, "previous must be an object");
    absl::StatusOr<ManifestEntry> entry = ParseEntry(path, *previous, "previous: ");
    if (!entry.ok()) return entry.status();
    if (entry->step >= manifest.entries[0].step || entry->file == manifest.entries[0].file) {
      return DamagedError(path, "previous must be an older step in another file");
    }
    manifest.entries.push_back(*std::move(entry));
  }
  return manifest;
}

// id.rank's manifest in `dir`; NotFound when there is none (FailedPrecondition when only the
// pre-safetensors format is there).
absl::StatusOr<Manifest> ReadManifest(const std::string& dir, const MoeCheckpointIdentity& id) {
  const std::string manifest_path = MoeCheckpointManifestPath(dir, id.rank);
  absl::StatusOr<std::string> text = ReadSmallFile(manifest_path, kMaxManifestBytes);
  if (absl::IsNotFound(text.status())) {
    const std::string legacy = absl::StrCat(dir, "/rank-", id.rank, ".ckpt");
    if (access(legacy.c_str(), F_OK) == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint: ", legacy,
                       " is in the pre-safetensors format, which this build no longer "
                       "reads; remove it or choose another checkpoint.dir"));
    }
    return absl::NotFoundError(absl::StrCat("checkpoint: no ", manifest_path));
  }
  if (!text.ok()) return text.status();
  return ParseManifest(manifest_path, *text, id);
}

// Commits a manifest of `entries` (newest first, at most two) atomically; none removes it.
absl::Status CommitManifest(const std::string& dir, const MoeCheckpointIdentity& id,
                            const std::vector<ManifestEntry>& entries) {
  const std::string path = MoeCheckpointManifestPath(dir, id.rank);
  if (entries.empty()) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return absl::InternalError(
          absl::StrCat("checkpoint: removing ", path, ": ", std::strerror(errno)));
    }
    return SyncDirectory(dir);
  }
  const std::optional<ManifestEntry> previous =
      entries.size() > 1 ? std::optional<ManifestEntry>(entries[1]) : std::nullopt;
  const std::string text = ManifestText(id, entries[0], previous);
  AtomicFileWriter manifest(path);
  if (absl::Status s = manifest.Open(); !s.ok()) return s;
  if (absl::Status s = manifest.Append(text.data(), text.size()); !s.ok()) return s;
  return manifest.Commit();
}

}  // namespace

bool MoeCheckpointIdentity::operator==(const MoeCheckpointIdentity& other) const {
  const std::vector<IdentityField> mine = IdentityFields(*this), theirs = IdentityFields(other);
  return std::equal(
      mine.begin(), mine.end(), theirs.begin(), theirs.end(),
      [](const IdentityField& a, const IdentityField& b) { return a.text == b.text; });
}

MoeCheckpointIdentity MoeCheckpointIdentityOf(const EngineConfig& spec, int64_t rank) {
  MoeCheckpointIdentity id;
  id.rank = rank;
  id.world_size = spec.world_size();
  id.ep = spec.parallel.ep;
  id.dp = spec.parallel.dp;
  id.hidden = spec.model.hidden;
  id.ffn = spec.model.ffn;
  id.experts = spec.model.experts;
  id.topk = spec.model.topk;
  id.shared_experts = spec.model.shared_experts;
  id.layers = spec.model.layers;
  id.seed = spec.data.seed;
  id.router = spec.model.router;
  id.renormalize = spec.model.renormalize;
  return id;
}

std::string MoeCheckpointManifestPath(const std::string& dir, int64_t rank) {
  return absl::StrCat(dir, "/manifest-rank-", rank, ".json");
}

std::string MoeCheckpointDataPath(const std::string& dir, int64_t rank, int64_t step) {
  return absl::StrCat(dir, "/", DataFileName(rank, step));
}

absl::Status WriteMoeCheckpoint(const std::string& dir, const MoeCheckpointIdentity& id,
                                int64_t step, const cpu::MoeParameterLayout& layout,
                                const MoeOptimizerBuffers& replicated,
                                const MoeOptimizerBuffers& experts) {
  if (step < 0) return absl::InvalidArgumentError("checkpoint: negative step");
  absl::StatusOr<std::vector<MoeTensor>> tensors =
      CheckpointTensors(id, layout, replicated, experts);
  if (!tensors.ok()) return tensors.status();
  if (absl::Status s = MakeDirectories(dir); !s.ok()) {
    return AsCheckpointJobError(s);  // a file there: the job's; a failed fsync: the moment's
  }

  // What this rank committed before and is older than `step` stays committed as the fallback.
  // Anything at `step` or later (a run resumed from an older step writes it again) leaves the
  // manifest first, so that its data file is never replaced while a manifest names it.
  std::vector<ManifestEntry> older;
  absl::StatusOr<Manifest> before = ReadManifest(dir, id);
  if (!before.ok() && !absl::IsNotFound(before.status())) {
    // An unreadable manifest is not an empty one: writing on would commit a manifest without the
    // fallback and remove the fallback's data file. A damaged one is the job's error (restore
    // meets it too); an I/O error fails this save only, and a retry finds the fallback intact.
    return AsCheckpointJobError(before.status());
  }
  if (before.ok()) {
    for (const ManifestEntry& e : before->entries) {
      if (e.step < step) older.push_back(e);
    }
    if (older.size() != before->entries.size()) {
      if (absl::Status s = CommitManifest(dir, id, older); !s.ok()) return s;
    }
  }

  std::vector<SafetensorsTensorRef> refs;
  for (const MoeTensor& t : *tensors) {
    refs.push_back({t.name, SafetensorsDtype::kF32, t.shape, t.data});
  }
  ManifestEntry newest;
  newest.step = step;
  newest.file = DataFileName(id.rank, step);
  AtomicFileWriter data(dir + "/" + newest.file);
  if (absl::Status s = data.Open(); !s.ok()) return s;
  if (absl::Status s = WriteSafetensors(std::move(refs), Metadata(id, step, layout), &data);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = data.Commit(); !s.ok()) return s;
  newest.bytes = data.size();
  newest.crc = data.crc32c();

  std::vector<ManifestEntry> entries = {newest};
  if (!older.empty()) entries.push_back(older[0]);
  if (absl::Status s = CommitManifest(dir, id, entries); !s.ok()) return s;
  std::vector<std::string> keep;
  for (const ManifestEntry& e : entries) keep.push_back(e.file);
  RemoveStaleDataFiles(dir, id.rank, keep);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> MoeCheckpointSteps(const std::string& dir,
                                                        const MoeCheckpointIdentity& id) {
  absl::StatusOr<Manifest> manifest = ReadManifest(dir, id);
  if (!manifest.ok()) return AsCheckpointJobError(manifest.status());
  std::vector<int64_t> steps;
  for (const ManifestEntry& e : manifest->entries) steps.push_back(e.step);
  return steps;
}

namespace {

absl::StatusOr<int64_t> ReadCheckpointFiles(const std::string& dir, const MoeCheckpointIdentity& id,
                                            const cpu::MoeParameterLayout& layout,
                                            const MoeOptimizerBuffers& replicated,
                                            const MoeOptimizerBuffers& experts,
                                            std::optional<int64_t> step) {
  absl::StatusOr<std::vector<MoeTensor>> tensors =
      CheckpointTensors(id, layout, replicated, experts);
  if (!tensors.ok()) return tensors.status();
  absl::StatusOr<Manifest> parsed = ReadManifest(dir, id);
  if (!parsed.ok()) return parsed.status();
  const std::string manifest_path = MoeCheckpointManifestPath(dir, id.rank);
  const ManifestEntry* manifest = &parsed->entries[0];
  if (step.has_value()) {
    manifest = nullptr;
    for (const ManifestEntry& e : parsed->entries) {
      if (e.step == *step) manifest = &e;
    }
    if (manifest == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint: ", manifest_path, " commits no step ", *step));
    }
  }

  const std::string data_path = dir + "/" + manifest->file;
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(data_path);
  if (!reader.ok()) {
    if (!absl::IsNotFound(reader.status())) return reader.status();
    return DamagedError(manifest_path, absl::StrCat("its data file ", data_path, " is missing"));
  }
  if (reader->file_size() != manifest->bytes) {
    return DamagedError(data_path, absl::StrCat("is ", reader->file_size(),
                                                " bytes, the manifest says ", manifest->bytes));
  }
  const SafetensorsMetadata& metadata = reader->header().metadata;
  const SafetensorsMetadata expected_metadata = Metadata(id, manifest->step, layout);
  std::vector<std::string> may_be_absent;  // from before the files recorded the routing function
  for (const IdentityField& f : IdentityFields(id)) {
    if (f.routing) may_be_absent.push_back(f.name);
  }
  for (const auto& [key, value] : expected_metadata) {
    const auto it = metadata.find(key);
    if (it == metadata.end() &&
        std::find(may_be_absent.begin(), may_be_absent.end(), key) != may_be_absent.end()) {
      continue;
    }
    if (it == metadata.end() || it->second != value) {
      return DamagedError(
          data_path,
          absl::StrCat("metadata ", key, " is ",
                       it == metadata.end() ? "missing" : json::QuoteForMessage(it->second),
                       ", expected ", json::QuoteForMessage(value)));
    }
  }
  std::map<std::string, const MoeTensor*> by_name;
  for (const MoeTensor& t : *tensors) by_name[t.name] = &t;
  if (reader->header().tensors.size() != by_name.size()) {
    return DamagedError(data_path, absl::StrCat("holds ", reader->header().tensors.size(),
                                                " tensors, expected ", by_name.size()));
  }
  absl::StatusOr<uint32_t> crc =
      reader->ReadAll([&](const SafetensorsTensorInfo& info) -> absl::StatusOr<void*> {
        const auto it = by_name.find(info.name);
        if (it == by_name.end()) {
          return DamagedError(data_path,
                              absl::StrCat("unexpected tensor ", json::QuoteForMessage(info.name)));
        }
        if (info.dtype != SafetensorsDtype::kF32 || info.shape != it->second->shape) {
          return DamagedError(
              data_path,
              absl::StrCat("tensor ", json::QuoteForMessage(info.name), " is ",
                           SafetensorsDtypeName(info.dtype), " [", absl::StrJoin(info.shape, ","),
                           "], expected F32 [", absl::StrJoin(it->second->shape, ","), "]"));
        }
        return static_cast<void*>(it->second->data);
      });
  if (!crc.ok()) return crc.status();
  if (*crc != manifest->crc) {
    return DamagedError(data_path, "fails its checksum (the manifest's crc32c)");
  }
  return manifest->step;
}

}  // namespace

absl::StatusOr<int64_t> ReadMoeCheckpoint(const std::string& dir, const MoeCheckpointIdentity& id,
                                          const cpu::MoeParameterLayout& layout,
                                          const MoeOptimizerBuffers& replicated,
                                          const MoeOptimizerBuffers& experts,
                                          std::optional<int64_t> step) {
  absl::StatusOr<int64_t> read = ReadCheckpointFiles(dir, id, layout, replicated, experts, step);
  if (!read.ok()) return AsCheckpointJobError(read.status());
  return read;
}

}  // namespace dropless::engine
