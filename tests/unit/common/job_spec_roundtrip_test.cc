// JobSpecToYaml is canonical: parsing it gives back exactly the spec (doubles bit for bit).
#include <random>
#include <string>

#include "common/job_spec.h"
#include "gtest/gtest.h"

namespace dropless {
namespace {

void ExpectSameSpec(const JobSpec& a, const JobSpec& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.priority, b.priority);
  EXPECT_EQ(a.max_attempts, b.max_attempts);
  EXPECT_EQ(a.time_limit_seconds, b.time_limit_seconds);
  EXPECT_EQ(a.model.hidden, b.model.hidden);
  EXPECT_EQ(a.model.ffn, b.model.ffn);
  EXPECT_EQ(a.model.experts, b.model.experts);
  EXPECT_EQ(a.model.topk, b.model.topk);
  EXPECT_EQ(a.model.shared_experts, b.model.shared_experts);
  EXPECT_EQ(a.model.layers, b.model.layers);
  EXPECT_EQ(a.model.router, b.model.router);
  EXPECT_EQ(a.model.renormalize, b.model.renormalize);
  EXPECT_EQ(a.model.activation, b.model.activation);
  EXPECT_EQ(a.model.aux_loss_coeff, b.model.aux_loss_coeff);
  EXPECT_EQ(a.parallel.ep, b.parallel.ep);
  EXPECT_EQ(a.parallel.dp, b.parallel.dp);
  EXPECT_EQ(a.precision, b.precision);
  EXPECT_EQ(a.tokens_per_rank, b.tokens_per_rank);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.optimizer.name, b.optimizer.name);
  EXPECT_EQ(a.optimizer.lr, b.optimizer.lr);
  EXPECT_EQ(a.optimizer.beta1, b.optimizer.beta1);
  EXPECT_EQ(a.optimizer.beta2, b.optimizer.beta2);
  EXPECT_EQ(a.optimizer.eps, b.optimizer.eps);
  EXPECT_EQ(a.optimizer.weight_decay, b.optimizer.weight_decay);
  EXPECT_EQ(a.optimizer.warmup_steps, b.optimizer.warmup_steps);
  EXPECT_EQ(a.optimizer.moment_dtype, b.optimizer.moment_dtype);
  EXPECT_EQ(a.dispatcher, b.dispatcher);
  EXPECT_EQ(a.overlap, b.overlap);
  EXPECT_EQ(a.activation_offload, b.activation_offload);
  EXPECT_EQ(a.checkpoint.dir, b.checkpoint.dir);
  EXPECT_EQ(a.checkpoint.every, b.checkpoint.every);
  EXPECT_EQ(a.data.distribution, b.data.distribution);
  EXPECT_EQ(a.data.zipf_exponent, b.data.zipf_exponent);
  EXPECT_EQ(a.data.seed, b.data.seed);
  EXPECT_EQ(a.resources.backend, b.resources.backend);
}

