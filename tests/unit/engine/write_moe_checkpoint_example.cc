// Helper of safetensors_reference_test.py:
//   write_moe_checkpoint_example write DIR  writes rank 1 of a tiny ep=2 job's checkpoint at step
//   3,
//       every value its index in its flat buffer (value i, exp_avg -i, exp_avg_sq i + 0.5; experts
//       buffer offset by 100000);
//   write_moe_checkpoint_example read FILE  prints each tensor of a safetensors file as
//       "name dtype shape-joined-by-x hex-of-bytes" lines, sorted by name, then "metadata k=v".
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/engine/checkpoint/moe_checkpoint.h"
#include "worker/engine/checkpoint/safetensors.h"

namespace dropless::engine {
namespace {

int Write(const std::string& dir) {
  JobSpec spec;
  spec.model.hidden = 4;
  spec.model.ffn = 3;
  spec.model.experts = 4;
  spec.model.topk = 2;
  spec.model.shared_experts = 1;
  spec.model.layers = 2;
  spec.parallel.ep = 2;
  spec.parallel.dp = 1;
  spec.data.seed = 1234;
  const int rank = 1;
  const cpu::MoeParameterLayout layout(spec.model, 2, rank, 8);
  std::vector<float> rep[3], exp[3];
  for (int k = 0; k < 3; ++k) {
    rep[k].resize(layout.replicated_size());
    exp[k].resize(layout.experts_size());
    for (size_t i = 0; i < rep[k].size() + exp[k].size(); ++i) {
      const bool is_rep = i < rep[k].size();
      const float index =
          is_rep ? static_cast<float>(i) : 100000.f + static_cast<float>(i - rep[k].size());
      const float value = k == 0 ? index : k == 1 ? -index : index + 0.5f;
      (is_rep ? rep[k][i] : exp[k][i - rep[k].size()]) = value;
    }
  }
  const absl::Status status =
      WriteMoeCheckpoint(dir, MoeCheckpointIdentityOf(EngineConfigFromSpec(spec), rank), 3, layout,
                         {absl::MakeSpan(rep[0]), absl::MakeSpan(rep[1]), absl::MakeSpan(rep[2])},
                         {absl::MakeSpan(exp[0]), absl::MakeSpan(exp[1]), absl::MakeSpan(exp[2])});
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}

int Read(const std::string& path) {
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  if (!reader.ok()) {
    std::fprintf(stderr, "%s\n", reader.status().ToString().c_str());
    return 1;
  }
  std::vector<std::string> lines;
  for (const SafetensorsTensorInfo& t : reader->header().tensors) {
    std::string bytes(t.bytes(), '\0');
    if (absl::Status s = reader->Read(t, absl::MakeSpan(bytes)); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    lines.push_back(absl::StrCat(t.name, " ", SafetensorsDtypeName(t.dtype), " ",
                                 absl::StrJoin(t.shape, "x"), " ", absl::BytesToHexString(bytes)));
  }
  std::sort(lines.begin(), lines.end());
  for (const auto& [key, value] : reader->header().metadata) {
    lines.push_back(absl::StrCat("metadata ", key, "=", value));
  }
  for (const std::string& line : lines) std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace
}  // namespace dropless::engine

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode == "write") return dropless::engine::Write(argv[2]);
  if (mode == "read") return dropless::engine::Read(argv[2]);
  std::fprintf(stderr, "usage: %s write DIR | read FILE\n", argv[0]);
  return 2;
}
