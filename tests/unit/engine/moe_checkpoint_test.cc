// MoE rank checkpoints: round trip, the safetensors names/shapes/metadata other tools see, the
// manifest, refusal of other jobs (naming the field), damage, and atomicity of replacement.
#include "worker/engine/checkpoint/moe_checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/job_error.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/moe_checkpoint_test_util.h"
#include "worker/engine/checkpoint/file_io.h"
#include "worker/engine/checkpoint/json.h"
#include "worker/engine/checkpoint/safetensors.h"

namespace dropless::engine {
namespace {

namespace fs = std::filesystem;

using checkpoint_testing::RankState;
using checkpoint_testing::TinyJob;

class MoeCheckpointTest : public checkpoint_testing::CheckpointDirTest {};

TEST_F(MoeCheckpointTest, RoundTripsFreshRandomData) {
  const JobSpec spec = TinyJob(2, 1);
  RankState written(spec, 1, std::random_device{}());
  ASSERT_TRUE(written.Write(dir_ + "/nested/dir", 12).ok());
  RankState read(spec, 1, 0);
  absl::StatusOr<int64_t> step = read.Read(dir_ + "/nested/dir");
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 12);
  EXPECT_TRUE(read == written);
}

TEST_F(MoeCheckpointTest, FileHasEcosystemNamesShapesAndMetadata) {
  const JobSpec spec = TinyJob(2, 1);  // rank 1 holds experts 2 and 3
  RankState state(spec, 1, 3);
  ASSERT_TRUE(state.Write(dir_, 7).ok());
  absl::StatusOr<SafetensorsReader> reader =
      SafetensorsReader::Open(MoeCheckpointDataPath(dir_, 1, 7));
  ASSERT_TRUE(reader.ok()) << reader.status();
  const SafetensorsHeader& h = reader->header();
  // Per layer: router, shared w1/w2, experts w1/w2; times value, exp_avg, exp_avg_sq.
  EXPECT_EQ(h.tensors.size(), 2u * 5u * 3u);
  const auto shape_of = [&](const std::string& name) {
    const SafetensorsTensorInfo* t = h.Find(name);
    return t ? t->shape : std::vector<int64_t>{-1};
  };
  using Shape = std::vector<int64_t>;
  EXPECT_EQ(shape_of("layers.0.router.weight"), (Shape{8, 4}));
  EXPECT_EQ(shape_of("layers.1.shared_experts.0.w1"), (Shape{8, 12}));
  EXPECT_EQ(shape_of("layers.1.shared_experts.0.w2"), (Shape{6, 8}));
  EXPECT_EQ(shape_of("layers.1.experts.w1"), (Shape{2, 8, 12}));
  EXPECT_EQ(shape_of("optimizer.exp_avg.layers.0.experts.w2"), (Shape{2, 6, 8}));
  EXPECT_EQ(shape_of("optimizer.exp_avg_sq.layers.1.router.weight"), (Shape{8, 4}));
  EXPECT_EQ(h.metadata.at("step"), "7");
  EXPECT_EQ(h.metadata.at("first_expert"), "2");
  EXPECT_EQ(h.metadata.at("local_experts"), "2");
  EXPECT_EQ(h.metadata.at("hidden"), "8");
  EXPECT_EQ(h.metadata.at("seed"), "99");
  EXPECT_EQ(h.metadata.at("rng_state"), R"({"seed":99,"step":7})");
  EXPECT_EQ(h.metadata.at("format"), "pt");
  // Layer 1's expert w2 is the second layer's tail of the experts buffer.
  const int64_t per_layer = state.layout.experts_size() / 2;
  std::vector<float> w2(2 * 6 * 8);
  ASSERT_TRUE(reader
                  ->Read(*h.Find("optimizer.exp_avg_sq.layers.1.experts.w2"),
                         absl::MakeSpan(reinterpret_cast<char*>(w2.data()), w2.size() * 4))
                  .ok());
  EXPECT_EQ(w2, std::vector<float>(state.exp_v.begin() + 2 * per_layer - w2.size(),
                                   state.exp_v.begin() + 2 * per_layer));

  absl::StatusOr<std::string> manifest_text =
      ReadSmallFile(MoeCheckpointManifestPath(dir_, 1), 1 << 20);
  ASSERT_TRUE(manifest_text.ok());
  absl::StatusOr<json::Value> manifest = json::Parse(*manifest_text);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->Find("step")->text(), "7");
  EXPECT_EQ(manifest->Find("identity")->Find("ep")->text(), "2");
  const json::Value& file = manifest->Find("files")->items().at(0);
  EXPECT_EQ(file.Find("name")->text(), "rank-1-step-7.safetensors");
  EXPECT_EQ(*json::ToUint64(*file.Find("bytes")), reader->file_size());
}

