// The CPU engine end to end on in-process groups: the same loss curve whatever the ep/dp layout,
// learning, determinism, checkpoint resume, step statistics and bad contexts.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "worker/engine/checkpoint/moe_checkpoint.h"
#include "worker/engine/cpu/moe_model.h"
#include "worker/engine/engine.h"
#include "worker/transport/transport_factory.h"

namespace dropless {
namespace {

JobSpec TinySpec() {
  JobSpec spec;
  spec.name = "engine-test";
  spec.model.hidden = 16;
  spec.model.ffn = 24;
  spec.model.experts = 4;
  spec.model.topk = 2;
  spec.model.shared_experts = 1;
  spec.model.layers = 2;
  spec.model.router = RouterKind::kSoftmax;
  spec.model.renormalize = true;
  spec.model.aux_loss_coeff = 0.01;
  spec.tokens_per_rank = 32;
  spec.steps = 10;
  spec.optimizer.lr = 1e-2;
  spec.optimizer.warmup_steps = 2;
  spec.optimizer.weight_decay = 0.01;
  spec.data.seed = 1234;
  return spec;
}

enum class Transport { kLocal, kGloo };

// What the rank process does after each step: a checkpoint when the spec says one is due.
void SaveWhenDue(const JobSpec& spec, Engine* engine) {
  if (spec.checkpoint.DueAfter(engine->StepsDone(), spec.steps)) {
    ASSERT_TRUE(engine->SaveCheckpoint(spec.checkpoint.dir).ok());
  }
}

// Runs `steps` steps on ep*dp ranks (threads); result[rank][step].
std::vector<std::vector<StepStats>> RunJob(JobSpec spec, int ep, int dp, int steps,
                                           Transport transport = Transport::kLocal) {
  spec.parallel.ep = ep;
  spec.parallel.dp = dp;
  std::vector<RankGroups> groups;
  std::unique_ptr<KeyValueStore> store = NewMemoryKvStore();
  if (transport == Transport::kLocal) groups = CreateLocalGroups(ep, dp);
  groups.resize(ep * dp);
  std::vector<std::vector<StepStats>> stats(ep * dp);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ep * dp; ++rank) {
    threads.emplace_back([&, rank] {
      if (transport == Transport::kGloo) {
        GlooOptions options;
        options.layout = GroupLayout{rank, ep * dp, ep, dp};
        options.host = "127.0.0.1";
        options.connect_timeout = absl::Seconds(60);
        absl::StatusOr<RankGroups> gloo = CreateGlooGroups(options, store.get());
        ASSERT_TRUE(gloo.ok()) << gloo.status();
        groups[rank] = *std::move(gloo);
      }
      EngineContext ctx{EngineConfigFromSpec(spec), rank, ep * dp, &groups[rank]};
      absl::StatusOr<std::unique_ptr<Engine>> engine = CreateCpuEngine(ctx);
      ASSERT_TRUE(engine.ok()) << engine.status();
      for (int i = 0; i < steps; ++i) {
        absl::StatusOr<StepStats> step = (*engine)->Step();
        ASSERT_TRUE(step.ok()) << step.status();
        stats[rank].push_back(*step);
        SaveWhenDue(spec, engine->get());
      }
    });
  }
  for (auto& t : threads) t.join();
  return stats;
}

std::vector<double> Losses(const std::vector<StepStats>& steps) {
  std::vector<double> losses;
  for (const StepStats& s : steps) losses.push_back(s.loss);
  return losses;
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/dropless-engine-" + name + "-" +
                    std::to_string(getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

// With bf16 moments too: their rounding draws are keyed by each value's single-rank index.
class CpuEngineLayoutTest : public ::testing::TestWithParam<MomentDtype> {};

TEST_P(CpuEngineLayoutTest, LossCurveIsTheSameForEveryExpertAndDataParallelLayout) {
  constexpr int kSteps = 10;
  JobSpec one_rank = TinySpec();
  one_rank.optimizer.moment_dtype = GetParam();
  one_rank.tokens_per_rank = 64;
  const auto reference = RunJob(one_rank, 1, 1, kSteps);
  ASSERT_EQ(reference[0].size(), static_cast<size_t>(kSteps));

  JobSpec half = one_rank;
  half.tokens_per_rank = 32;
  for (auto [ep, dp] : {std::pair{2, 1}, std::pair{1, 2}}) {
    const auto run = RunJob(half, ep, dp, kSteps);
    for (int rank = 0; rank < ep * dp; ++rank) {
      ASSERT_EQ(run[rank].size(), static_cast<size_t>(kSteps));
      for (int i = 0; i < kSteps; ++i) {
        const double want = reference[0][i].loss;
        EXPECT_NEAR(run[rank][i].loss, want, 1e-4 * want)
            << "ep " << ep << " dp " << dp << " rank " << rank << " step " << i + 1;
        EXPECT_NEAR(run[rank][i].aux_loss, reference[0][i].aux_loss,
                    1e-4 * reference[0][i].aux_loss)
            << "ep " << ep << " dp " << dp << " rank " << rank << " step " << i + 1;
      }
    }
  }
  // The curve moved: equal curves of a frozen model would prove nothing.
  EXPECT_LT(reference[0][kSteps - 1].loss, 0.9 * reference[0][0].loss);
}

INSTANTIATE_TEST_SUITE_P(MomentDtypes, CpuEngineLayoutTest,
                         ::testing::Values(MomentDtype::kFp32, MomentDtype::kBf16),
                         [](const ::testing::TestParamInfo<MomentDtype>& info) {
                           return std::string(ToString(info.param));
                         });

TEST(CpuEngineTest, FourRanksOfTwoByTwoFollowTheSameCurve) {
  constexpr int kSteps = 6;
  JobSpec one_rank = TinySpec();
  one_rank.model.experts = 8;
  one_rank.tokens_per_rank = 64;
  const auto reference = RunJob(one_rank, 1, 1, kSteps);
  JobSpec quarter = one_rank;
  quarter.tokens_per_rank = 16;
  const auto run = RunJob(quarter, 2, 2, kSteps);
  for (int rank = 0; rank < 4; ++rank) {
    for (int i = 0; i < kSteps; ++i) {
      EXPECT_NEAR(run[rank][i].loss, reference[0][i].loss, 1e-4 * reference[0][i].loss)
          << "rank " << rank << " step " << i + 1;
    }
  }
}

TEST(CpuEngineTest, GlooTransportGivesTheSameCurveAsInProcessGroups) {
  constexpr int kSteps = 4;
  JobSpec spec = TinySpec();
  const auto local = RunJob(spec, 2, 2, kSteps, Transport::kLocal);
  const auto gloo = RunJob(spec, 2, 2, kSteps, Transport::kGloo);
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_EQ(gloo[rank].size(), static_cast<size_t>(kSteps));
    for (int i = 0; i < kSteps; ++i) {
      EXPECT_NEAR(gloo[rank][i].loss, local[rank][i].loss, 1e-5 * local[rank][i].loss)
          << "rank " << rank << " step " << i + 1;
    }
  }
}

TEST(CpuEngineTest, LossFallsOnTheShippedTinyJob) {
  // configs/jobs/tiny-cpu.yaml, the newcomer's first job: its loss must fall clearly.
  std::ifstream file(std::string(DROPLESS_JOB_CONFIGS_DIR) + "/tiny-cpu.yaml");
  ASSERT_TRUE(file.good());
  const std::string yaml((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const auto run = RunJob(*spec, static_cast<int>(spec->parallel.ep),
                          static_cast<int>(spec->parallel.dp), static_cast<int>(spec->steps));
  const std::vector<double> losses = Losses(run[0]);
  ASSERT_EQ(losses.size(), static_cast<size_t>(spec->steps));
  for (double loss : losses) ASSERT_TRUE(std::isfinite(loss));
  EXPECT_LT(losses.back(), losses.front() / 4)
      << "first " << losses.front() << " last " << losses.back();
}

TEST(CpuEngineTest, TwoRunsGiveIdenticalLosses) {
  JobSpec spec = TinySpec();
  spec.data.distribution = RoutingDistribution::kZipf;
  spec.model.router = RouterKind::kSigmoid;
  const auto first = RunJob(spec, 2, 1, 5);
  const auto second = RunJob(spec, 2, 1, 5);
  EXPECT_EQ(Losses(first[0]), Losses(second[0]));
  EXPECT_EQ(Losses(first[1]), Losses(second[1]));
  spec.data.seed = 99;
  const auto other_seed = RunJob(spec, 2, 1, 1);
  EXPECT_NE(other_seed[0][0].loss, first[0][0].loss);
}

// Resumes the ep x 1 job `spec` from its checkpoint dir (which must hold step `from`) and runs it
// to spec.steps; the losses of the resumed steps are checked against `uninterrupted`.
void ExpectResumedCurve(const JobSpec& spec, int ep, int64_t from,
                        const std::vector<std::vector<StepStats>>& uninterrupted) {
  std::vector<RankGroups> groups = CreateLocalGroups(ep, 1);
  std::vector<std::vector<double>> resumed(ep);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ep; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<Engine>> engine =
          CreateCpuEngine(EngineContext{EngineConfigFromSpec(spec), rank, ep, &groups[rank]});
      ASSERT_TRUE(engine.ok()) << engine.status();
      EXPECT_EQ((*engine)->StepsDone(), from);
      while ((*engine)->StepsDone() < spec.steps) {
        absl::StatusOr<StepStats> step = (*engine)->Step();
        ASSERT_TRUE(step.ok()) << step.status();
        EXPECT_EQ(step->step, (*engine)->StepsDone());
        resumed[rank].push_back(step->loss);
        SaveWhenDue(spec, engine->get());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < ep; ++rank) {
    ASSERT_EQ(resumed[rank].size(), static_cast<size_t>(spec.steps - from));
    for (size_t i = 0; i < resumed[rank].size(); ++i) {
      EXPECT_EQ(resumed[rank][i], uninterrupted[rank][from + i].loss) << "step " << from + i + 1;
    }
  }
}

TEST(CpuEngineTest, ResumeFromCheckpointContinuesTheSameCurve) {
  // With bf16 moments too: the files hold them as F32, which keeps their bf16 values exactly.
  std::vector<double> fp32_losses;
  for (MomentDtype moment_dtype : {MomentDtype::kFp32, MomentDtype::kBf16}) {
    SCOPED_TRACE(std::string("moment_dtype ") + std::string(ToString(moment_dtype)));
    JobSpec spec = TinySpec();
    spec.steps = 8;
    spec.optimizer.moment_dtype = moment_dtype;
    const auto uninterrupted = RunJob(spec, 2, 1, spec.steps);
    if (moment_dtype == MomentDtype::kFp32) {
      fp32_losses = Losses(uninterrupted[0]);
    } else {
      // The engine honours the field: step 1's update uses the moments before rounding, so the
      // curves part only at step 3's loss (after step 2's update, the first to read them).
      const std::vector<double> losses = Losses(uninterrupted[0]);
      EXPECT_EQ(losses[1], fp32_losses[1]);
      EXPECT_NE(losses.back(), fp32_losses.back());
    }

    spec.checkpoint.dir = TempDir(std::string("resume-") + std::string(ToString(moment_dtype)));
    spec.checkpoint.every = 4;
    RunJob(spec, 2, 1, 5);  // checkpoint at 4; step 5 is lost
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(
          std::filesystem::exists(engine::MoeCheckpointManifestPath(spec.checkpoint.dir, rank)));
      ASSERT_TRUE(
          std::filesystem::exists(engine::MoeCheckpointDataPath(spec.checkpoint.dir, rank, 4)));
    }
    spec.parallel.ep = 2;
    ExpectResumedCurve(spec, 2, 4, uninterrupted);
    // The last step (spec.steps) always writes a checkpoint.
    std::filesystem::remove_all(spec.checkpoint.dir);
  }
}

// Rank 1 is killed while writing step 8's checkpoint, after rank 0 committed its own: the ranks
// hold {8, 4} and {4}. Both resume from 4 (rank 0 kept it as its previous checkpoint) on the
// uninterrupted curve, write 8 again, and a later restart resumes both from the end.
TEST(CpuEngineTest, ARankKilledWhileCheckpointingSendsEveryRankBackToTheStepAllHold) {
  JobSpec spec = TinySpec();
  spec.steps = 10;
  spec.parallel.ep = 2;
  const auto uninterrupted = RunJob(spec, 2, 1, spec.steps);
  spec.checkpoint.dir = TempDir("cut-short");
  spec.checkpoint.every = 4;
  RunJob(spec, 2, 1, 5);  // both ranks commit 4
  const std::string manifest1 = engine::MoeCheckpointManifestPath(spec.checkpoint.dir, 1);
  const std::string saved = manifest1 + ".at-4";
  std::filesystem::copy_file(manifest1, saved);
  RunJob(spec, 2, 1, 4);                      // resumed at 4, both ranks commit 8
  std::filesystem::rename(saved, manifest1);  // rank 1's commit of 8 never happened
  ASSERT_TRUE(std::filesystem::exists(engine::MoeCheckpointDataPath(spec.checkpoint.dir, 0, 4)));
  ExpectResumedCurve(spec, 2, 4, uninterrupted);
  ExpectResumedCurve(spec, 2, spec.steps, uninterrupted);
  std::filesystem::remove_all(spec.checkpoint.dir);
}

// What another engine (the CUDA engine) does: read a checkpoint into its own buffers through the
// shared API and write one; the CPU engine resumes from it on the same curve.
TEST(CpuEngineTest, ResumesFromACheckpointWrittenThroughTheSharedApi) {
  JobSpec spec = TinySpec();
  spec.steps = 6;
  spec.parallel.ep = 2;
  const auto uninterrupted = RunJob(spec, 2, 1, spec.steps);
  spec.checkpoint.dir = TempDir("shared-api-source");
  spec.checkpoint.every = 3;
  RunJob(spec, 2, 1, 3);

  const std::string source = spec.checkpoint.dir;
  spec.checkpoint.dir = TempDir("shared-api");
  for (int rank = 0; rank < 2; ++rank) {
    const cpu::MoeParameterLayout layout(spec.model, 2, rank, spec.tokens_per_rank);
    std::vector<float> buffers[6];
    for (int i = 0; i < 6; ++i) {
      buffers[i].resize(i < 3 ? layout.replicated_size() : layout.experts_size());
    }
    const engine::MoeOptimizerBuffers replicated{
        absl::MakeSpan(buffers[0]), absl::MakeSpan(buffers[1]), absl::MakeSpan(buffers[2])};
    const engine::MoeOptimizerBuffers experts{
        absl::MakeSpan(buffers[3]), absl::MakeSpan(buffers[4]), absl::MakeSpan(buffers[5])};
    const engine::MoeCheckpointIdentity id = engine::MoeCheckpointIdentityOf(EngineConfigFromSpec(spec), rank);
    absl::StatusOr<int64_t> step =
        engine::ReadMoeCheckpoint(source, id, layout, replicated, experts);
    ASSERT_TRUE(step.ok()) << step.status();
    ASSERT_EQ(*step, 3);
    ASSERT_TRUE(
        engine::WriteMoeCheckpoint(spec.checkpoint.dir, id, 3, layout, replicated, experts).ok());
  }
  ExpectResumedCurve(spec, 2, 3, uninterrupted);
  std::filesystem::remove_all(source);
  std::filesystem::remove_all(spec.checkpoint.dir);
}

TEST(CpuEngineTest, DamagedOrForeignCheckpointIsRefused) {
  JobSpec spec = TinySpec();
  spec.checkpoint.dir = TempDir("damaged");
  spec.steps = 2;
  RunJob(spec, 1, 1, 2);
  const std::string path = engine::MoeCheckpointDataPath(spec.checkpoint.dir, 0, 2);
  ASSERT_TRUE(std::filesystem::exists(path));

  std::vector<RankGroups> groups = CreateLocalGroups(1, 1);
  JobSpec other_shape = spec;
  other_shape.model.hidden = 32;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      CreateCpuEngine(EngineContext{EngineConfigFromSpec(other_shape), 0, 1, &groups[0]});
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument) << engine.status();
  EXPECT_NE(engine.status().message().find("hidden is 16 there, 32 here"), absl::string_view::npos)
      << engine.status();

  {  // flip a byte in the payload
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-100, std::ios::end);
    file.put('\x5a');
  }
  engine = CreateCpuEngine(EngineContext{EngineConfigFromSpec(spec), 0, 1, &groups[0]});
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kDataLoss) << engine.status();
  std::filesystem::resize_file(path, 40);
  engine = CreateCpuEngine(EngineContext{EngineConfigFromSpec(spec), 0, 1, &groups[0]});
  EXPECT_FALSE(engine.ok());
  std::filesystem::remove_all(spec.checkpoint.dir);
}

