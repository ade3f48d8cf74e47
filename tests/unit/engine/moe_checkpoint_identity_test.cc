// The routing function is part of a checkpoint's identity: a job with another router or
// renormalization computes another function, and must not resume from it silently. Checkpoints
// written before the files recorded it still resume.
#include <string>
#include <vector>

#include "common/job_error.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/moe_checkpoint_test_util.h"
#include "worker/engine/checkpoint/file_io.h"
#include "worker/engine/checkpoint/json.h"
#include "worker/engine/checkpoint/moe_checkpoint.h"
#include "worker/engine/checkpoint/safetensors.h"

namespace dropless::engine {
namespace {

using checkpoint_testing::CraftDataFile;
using checkpoint_testing::EditManifest;
using checkpoint_testing::RankState;
using checkpoint_testing::ReadText;
using checkpoint_testing::TinyJob;

class MoeCheckpointIdentityTest : public checkpoint_testing::CheckpointDirTest {};

JobSpec SigmoidJob() {
  JobSpec spec = TinyJob(1, 1);
  spec.model.router = RouterKind::kSigmoid;
  spec.model.renormalize = false;
  return spec;
}

TEST_F(MoeCheckpointIdentityTest, TheRoutingFunctionRoundTripsThroughBothFiles) {
  RankState written(SigmoidJob(), 0, 7);
  EXPECT_EQ(written.id.router, RouterKind::kSigmoid);
  EXPECT_FALSE(written.id.renormalize);
  ASSERT_TRUE(written.Write(dir_, 3).ok());
  RankState read(SigmoidJob(), 0, 0);
  absl::StatusOr<int64_t> step = read.Read(dir_);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 3);
  EXPECT_TRUE(read == written);

  absl::StatusOr<json::Value> manifest = json::Parse(ReadText(MoeCheckpointManifestPath(dir_, 0)));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  const json::Value* identity = manifest->Find("identity");
  ASSERT_NE(identity, nullptr);
  ASSERT_NE(identity->Find("router"), nullptr);
  EXPECT_TRUE(identity->Find("router")->is_string());
  EXPECT_EQ(identity->Find("router")->text(), "sigmoid");
  ASSERT_NE(identity->Find("renormalize"), nullptr);
  EXPECT_EQ(identity->Find("renormalize")->kind(), json::Value::Kind::kBool);
  EXPECT_FALSE(identity->Find("renormalize")->boolean());
  absl::StatusOr<SafetensorsReader> data =
      SafetensorsReader::Open(MoeCheckpointDataPath(dir_, 0, 3));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->header().metadata.at("router"), "sigmoid");
  EXPECT_EQ(data->header().metadata.at("renormalize"), "false");

  // The defaults (softmax, renormalized) too; and the identities differ.
  RankState softmax(TinyJob(1, 1), 0, 8);
  EXPECT_NE(softmax.id, written.id);
  ASSERT_TRUE(softmax.Write(dir_ + "/softmax", 4).ok());
  RankState again(TinyJob(1, 1), 0, 0);
  EXPECT_EQ(*again.Read(dir_ + "/softmax"), 4);
  EXPECT_TRUE(again == softmax);
}