TEST_F(MoeCheckpointTest, NoCheckpointIsNotFound) {
  RankState state(TinyJob(1, 1), 0, 1);
  EXPECT_EQ(state.Read(dir_).status().code(), absl::StatusCode::kNotFound);
  fs::create_directories(dir_);
  EXPECT_EQ(state.Read(dir_).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(IsJobError(state.Read(dir_).status()));  // nothing there: a fresh start
  std::ofstream(dir_ + "/rank-0.ckpt") << "old";        // the pre-safetensors format is not ignored
  EXPECT_EQ(state.Read(dir_).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(IsJobError(state.Read(dir_).status()));
}

TEST_F(MoeCheckpointTest, AnotherJobIsRefusedNamingTheFields) {
  RankState written(TinyJob(2, 1), 0, 1);
  ASSERT_TRUE(written.Write(dir_, 3).ok());
  JobSpec wider = TinyJob(2, 1);
  wider.model.hidden = 16;
  absl::StatusOr<int64_t> step = RankState(wider, 0, 1).Read(dir_);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(step.status().message().find("hidden is 8 there, 16 here"), std::string::npos)
      << step.status();
  JobSpec reseeded = TinyJob(2, 1);
  reseeded.data.seed = 5;
  reseeded.model.layers = 3;
  step = RankState(reseeded, 0, 1).Read(dir_);
  EXPECT_NE(step.status().message().find("layers is 2 there, 3 here; seed is 99 there, 5 here"),
            std::string::npos)
      << step.status();
  step = RankState(TinyJob(2, 2), 0, 1).Read(dir_);  // same rank 0, other layout
  EXPECT_NE(step.status().message().find("world_size is 2 there, 4 here; dp is 1 there, 2 here"),
            std::string::npos)
      << step.status();
}

TEST_F(MoeCheckpointTest, BuffersThatDoNotFitTheLayoutAreRefused) {
  RankState state(TinyJob(2, 1), 0, 1);
  state.exp_m.pop_back();
  EXPECT_EQ(state.Write(dir_, 1).code(), absl::StatusCode::kInvalidArgument);
  RankState other(TinyJob(2, 1), 0, 1);
  other.id.ffn = 7;  // identity that does not describe the layout
  EXPECT_EQ(other.Write(dir_, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(other.Write(dir_, -1).code(), absl::StatusCode::kInvalidArgument);
}

void Overwrite(const std::string& path, std::streamoff offset, const std::string& bytes) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(offset, offset < 0 ? std::ios::end : std::ios::beg);
  file << bytes;
}

TEST_F(MoeCheckpointTest, DamageIsDataLoss) {
  RankState state(TinyJob(1, 1), 0, 1);
  const std::string data = MoeCheckpointDataPath(dir_, 0, 5);
  const std::string manifest = MoeCheckpointManifestPath(dir_, 0);
  const auto expect_code = [&](absl::StatusCode code, const char* what) {
    EXPECT_EQ(state.Read(dir_).status().code(), code) << what << ": " << state.Read(dir_).status();
    // The directory stays damaged for every retry: the rank reports a job error.
    EXPECT_TRUE(IsJobError(state.Read(dir_).status())) << what;
    fs::remove(manifest);  // repair for the next case (a save refuses a damaged manifest)
    ASSERT_TRUE(state.Write(dir_, 5).ok());
  };
  ASSERT_TRUE(state.Write(dir_, 5).ok());
  Overwrite(data, -100, "\x5a\x5a");
  expect_code(absl::StatusCode::kDataLoss, "payload byte flipped");
  fs::resize_file(data, fs::file_size(data) - 4);
  expect_code(absl::StatusCode::kDataLoss, "data truncated");
  fs::resize_file(data, 40);
  expect_code(absl::StatusCode::kDataLoss, "header truncated");
  Overwrite(data, 20, "\"");
  expect_code(absl::StatusCode::kDataLoss, "header JSON damaged");
  fs::remove(data);
  expect_code(absl::StatusCode::kDataLoss, "data file missing");
  Overwrite(manifest, 0, "{{");
  expect_code(absl::StatusCode::kDataLoss, "manifest not JSON");
  std::ofstream(manifest, std::ios::trunc)
      << R"({"format": "dropless-moe-checkpoint", "version": 2})";
  expect_code(absl::StatusCode::kInvalidArgument, "manifest of a newer version");
  std::string text = *ReadSmallFile(manifest, 1 << 20);
  text.replace(text.find("rank-0-step-5"), 13, "../rank-0-step-5");
  std::ofstream(manifest, std::ios::trunc) << text;
  expect_code(absl::StatusCode::kDataLoss, "manifest names a file outside the directory");
}

// The manifest's version is a JSON integer, as every build writes it: anything else in its place
// (the string "1" too, which once passed for version 1) is damage, refused naming the field and
// the file by a restore, by the step listing the ranks agree from, and by a save (which keeps the
// manifest as it is). Another integer is a version this build does not read.
TEST_F(MoeCheckpointTest, AManifestVersionMustBeAJsonInteger) {
  RankState state(TinyJob(1, 1), 0, std::random_device{}());
  const std::string manifest = MoeCheckpointManifestPath(dir_, 0);
  struct Case {
    std::string version;  // "": none
    absl::StatusCode code;
    std::string says;
  };
  constexpr absl::StatusCode kDamaged = absl::StatusCode::kDataLoss;
  const std::string expected = ", expected a JSON integer";
  const Case cases[] = {
      {"\"1\"", kDamaged, "field \"version\" is the string \"1\"" + expected},
      {"\"\"", kDamaged, "field \"version\" is the string \"\"" + expected},
      {"1.0", kDamaged, "field \"version\" is 1.0" + expected},
      {"1e0", kDamaged, "field \"version\" is 1e0" + expected},
      {"true", kDamaged, "field \"version\" is a boolean" + expected},
      {"null", kDamaged, "field \"version\" is null" + expected},
      {"[1]", kDamaged, "field \"version\" is an array" + expected},
      {"{\"v\": 1}", kDamaged, "field \"version\" is an object" + expected},
      {"99999999999999999999", kDamaged, "field \"version\" is 99999999999999999999" + expected},
      {"", kDamaged, "field \"version\" is missing"},
      {"2", absl::StatusCode::kInvalidArgument, "has format version 2; this build reads version 1"},
      {"-1", absl::StatusCode::kInvalidArgument, "has format version -1;"},
  };
  for (const Case& c : cases) {
    fs::remove_all(dir_);
    ASSERT_TRUE(state.Write(dir_, 5).ok());
    checkpoint_testing::EditManifest(dir_, 0, "\"version\": 1,",
                                     c.version.empty() ? "" : "\"version\": " + c.version + ",");
    const std::string edited = checkpoint_testing::ReadText(manifest);
    ASSERT_EQ(edited.find("\"version\": 1,"), std::string::npos) << edited;
    for (const absl::Status& s :
         {state.Read(dir_).status(), MoeCheckpointSteps(dir_, state.id).status(),
          state.Write(dir_, 6)}) {
      EXPECT_EQ(s.code(), c.code) << c.version << ": " << s;
      EXPECT_TRUE(IsJobError(s)) << c.version << ": " << s;
      EXPECT_NE(s.message().find(manifest), absl::string_view::npos) << s;
      EXPECT_NE(s.message().find(c.says), absl::string_view::npos) << s;
    }
    EXPECT_EQ(checkpoint_testing::ReadText(manifest), edited) << "the save replaced it";
  }
  // The integer this build writes reads, in any JSON spelling of the object around it.
  fs::remove_all(dir_);
  ASSERT_TRUE(state.Write(dir_, 5).ok());
  checkpoint_testing::EditManifest(dir_, 0, "\"version\": 1,", "\"version\"  :\t1 ,");
  RankState read(TinyJob(1, 1), 0, 0);
  absl::StatusOr<int64_t> step = read.Read(dir_);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 5);
  EXPECT_TRUE(read == state);
}

TEST_F(MoeCheckpointTest, LeftoverOrFailedWritesLeaveThePreviousCheckpoint) {
  const JobSpec spec = TinyJob(1, 1);
  RankState saved(spec, 0, 1);
  ASSERT_TRUE(saved.Write(dir_, 4).ok());
  const auto expect_step_4 = [&](const char* what) {
    RankState read(spec, 0, 2);
    absl::StatusOr<int64_t> step = read.Read(dir_);
    ASSERT_TRUE(step.ok()) << what << ": " << step.status();
    EXPECT_EQ(*step, 4) << what;
    EXPECT_TRUE(read == saved) << what;
  };
  // A crash while writing step 8 leaves temp files, or a data file that no manifest names yet.
  const std::string data8 = MoeCheckpointDataPath(dir_, 0, 8);
  const std::string manifest = MoeCheckpointManifestPath(dir_, 0);
  std::ofstream(AtomicFileWriter::TempPath(data8)) << "partial";
  std::ofstream(AtomicFileWriter::TempPath(manifest)) << "{\"partial";
  std::ofstream(data8) << "garbage";
  expect_step_4("leftover files");

  RankState next(spec, 0, 3);
  // Writes that fail: the data file's temp path, then the manifest's, cannot be created.
  fs::remove(AtomicFileWriter::TempPath(data8));
  fs::create_directory(AtomicFileWriter::TempPath(data8));
  EXPECT_FALSE(next.Write(dir_, 8).ok());
  expect_step_4("failed data write");
  fs::remove(AtomicFileWriter::TempPath(data8));
  fs::remove(AtomicFileWriter::TempPath(manifest));
  fs::create_directory(AtomicFileWriter::TempPath(manifest));
  EXPECT_FALSE(next.Write(dir_, 8).ok());
  expect_step_4("failed manifest write");
  fs::remove(AtomicFileWriter::TempPath(manifest));

  // A write that succeeds replaces the checkpoint and removes this rank's other data files only.
  std::ofstream(AtomicFileWriter::TempPath(MoeCheckpointDataPath(dir_, 0, 6))) << "partial";
  std::ofstream(MoeCheckpointDataPath(dir_, 10, 4)) << "rank 10's";
  ASSERT_TRUE(next.Write(dir_, 8).ok());
  RankState read(spec, 0, 4);
  EXPECT_EQ(*read.Read(dir_), 8);
  EXPECT_TRUE(read == next);
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names,
            (std::vector<std::string>{"manifest-rank-0.json", "rank-0-step-4.safetensors",
                                      "rank-0-step-8.safetensors", "rank-10-step-4.safetensors"}));
}

// A checkpoint.dir that is a file (or under one) fails the job rather than each of its attempts.
TEST_F(MoeCheckpointTest, ACheckpointDirThatIsAFileIsAJobError) {
  RankState state(TinyJob(1, 1), 0, 1);
  fs::create_directories(dir_);
  const std::string file = dir_ + "/a-file";
  std::ofstream(file) << "x";
  for (const std::string& dir : {file, file + "/under"}) {
    const absl::Status read = state.Read(dir).status();
    EXPECT_EQ(read.code(), absl::StatusCode::kFailedPrecondition) << dir << ": " << read;
    EXPECT_TRUE(IsJobError(read)) << dir << ": " << read;
    const absl::Status write = state.Write(dir, 3);
    EXPECT_EQ(write.code(), absl::StatusCode::kFailedPrecondition) << dir << ": " << write;
    EXPECT_TRUE(IsJobError(write)) << dir << ": " << write;
  }
}

// Something other than a file where the manifest belongs (here a FIFO, whose open would wait for
// a writer) is refused at once.
TEST_F(MoeCheckpointTest, AFifoInPlaceOfTheManifestIsRefusedWithoutBlocking) {
  RankState state(TinyJob(1, 1), 0, 1);
  fs::create_directories(dir_);
  ASSERT_EQ(mkfifo(MoeCheckpointManifestPath(dir_, 0).c_str(), 0600), 0);
  const absl::Status read = state.Read(dir_).status();
  EXPECT_EQ(read.code(), absl::StatusCode::kFailedPrecondition) << read;
  EXPECT_NE(read.message().find("not a regular file"), absl::string_view::npos) << read;
}

// A save that cannot read the manifest it would extend fails instead of committing one without
// the fallback (and removing the fallback's data file): the checkpoint on disk stays as it was.
TEST_F(MoeCheckpointTest, ASaveThatCannotReadTheManifestKeepsTheCheckpoint) {
  const JobSpec spec = TinyJob(1, 1);
  RankState at4(spec, 0, std::random_device{}()), at8(spec, 0, std::random_device{}());
  ASSERT_TRUE(at4.Write(dir_, 4).ok());
  const std::string manifest = MoeCheckpointManifestPath(dir_, 0);
  const std::string good = *ReadSmallFile(manifest, 1 << 20);
  Overwrite(manifest, 0, "{{");
  const absl::Status failed = at8.Write(dir_, 8);
  EXPECT_EQ(failed.code(), absl::StatusCode::kDataLoss) << failed;
  EXPECT_TRUE(IsJobError(failed)) << failed;  // restore would meet the same manifest
  EXPECT_TRUE(fs::exists(MoeCheckpointDataPath(dir_, 0, 4)));
  EXPECT_FALSE(fs::exists(MoeCheckpointDataPath(dir_, 0, 8)));
  std::ofstream(manifest, std::ios::trunc) << good;
  RankState read(spec, 0, 2);
  EXPECT_EQ(*read.Read(dir_), 4);
  EXPECT_TRUE(read == at4);
  ASSERT_TRUE(at8.Write(dir_, 8).ok());
  EXPECT_EQ(*MoeCheckpointSteps(dir_, at4.id), (std::vector<int64_t>{8, 4}));
}

// The manifest keeps the checkpoint before the newest ("previous"), readable by step, so that the
// job's ranks can all go back to it when one of them was killed before committing the newest.
TEST_F(MoeCheckpointTest, KeepsThePreviousCheckpointReadableByStep) {
  const JobSpec spec = TinyJob(1, 1);
  RankState at4(spec, 0, std::random_device{}()), at8(spec, 0, std::random_device{}()),
      at12(spec, 0, std::random_device{}());
  ASSERT_TRUE(at4.Write(dir_, 4).ok());
  EXPECT_EQ(*MoeCheckpointSteps(dir_, at4.id), (std::vector<int64_t>{4}));
  ASSERT_TRUE(at8.Write(dir_, 8).ok());
  EXPECT_EQ(*MoeCheckpointSteps(dir_, at4.id), (std::vector<int64_t>{8, 4}));
  absl::StatusOr<json::Value> manifest =
      json::Parse(*ReadSmallFile(MoeCheckpointManifestPath(dir_, 0), 1 << 20));
  ASSERT_TRUE(manifest.ok());
  ASSERT_NE(manifest->Find("previous"), nullptr);
  EXPECT_EQ(manifest->Find("previous")->Find("step")->text(), "4");

  RankState read(spec, 0, 0);
  EXPECT_EQ(*read.Read(dir_), 8);
  EXPECT_TRUE(read == at8);
  EXPECT_EQ(*ReadMoeCheckpoint(dir_, read.id, read.layout, read.Replicated(), read.Experts(), 4),
            4);
  EXPECT_TRUE(read == at4);
  EXPECT_EQ(ReadMoeCheckpoint(dir_, read.id, read.layout, read.Replicated(), read.Experts(), 6)
                .status()
                .code(),
            absl::StatusCode::kNotFound);

  ASSERT_TRUE(at12.Write(dir_, 12).ok());
  EXPECT_EQ(*MoeCheckpointSteps(dir_, at4.id), (std::vector<int64_t>{12, 8}));
  EXPECT_FALSE(fs::exists(MoeCheckpointDataPath(dir_, 0, 4)));
}

// A run resumed from the previous step writes the newer step again: the manifest first drops that
// step, so a crash while its data file is replaced leaves the older step committed and intact.
TEST_F(MoeCheckpointTest, RewritingAStepAfterResumingFromTheOneBeforeIt) {
  const JobSpec spec = TinyJob(1, 1);
  RankState at4(spec, 0, 41), at8(spec, 0, 81), again8(spec, 0, 82);
  ASSERT_TRUE(at4.Write(dir_, 4).ok());
  ASSERT_TRUE(at8.Write(dir_, 8).ok());
  // The data file's temp path cannot be created: the write fails after the manifest dropped 8.
  const std::string data8 = MoeCheckpointDataPath(dir_, 0, 8);
  fs::create_directory(AtomicFileWriter::TempPath(data8));
  EXPECT_FALSE(again8.Write(dir_, 8).ok());
  EXPECT_EQ(*MoeCheckpointSteps(dir_, at4.id), (std::vector<int64_t>{4}));
  RankState read(spec, 0, 0);
  EXPECT_EQ(*read.Read(dir_), 4);
  EXPECT_TRUE(read == at4);
  fs::remove(AtomicFileWriter::TempPath(data8));
  ASSERT_TRUE(again8.Write(dir_, 8).ok());
  EXPECT_EQ(*MoeCheckpointSteps(dir_, at4.id), (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(*read.Read(dir_), 8);
  EXPECT_TRUE(read == again8);
  // Back to a fresh start (step 0 agreed) and writing 4 again: nothing older is left to keep.
  ASSERT_TRUE(at4.Write(dir_, 4).ok());
  EXPECT_EQ(*MoeCheckpointSteps(dir_, at4.id), (std::vector<int64_t>{4}));
  EXPECT_FALSE(fs::exists(data8));
}

TEST_F(MoeCheckpointTest, RanksWriteTheSameDirectoryConcurrently) {
  const JobSpec spec = TinyJob(2, 2);
  std::vector<RankState> ranks;
  for (int r = 0; r < 4; ++r) ranks.emplace_back(spec, r, 10 + r);
  for (int round = 1; round <= 3; ++round) {
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r) {
      threads.emplace_back([&, r] { EXPECT_TRUE(ranks[r].Write(dir_, round).ok()); });
    }
    for (auto& t : threads) t.join();
  }
  for (int r = 0; r < 4; ++r) {
    RankState read(spec, r, 0);
    EXPECT_EQ(*read.Read(dir_), 3);
    EXPECT_TRUE(read == ranks[r]) << r;
  }
}

}  // namespace
}  // namespace dropless::engine
