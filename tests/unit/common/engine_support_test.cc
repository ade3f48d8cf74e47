// CheckEngineSupport: every spec field an engine cannot honour is refused at submit, with one
// message naming the field, for the cpu and the cuda backends; what they can run passes.
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "common/engine_config.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kCudaJob[] = R"(name: gpu-job
model: {hidden: 256, ffn: 128, experts: 16, topk: 2, shared_experts: 1, layers: 1}
parallel: {ep: 1, dp: 1}
precision: bf16
tokens_per_rank: 1024
steps: 10
dispatcher: auto
overlap: false
activation_offload: false
resources: {backend: cuda}
)";

std::string With(std::string yaml, const std::string& from, const std::string& to) {
  const std::string out = absl::StrReplaceAll(yaml, {{from, to}});
  EXPECT_NE(out, yaml) << "no line '" << from << "'";
  return out;
}

// A cpu job's Gloo groups connect every pair of ranks through the attempt's rendezvous keys: past
// 512 ranks they would not fit its 256 MiB, so such a spec is refused at submit, naming parallel.
TEST(EngineSupportTest, ACpuJobOfMoreRanksThanItsRendezvousHoldsIsRefused) {
  const std::string cpu =
      With(With(kCudaJob, "backend: cuda", "backend: cpu"), "experts: 16", "experts: 1024");
  const std::string at_limit = With(cpu, "ep: 1, dp: 1", "ep: 512, dp: 1");
  EXPECT_TRUE(ParseJobSpec(at_limit).ok()) << ParseJobSpec(at_limit).status();
  const absl::StatusOr<JobSpec> over = ParseJobSpec(With(cpu, "ep: 1, dp: 1", "ep: 256, dp: 4"));
  ASSERT_FALSE(over.ok());
  EXPECT_THAT(std::string(over.status().message()),
              StartsWith("parallel: ep x dp = 1024 ranks: the cpu engine runs at most 512"));
}

TEST(EngineSupportTest, RunnableSpecsPass) {
  EXPECT_TRUE(ParseJobSpec(kCudaJob).ok()) << ParseJobSpec(kCudaJob).status();
  const std::string mxfp8 = With(kCudaJob, "precision: bf16", "precision: mxfp8");
  EXPECT_TRUE(ParseJobSpec(mxfp8).ok()) << ParseJobSpec(mxfp8).status();
  // mxfp8 without an exchange needs hidden in multiples of 32 only (no scale rows travel).
  const std::string mxfp8_160 = With(mxfp8, "hidden: 256", "hidden: 160");
  EXPECT_TRUE(ParseJobSpec(mxfp8_160).ok()) << ParseJobSpec(mxfp8_160).status();
  const std::string fp8_block = With(kCudaJob, "precision: bf16", "precision: fp8-block");
  EXPECT_TRUE(ParseJobSpec(fp8_block).ok()) << ParseJobSpec(fp8_block).status();
  const std::string offload =
      With(With(kCudaJob, "activation_offload: false", "activation_offload: true"), "layers: 1}",
           "layers: 3}");
  EXPECT_TRUE(ParseJobSpec(offload).ok()) << ParseJobSpec(offload).status();
  const std::string cpu = With(With(kCudaJob, "backend: cuda", "backend: cpu"), "ep: 1", "ep: 2");
  EXPECT_TRUE(ParseJobSpec(cpu).ok()) << ParseJobSpec(cpu).status();
  // Expert parallelism on GPUs: nccl-lsa (or auto, which picks it) and nccl-a2a. nccl-ep, which
  // the engine does not drive, is refused at submit rather than failing every attempt.
  const std::string ep8 = With(kCudaJob, "ep: 1", "ep: 8");
  EXPECT_TRUE(ParseJobSpec(ep8).ok()) << ParseJobSpec(ep8).status();
  for (const char* dispatcher : {"nccl-lsa", "nccl-a2a"}) {
    const std::string ep = With(ep8, "dispatcher: auto", std::string("dispatcher: ") + dispatcher);
    EXPECT_TRUE(ParseJobSpec(ep).ok()) << dispatcher << ": " << ParseJobSpec(ep).status();
  }
  const absl::StatusOr<JobSpec> nccl_ep =
      ParseJobSpec(With(ep8, "dispatcher: auto", "dispatcher: nccl-ep"));
  ASSERT_FALSE(nccl_ep.ok());
  EXPECT_THAT(std::string(nccl_ep.status().message()), StartsWith("dispatcher: nccl-ep"));
  // Overlap: chunks of each rank's experts (2 per rank here) over nccl-lsa or auto.
  const std::string overlap = With(ep8, "overlap: false", "overlap: true");
  EXPECT_TRUE(ParseJobSpec(overlap).ok()) << ParseJobSpec(overlap).status();
  const std::string overlap_lsa = With(overlap, "dispatcher: auto", "dispatcher: nccl-lsa");
  EXPECT_TRUE(ParseJobSpec(overlap_lsa).ok()) << ParseJobSpec(overlap_lsa).status();
}