TEST(CpuEngineTest, StepStatsDescribeTheStep) {
  JobSpec spec = TinySpec();
  const auto run = RunJob(spec, 2, 1, 2);
  const JobSpec& s = spec;
  const double t = s.tokens_per_rank, h = s.model.hidden, f = s.model.ffn;
  const double expected_flops =
      s.model.layers * (18 * t * s.model.topk * h * f + 6 * t * h * s.model.experts +
                        18 * t * h * f * s.model.shared_experts);
  for (int rank = 0; rank < 2; ++rank) {
    for (int i = 0; i < 2; ++i) {
      const StepStats& st = run[rank][i];
      EXPECT_EQ(st.step, i + 1);
      EXPECT_EQ(st.tokens, s.tokens_per_rank);
      EXPECT_DOUBLE_EQ(st.flops, expected_flops);
      EXPECT_GT(st.loss, 0);
      EXPECT_GT(st.aux_loss, 0.5);  // E * sum f P is 1 when balanced, larger when not
      EXPECT_GE(st.load_imbalance, 1.0);
      EXPECT_LE(st.load_imbalance, static_cast<double>(s.model.experts));
      EXPECT_GT(st.step_seconds, 0);
      EXPECT_GT(st.gemm_forward_seconds, 0);
      EXPECT_GT(st.gemm_dgrad_seconds, 0);
      EXPECT_GT(st.gemm_wgrad_seconds, 0);
      EXPECT_DOUBLE_EQ(st.gemm_seconds,
                       st.gemm_forward_seconds + st.gemm_dgrad_seconds + st.gemm_wgrad_seconds);
      EXPECT_GT(st.dispatch_seconds, 0);
      EXPECT_GT(st.combine_seconds, 0);
      EXPECT_LE(st.gemm_seconds + st.dispatch_seconds + st.combine_seconds, st.step_seconds);
      EXPECT_GT(st.device_memory_bytes, 4 * 4 * 3 * h * f);  // at least weights + moments
      // Tokens per expert over the EP group and the layers: every (token, choice) of the group.
      ASSERT_EQ(st.expert_tokens.size(), static_cast<size_t>(s.model.experts));
      int64_t routed = 0;
      for (int64_t tokens : st.expert_tokens) routed += tokens;
      EXPECT_EQ(routed, s.tokens_per_rank * 2 * s.model.topk * s.model.layers);
      EXPECT_EQ(st.expert_tokens, run[0][i].expert_tokens);
      // Each phase sends this rank's rows one way and the rows its experts got the other way.
      EXPECT_GE(st.dispatch_bytes, s.model.layers * s.tokens_per_rank * s.model.topk * h * 4);
      EXPECT_EQ(st.combine_bytes, st.dispatch_bytes);
    }
    // Over the group, every routed row goes out and comes back once per phase and layer.
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(run[0][i].dispatch_bytes + run[1][i].dispatch_bytes,
                s.model.layers * 2 * (s.tokens_per_rank * 2 * s.model.topk) * h * 4);
    }
    // Both ranks report the job's loss and the EP group's imbalance.
    EXPECT_EQ(run[rank][0].loss, run[0][0].loss);
    EXPECT_EQ(run[rank][0].load_imbalance, run[0][0].load_imbalance);
  }
}

