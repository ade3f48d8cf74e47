// Helpers shared by the MoE checkpoint tests: a tiny job, one rank's random buffers, a fresh
// directory per test, and a way to craft a well-formed checkpoint with content of the test's
// choosing.
#ifndef DROPLESS_TESTS_UNIT_ENGINE_MOE_CHECKPOINT_TEST_UTIL_H_
#define DROPLESS_TESTS_UNIT_ENGINE_MOE_CHECKPOINT_TEST_UTIL_H_

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "common/engine_config.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "worker/engine/checkpoint/file_io.h"
#include "worker/engine/checkpoint/moe_checkpoint.h"
#include "worker/engine/checkpoint/safetensors.h"

namespace dropless::engine::checkpoint_testing {

inline ModelSpec TinyModel() {
  ModelSpec m;
  m.hidden = 8;
  m.ffn = 6;
  m.experts = 4;
  m.topk = 2;
  m.shared_experts = 1;
  m.layers = 2;
  return m;
}

inline JobSpec TinyJob(int ep, int dp) {
  JobSpec spec;
  spec.model = TinyModel();
  spec.parallel.ep = ep;
  spec.parallel.dp = dp;
  spec.data.seed = 99;
  return spec;
}

// One rank's parameter and moment buffers, filled with random values.
struct RankState {
  RankState(const JobSpec& spec, int rank, uint32_t seed)
      : id(MoeCheckpointIdentityOf(EngineConfigFromSpec(spec), rank)),
        layout(spec.model, spec.parallel.ep, rank % spec.parallel.ep, 16) {
    for (auto* v : {&rep_value, &rep_m, &rep_v}) v->resize(layout.replicated_size());
    for (auto* v : {&exp_value, &exp_m, &exp_v}) v->resize(layout.experts_size());
    Fill(seed);
  }
  void Fill(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    for (auto* v : {&rep_value, &rep_m, &rep_v, &exp_value, &exp_m, &exp_v}) {
      for (float& x : *v) x = normal(rng);
    }
  }
  MoeOptimizerBuffers Replicated() {
    return {absl::MakeSpan(rep_value), absl::MakeSpan(rep_m), absl::MakeSpan(rep_v)};
  }
  MoeOptimizerBuffers Experts() {
    return {absl::MakeSpan(exp_value), absl::MakeSpan(exp_m), absl::MakeSpan(exp_v)};
  }
  absl::Status Write(const std::string& dir, int64_t step) {
    return WriteMoeCheckpoint(dir, id, step, layout, Replicated(), Experts());
  }
  absl::StatusOr<int64_t> Read(const std::string& dir) {
    return ReadMoeCheckpoint(dir, id, layout, Replicated(), Experts());
  }
  bool operator==(const RankState& o) const {
    return rep_value == o.rep_value && rep_m == o.rep_m && rep_v == o.rep_v &&
           exp_value == o.exp_value && exp_m == o.exp_m && exp_v == o.exp_v;
  }

  MoeCheckpointIdentity id;
  cpu::MoeParameterLayout layout;
  std::vector<float> rep_value, rep_m, rep_v, exp_value, exp_m, exp_v;
};

// A directory of its own for each test (removed before and after).
class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TEST_TMPDIR");
    dir_ = std::string(base ? base : "/tmp") + "/dropless-moe-ckpt-" + std::to_string(getpid()) +
           "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Rewrites the manifest of `rank` in `dir` with the first match of `pattern` replaced by
// `replacement`.
inline void EditManifest(const std::string& dir, int64_t rank, const std::string& pattern,
                         const std::string& replacement) {
  const std::string path = MoeCheckpointManifestPath(dir, rank);
  WriteText(path, std::regex_replace(ReadText(path), std::regex(pattern), replacement,
                                     std::regex_constants::format_first_only));
}

// Rewrites rank 0's data file of `step` in `dir` (the manifest's newest) through the library with
// its tensors and metadata changed by `edit`, and the manifest's size and CRC-32C to match: a
// checkpoint whose files are intact and whose content is the test's.
using CraftEdit = std::function<void(std::vector<SafetensorsTensorRef>*, SafetensorsMetadata*)>;
inline void CraftDataFile(const std::string& dir, int64_t step, const CraftEdit& edit) {
  const std::string path = MoeCheckpointDataPath(dir, 0, step);
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<std::string> bytes;
  std::vector<SafetensorsTensorRef> tensors;
  bytes.reserve(reader->header().tensors.size());
  for (const SafetensorsTensorInfo& info : reader->header().tensors) {
    bytes.emplace_back(info.bytes(), '\0');
    ASSERT_TRUE(reader->Read(info, absl::MakeSpan(bytes.back())).ok());
    tensors.push_back({info.name, info.dtype, info.shape, bytes.back().data()});
  }
  SafetensorsMetadata metadata = reader->header().metadata;
  edit(&tensors, &metadata);
  AtomicFileWriter writer(path);
  ASSERT_TRUE(writer.Open().ok());
  ASSERT_TRUE(WriteSafetensors(tensors, metadata, &writer).ok());
  ASSERT_TRUE(writer.Commit().ok());
  char crc[9];
  std::snprintf(crc, sizeof(crc), "%08" PRIx32, writer.crc32c());
  EditManifest(dir, 0, "\"bytes\": [0-9]+", "\"bytes\": " + std::to_string(writer.size()));
  EditManifest(dir, 0, "\"crc32c\": \"[0-9a-f]{8}\"", std::string("\"crc32c\": \"") + crc + "\"");
}

}  // namespace dropless::engine::checkpoint_testing

#endif  // DROPLESS_TESTS_UNIT_ENGINE_MOE_CHECKPOINT_TEST_UTIL_H_