struct Refusal {
  const char* name;
  std::vector<std::pair<std::string, std::string>> edits;
  const char* field;
  const char* why;
};

TEST(EngineSupportTest, EachUnsupportedFieldIsRefusedNamingIt) {
  const std::vector<Refusal> cases = {
      {"cuda_ep_over_a_node", {{"ep: 1", "ep: 16"}}, "parallel.ep", "1 to 8 GPUs"},
      {"cuda_dp", {{"dp: 1", "dp: 2"}}, "parallel.dp", "got dp 2"},
      {"cuda_gloo", {{"dispatcher: auto", "dispatcher: gloo"}}, "dispatcher", "gloo moves host buffers"},
      {"cuda_overlap_at_ep1", {{"overlap: false", "overlap: true"}}, "overlap", "at parallel.ep 1 there is no exchange"},
      {"cuda_overlap_8_experts_over_8", {{"overlap: false", "overlap: true"}, {"ep: 1", "ep: 8"}, {"experts: 16", "experts: 8"}}, "overlap", "at least 2 per rank (model.experts 8 / parallel.ep 8)"},
      {"cuda_overlap_a2a", {{"overlap: false", "overlap: true"}, {"ep: 1", "ep: 2"}, {"dispatcher: auto", "dispatcher: nccl-a2a"}}, "overlap", "nccl-a2a cannot"},
      {"cuda_hidden", {{"hidden: 256", "hidden: 260"}}, "model.hidden", "multiple of 8"},
      {"cuda_experts", {{"experts: 16", "experts: 12"}}, "model.experts", "multiple of 8"},
      {"cpu_mxfp8", {{"backend: cuda", "backend: cpu"}, {"precision: bf16", "precision: mxfp8"}}, "precision", "needs resources.backend cuda"},
      {"cpu_fp8_block", {{"backend: cuda", "backend: cpu"}, {"precision: bf16", "precision: fp8-block"}}, "precision", "fp8-block needs resources.backend cuda"},
      {"cpu_overlap", {{"backend: cuda", "backend: cpu"}, {"overlap: false", "overlap: true"}}, "overlap", "Gloo exchange is blocking"},
      {"cpu_offload", {{"backend: cuda", "backend: cpu"}, {"activation_offload: false", "activation_offload: true"}}, "activation_offload", "needs resources.backend cuda"},
  };
  for (const Refusal& c : cases) {
    SCOPED_TRACE(c.name);
    std::string yaml = kCudaJob;
    for (const auto& [from, to] : c.edits) yaml = absl::StrReplaceAll(yaml, {{from, to}});
    absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml);
    ASSERT_FALSE(spec.ok());
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), StartsWith(std::string(c.field) + ": "));
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.why));
  }
}

TEST(EngineSupportTest, EnginesCheckTheSameRulesOnTheirConfig) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(kCudaJob);
  ASSERT_TRUE(spec.ok());
  EngineConfig config = EngineConfigFromSpec(*spec);
  EXPECT_TRUE(CheckEngineSupport(Backend::kCuda, config).ok());
  config.activation_offload =
      true;  // the cuda engine offloads (from 3 layers); the cpu engine refuses
  EXPECT_THAT(std::string(CheckEngineSupport(Backend::kCuda, config).message()),
              StartsWith("activation_offload: "));
  config.model.layers = 3;
  EXPECT_TRUE(CheckEngineSupport(Backend::kCuda, config).ok());
  EXPECT_THAT(std::string(CheckEngineSupport(Backend::kCpu, config).message()),
              StartsWith("activation_offload: "));
}

// The cpu engine's shape preconditions live here too, so a hand-built config (tests, benchmarks)
// is refused by the same function the spec validator runs, naming the field.
TEST(EngineSupportTest, CpuEngineRefusesShapesItCannotRun) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(kCudaJob);
  ASSERT_TRUE(spec.ok());
  EngineConfig config = EngineConfigFromSpec(*spec);
  config.precision = Precision::kBf16;
  config.dispatcher = Dispatcher::kAuto;
  config.overlap = config.activation_offload = false;
  ASSERT_TRUE(CheckEngineSupport(Backend::kCpu, config).ok());
  EngineConfig bad = config;
  bad.model.hidden = 0;
  EXPECT_THAT(std::string(CheckEngineSupport(Backend::kCpu, bad).message()), StartsWith("model: "));
  bad = config;
  bad.parallel.ep = 3;
  EXPECT_THAT(std::string(CheckEngineSupport(Backend::kCpu, bad).message()),
              StartsWith("parallel: "));
  bad = config;
  bad.tokens_per_rank = 0;
  EXPECT_THAT(std::string(CheckEngineSupport(Backend::kCpu, bad).message()),
              StartsWith("tokens_per_rank: "));
}

}  // namespace
}  // namespace dropless