TEST(CpuEngineTest, PeakFlopsIsNominalUnlessOverridden) {
  JobSpec spec = TinySpec();
  std::vector<RankGroups> groups = CreateLocalGroups(1, 1);
  unsetenv("DROPLESS_CPU_PEAK_FLOPS");
  auto engine = CreateCpuEngine(EngineContext{EngineConfigFromSpec(spec), 0, 1, &groups[0]});
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_DOUBLE_EQ((*engine)->PeakFlops(), 96e9);
  setenv("DROPLESS_CPU_PEAK_FLOPS", "2.5e11", 1);
  engine = CreateCpuEngine(EngineContext{EngineConfigFromSpec(spec), 0, 1, &groups[0]});
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_DOUBLE_EQ((*engine)->PeakFlops(), 2.5e11);
  setenv("DROPLESS_CPU_PEAK_FLOPS", "fast", 1);
  engine = CreateCpuEngine(EngineContext{EngineConfigFromSpec(spec), 0, 1, &groups[0]});
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("DROPLESS_CPU_PEAK_FLOPS"), std::string::npos);
  unsetenv("DROPLESS_CPU_PEAK_FLOPS");
}

TEST(CpuEngineTest, ContextThatDoesNotMatchTheGroupsIsRefused) {
  JobSpec spec = TinySpec();
  spec.parallel.ep = 2;
  std::vector<RankGroups> groups = CreateLocalGroups(1, 1);  // one rank, but the spec wants two
  auto engine = CreateCpuEngine(EngineContext{EngineConfigFromSpec(spec), 0, 2, &groups[0]});
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  engine = CreateCpuEngine(EngineContext{EngineConfigFromSpec(spec), 0, 2, nullptr});
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  spec.parallel.ep = 1;
  spec.model.experts = 3;
  spec.parallel.ep = 2;
  engine = CreateCpuEngine(EngineContext{EngineConfigFromSpec(spec), 0, 2, &groups[0]});
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dropless
