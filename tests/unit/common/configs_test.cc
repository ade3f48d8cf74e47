// Every shipped job config in configs/jobs/ parses, validates and round-trips.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/job_spec.h"
#include "gtest/gtest.h"

namespace dropless {
namespace {

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ShippedConfigsTest, EveryConfigParsesAndRoundTrips) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(DROPLESS_JOB_CONFIGS_DIR)) {
    if (entry.path().extension() != ".yaml") continue;
    ++count;
    SCOPED_TRACE(entry.path().string());
    absl::StatusOr<JobSpec> spec = ParseJobSpec(ReadFile(entry.path()));
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->name, entry.path().stem().string()) << "file name and job name differ";
    absl::StatusOr<JobSpec> back = ParseJobSpec(JobSpecToYaml(*spec));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(JobSpecToYaml(*back), JobSpecToYaml(*spec));
  }
  EXPECT_GE(count, 4);
}

absl::StatusOr<JobSpec> Load(const std::string& name) {
  return ParseJobSpec(ReadFile(std::filesystem::path(DROPLESS_JOB_CONFIGS_DIR) / (name + ".yaml")));
}

TEST(ShippedConfigsTest, ModelShapesAreTheNamedModels) {
  absl::StatusOr<JobSpec> tiny = Load("tiny-cpu");
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ(tiny->resources.backend, Backend::kCpu);
  EXPECT_EQ(tiny->world_size(), 2);

  absl::StatusOr<JobSpec> dsv3 = Load("dsv3-layer");
  ASSERT_TRUE(dsv3.ok()) << dsv3.status();
  EXPECT_EQ(dsv3->model.hidden, 7168);
  EXPECT_EQ(dsv3->model.ffn, 2048);
  EXPECT_EQ(dsv3->model.experts, 32);  // one GPU's share at EP=8
  EXPECT_EQ(dsv3->model.topk, 8);
  EXPECT_EQ(dsv3->model.router, RouterKind::kSigmoid);
  EXPECT_EQ(dsv3->model.shared_experts, 1);
  EXPECT_EQ(dsv3->precision, Precision::kMxfp8);
  EXPECT_EQ(dsv3->resources.backend, Backend::kCuda);
  EXPECT_EQ(dsv3->optimizer.moment_dtype, MomentDtype::kBf16);  // as DeepSeek-V3 trained

  absl::StatusOr<JobSpec> qwen = Load("qwen3-30b-a3b-layer");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->model.hidden, 2048);
  EXPECT_EQ(qwen->model.ffn, 768);
  EXPECT_EQ(qwen->model.experts, 128);
  EXPECT_EQ(qwen->model.topk, 8);

  absl::StatusOr<JobSpec> mixtral = Load("mixtral-8x7b-layer");
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_EQ(mixtral->model.hidden, 4096);
  EXPECT_EQ(mixtral->model.ffn, 14336);
  EXPECT_EQ(mixtral->model.experts, 8);
  EXPECT_EQ(mixtral->model.topk, 2);
  EXPECT_EQ(mixtral->precision, Precision::kBf16);
}

// The step benchmark's dsv3 layer as a job (bench/step_bench.cc's kStepShapes and ConfigOf), so
// that a worker's /metrics compare one to one with `dropless-bench step --shapes=dsv3`.
TEST(ShippedConfigsTest, TheBenchJobIsTheStepBenchmarksDsv3Layer) {
  absl::StatusOr<JobSpec> job = Load("dsv3-layer-bench");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->model.hidden, 7168);
  EXPECT_EQ(job->model.ffn, 2048);
  EXPECT_EQ(job->model.experts, 32);
  EXPECT_EQ(job->model.topk, 8);
  EXPECT_EQ(job->model.shared_experts, 0);
  EXPECT_EQ(job->model.layers, 1);
  EXPECT_EQ(job->model.router, RouterKind::kSoftmax);
  EXPECT_TRUE(job->model.renormalize);  // ModelSpec's default, which ConfigOf keeps
  EXPECT_EQ(job->model.aux_loss_coeff, 0.01);
  EXPECT_EQ(job->tokens_per_rank, 8192);
  EXPECT_EQ(job->world_size(), 1);
  EXPECT_EQ(job->precision, Precision::kBf16);
  EXPECT_EQ(job->resources.backend, Backend::kCuda);
}

// The whole dsv3 layer over eight GPUs with the exchange overlapped: a spec the validator accepts
// for the cuda engine (overlap needs ep > 1, 2+ experts per rank and nccl-lsa or auto).
TEST(ShippedConfigsTest, TheOverlapJobIsTheWholeDsv3LayerOverEightGpus) {
  absl::StatusOr<JobSpec> job = Load("dsv3-layer-ep8-overlap");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->model.experts, 256);
  EXPECT_EQ(job->parallel.ep, 8);
  EXPECT_EQ(job->world_size(), 8);
  EXPECT_TRUE(job->overlap);
  EXPECT_EQ(job->dispatcher, Dispatcher::kNcclLsa);
  EXPECT_EQ(job->precision, Precision::kFp8Block);
  EXPECT_EQ(job->resources.backend, Backend::kCuda);
}

}  // namespace
}  // namespace dropless