TEST_F(MoeCheckpointIdentityTest, AnotherRouterIsRefusedNamingTheField) {
  RankState softmax(TinyJob(1, 1), 0, 1);
  ASSERT_TRUE(softmax.Write(dir_, 5).ok());
  JobSpec sigmoid = TinyJob(1, 1);
  sigmoid.model.router = RouterKind::kSigmoid;
  const absl::Status refused = RankState(sigmoid, 0, 2).Read(dir_).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(IsJobError(refused)) << refused;
  EXPECT_NE(refused.message().find("model.router is \"softmax\" there, \"sigmoid\" here"),
            absl::string_view::npos)
      << refused;
  EXPECT_EQ(refused.message().find("renormalize"), absl::string_view::npos) << refused;
  // The step agreement reads the manifests first, and refuses it the same way.
  const absl::Status steps = MoeCheckpointSteps(dir_, RankState(sigmoid, 0, 2).id).status();
  EXPECT_EQ(steps.code(), absl::StatusCode::kInvalidArgument) << steps;
  EXPECT_TRUE(IsJobError(steps)) << steps;

  JobSpec raw = TinyJob(1, 1);
  raw.model.renormalize = false;
  const absl::Status unnormalized = RankState(raw, 0, 2).Read(dir_).status();
  EXPECT_EQ(unnormalized.code(), absl::StatusCode::kInvalidArgument) << unnormalized;
  EXPECT_NE(unnormalized.message().find("model.renormalize is true there, false here"),
            absl::string_view::npos)
      << unnormalized;
}

// A checkpoint written before this change: no router or renormalize in the manifest's identity
// nor in the data file's metadata.
void MakeOldFormat(const std::string& dir, int64_t step) {
  CraftDataFile(dir, step, [](std::vector<SafetensorsTensorRef>*, SafetensorsMetadata* metadata) {
    metadata->erase("router");
    metadata->erase("renormalize");
  });
  EditManifest(dir, 0, ", \"router\": \"[a-z]+\", \"renormalize\": (true|false)", "");
}

TEST_F(MoeCheckpointIdentityTest, ACheckpointFromBeforeTheRouterWasRecordedStillResumes) {
  RankState old(TinyJob(1, 1), 0, 3);
  ASSERT_TRUE(old.Write(dir_, 4).ok());
  MakeOldFormat(dir_, 4);
  const std::string manifest = ReadText(MoeCheckpointManifestPath(dir_, 0));
  ASSERT_EQ(manifest.find("router"), std::string::npos) << manifest;
  ASSERT_EQ(manifest.find("renormalize"), std::string::npos) << manifest;
  // What it was trained with is unknown: accepted, whatever this job's routing function.
  for (const JobSpec& spec : {TinyJob(1, 1), SigmoidJob()}) {
    RankState read(spec, 0, 0);
    absl::StatusOr<int64_t> step = read.Read(dir_);
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(*step, 4);
    EXPECT_TRUE(read == old);
  }
  // The next save records it, and keeps the old-format checkpoint as the previous one, still
  // readable.
  RankState next(TinyJob(1, 1), 0, 4);
  ASSERT_TRUE(next.Write(dir_, 8).ok());
  EXPECT_EQ(*MoeCheckpointSteps(dir_, next.id), (std::vector<int64_t>{8, 4}));
  RankState read(TinyJob(1, 1), 0, 0);
  EXPECT_EQ(*ReadMoeCheckpoint(dir_, read.id, read.layout, read.Replicated(), read.Experts(), 4),
            4);
  EXPECT_TRUE(read == old);
  EXPECT_EQ(RankState(SigmoidJob(), 0, 0).Read(dir_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(MoeCheckpointIdentityTest, ARecordedRoutingFunctionOfTheWrongKindIsDamage) {
  RankState state(TinyJob(1, 1), 0, 1);
  ASSERT_TRUE(state.Write(dir_, 2).ok());
  EditManifest(dir_, 0, "\"router\": \"softmax\"", "\"router\": 1");
  absl::Status s = state.Read(dir_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(IsJobError(s)) << s;
  EditManifest(dir_, 0, "\"router\": 1", "\"router\": \"softmax\"");
  ASSERT_TRUE(state.Read(dir_).ok());
  // The data file's metadata must agree with the manifest's identity when it records it.
  CraftDataFile(dir_, 2, [](std::vector<SafetensorsTensorRef>*, SafetensorsMetadata* metadata) {
    (*metadata)["router"] = "sigmoid";
  });
  s = state.Read(dir_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("metadata router is \"sigmoid\", expected \"softmax\""),
            absl::string_view::npos)
      << s;
}

}  // namespace
}  // namespace dropless::engine