// A valid spec with every field drawn at random, doubles with full 53-bit mantissas.
JobSpec RandomSpec(std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto real = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  JobSpec s;
  s.name = "job-" + std::to_string(pick(0, 1'000'000));
  s.priority = static_cast<int32_t>(pick(-1000, 1000));
  s.max_attempts = static_cast<int32_t>(pick(1, 100));
  // Within what the chosen backend's engine runs (CheckEngineSupport; engine_support_test.cc
  // covers the refusals).
  const bool cuda = pick(0, 1);
  s.resources.backend = cuda ? Backend::kCuda : Backend::kCpu;
  s.precision = cuda && pick(0, 1) ? Precision::kMxfp8 : Precision::kBf16;
  s.model.hidden = 32 * pick(1, 64);
  s.model.ffn = 32 * pick(1, 64);
  s.parallel.ep = cuda ? 1 : int64_t{1} << pick(0, 3);
  s.parallel.dp = cuda ? 1 : pick(1, 4);
  s.model.experts = cuda ? 8 * pick(1, 16) : s.parallel.ep * pick(1, 16);
  s.model.topk = pick(1, std::min<int64_t>(16, s.model.experts));
  s.model.shared_experts = pick(0, 2);
  s.model.layers = pick(1, 4);
  s.model.router = pick(0, 1) ? RouterKind::kSigmoid : RouterKind::kSoftmax;
  s.model.renormalize = pick(0, 1);
  s.model.aux_loss_coeff = real(0, 0.1);
  s.tokens_per_rank = pick(1, 4096);
  s.steps = pick(1, 100000);
  s.optimizer.lr = real(1e-6, 1e-1);
  s.optimizer.beta1 = real(0, 0.999);
  s.optimizer.beta2 = real(0, 0.9999);
  s.optimizer.eps = real(1e-12, 1e-6);
  s.optimizer.weight_decay = real(0, 0.5);
  s.optimizer.warmup_steps = pick(0, 1000);
  s.optimizer.moment_dtype = pick(0, 1) ? MomentDtype::kBf16 : MomentDtype::kFp32;
  s.dispatcher = cuda ? Dispatcher::kAuto : static_cast<Dispatcher>(pick(0, 1));
  s.overlap = false;
  s.activation_offload = false;
  if (pick(0, 1)) {
    s.checkpoint.dir = "/tmp/ckpt dir/\"quoted\" \\ back/" + std::to_string(pick(0, 99));
    s.checkpoint.every = pick(0, 500);
  }
  s.data.distribution = pick(0, 1) ? RoutingDistribution::kZipf : RoutingDistribution::kUniform;
  // The exponent belongs to zipf routing; other distributions keep the default (the parser drops
  // it).
  if (s.data.distribution == RoutingDistribution::kZipf) s.data.zipf_exponent = real(0.01, 3);
  s.data.seed = std::uniform_int_distribution<uint64_t>()(rng);
  for (int64_t i = pick(0, 3); i > 0; --i) {
    s.labels[pick(0, 1) ? "team" + std::to_string(i) : "example.com/k" + std::to_string(i)] =
        pick(0, 1) ? "" : "v-" + std::to_string(pick(0, 1'000'000));
  }
  s.time_limit_seconds = pick(0, 1) ? 0 : pick(1, 366 * 24 * 3600);
  return s;
}

TEST(JobSpecRoundTripTest, RandomSpecsRoundTripExactly) {
  std::mt19937_64 rng(std::random_device{}());
  for (int i = 0; i < 500; ++i) {
    const JobSpec spec = RandomSpec(rng);
    const std::string yaml = JobSpecToYaml(spec);
    absl::StatusOr<JobSpec> back = ParseJobSpec(yaml);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
    ExpectSameSpec(spec, *back);
    EXPECT_EQ(JobSpecToYaml(*back), yaml);
  }
}

// Valid names that plain YAML would read as another type (null, a boolean, a number) come back as
// the same names: every rank parses the stored spec again.
TEST(JobSpecRoundTripTest, NamesThatLookLikeOtherTypesRoundTrip) {
  JobSpec s;
  s.model = {64, 128, 8, 2};
  s.tokens_per_rank = 1;
  s.steps = 1;
  for (const char* name : {"null", "true", "false", "no", "123", "1e5", "0x1f", "nan", "inf"}) {
    s.name = name;
    absl::StatusOr<JobSpec> back = ParseJobSpec(JobSpecToYaml(s));
    ASSERT_TRUE(back.ok()) << name << ": " << back.status() << "\n" << JobSpecToYaml(s);
    EXPECT_EQ(back->name, name);
  }
}

TEST(JobSpecRoundTripTest, AwkwardNumbersRoundTrip) {
  JobSpec s;
  s.name = "n";
  s.model = {64, 128, 8, 2};
  s.tokens_per_rank = 1;
  s.steps = 1;
  for (double lr : {1e-8, 0.1, 1.0 / 3.0, 2.2e-4, 5e-324 * 1e300, 10.0}) {
    s.optimizer.lr = lr;
    s.data.seed = UINT64_MAX;
    absl::StatusOr<JobSpec> back = ParseJobSpec(JobSpecToYaml(s));
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << JobSpecToYaml(s);
    EXPECT_EQ(back->optimizer.lr, lr);
    EXPECT_EQ(back->data.seed, UINT64_MAX);
  }
}

}  // namespace
}  // namespace dropless
