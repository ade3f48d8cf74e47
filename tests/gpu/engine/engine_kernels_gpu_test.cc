// The CUDA engine's own kernels against host references on fresh random data each run, outputs
// poisoned first: parameter fills and tokens against the CPU engine's generators, fused AdamW
// (with bf16 and transposed bf16 copies, vectorized and scalar paths, updates in separate launches) against cpu::AdamWUpdate over several steps, the sum,
// squared-error, transpose and bias kernels against plain loops.
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/kernels/gpu_test_util.h"
#include "tests/unit/kernels/test_data.h"
#include "worker/engine/cpu/adamw.h"
#include "worker/engine/cpu/moe_model.h"
#include "worker/engine/cpu/synthetic_task.h"
#include "worker/engine/cuda/engine_kernels.h"

namespace dropless::cuda_engine {
namespace {

using kernels::Bf16;
using kernels::Bf16ToFloat;
using kernels::FloatToBf16;
using kernels::testing::DeviceArray;
using kernels::testing::GpuTest;
using kernels::testing::RandomBf16;
using kernels::testing::RandomFloat;
using kernels::testing::Rng;

class EngineKernelsGpu : public GpuTest {};

TEST_F(EngineKernelsGpu, FillNormalDrawsTheCpuInitialization) {
  ModelSpec m;
  m.hidden = 96;
  m.ffn = 40;
  m.experts = 8;
  m.topk = 2;
  m.shared_experts = 2;
  m.layers = 2;
  const cpu::MoeParameterLayout layout(m, 2, 1, 16);
  const uint64_t seed = Rng()();
  std::vector<float> rep(layout.replicated_size()), exp(layout.experts_size());
  layout.Initialize(seed, rep.data(), exp.data());
  DeviceArray<float> d_rep(rep.size()), d_exp(exp.size());
  std::vector<DeviceNormalFill> fills;
  for (const auto& f : layout.InitialFills(seed)) {
    fills.push_back(DeviceNormalFill{f.buffer, f.offset, f.stream, f.count, f.scale});
  }
  STATUS_ASSERT(FillNormal(fills, d_rep.get(), d_exp.get(), nullptr));
  const std::vector<float> got_rep = d_rep.Download(), got_exp = d_exp.Download();
  for (size_t i = 0; i < rep.size(); ++i) ASSERT_NEAR(got_rep[i], rep[i], 1e-6f * (1 + std::fabs(rep[i]))) << i;
  for (size_t i = 0; i < exp.size(); ++i) ASSERT_NEAR(got_exp[i], exp[i], 1e-6f * (1 + std::fabs(exp[i]))) << i;
}

TEST_F(EngineKernelsGpu, GenerateTokensDrawsTheCpuTokens) {
  const int64_t hidden = 136, tokens = 77, first = 1000, step = 1 + Rng()() % 1000;
  const cpu::TokenGenerator gen(Rng()(), hidden);
  std::vector<float> want(tokens * hidden);
  gen.Generate<float>(step, first, tokens, want.data());
  DeviceArray<double> basis(gen.basis().size());
  basis.Upload(gen.basis());
  const int64_t counter = step - 1;
  DeviceArray<int64_t> d_counter(std::vector<int64_t>{counter});
  DeviceArray<Bf16> x(tokens * hidden);
  TokenSource src;
  src.seed = gen.seed();
  src.first_token = first;
  src.tokens = tokens;
  src.hidden = hidden;
  src.latent_rank = static_cast<int>(gen.latent_rank());
  src.basis = basis.get();
  src.step_counter = d_counter.get();
  STATUS_ASSERT(GenerateTokens(src, x.get(), nullptr));
  const std::vector<Bf16> got = x.Download();
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].bits, FloatToBf16(want[i]).bits) << i << ": " << want[i];
  }
}

TEST_F(EngineKernelsGpu, FusedAdamWMatchesTheCpuUpdateOverSteps) {
  OptimizerSpec o;
  o.lr = 3e-3;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  o.warmup_steps = 3;
  // A transposed copy (scalar loop); a tensor of many chunks ending off a multiple of four (its
  // last values in the scalar loop); a vectorized one ending on a partial chunk.
  const int64_t rows = 37, cols = 45, n2 = 70001, n3 = 3 * 16384 + 4 * 1000 + 3;
  std::vector<float> p1 = RandomFloat(rows * cols), p2 = RandomFloat(n2), p3 = RandomFloat(n3);
  std::vector<float> m3(n3, 0), v3(n3, 0);
  DeviceArray<float> dp3(p3), dm3(m3), dv3(v3), dg3(n3);
  DeviceArray<Bf16> copy3(n3);
  std::vector<float> m1(p1.size(), 0), v1(p1.size(), 0), m2(p2.size(), 0), v2(p2.size(), 0);
  DeviceArray<float> dp1(p1), dp2(p2), dm1(m1), dv1(v1), dm2(m2), dv2(v2);
  DeviceArray<float> dg1(p1.size()), dg2(p2.size());
  DeviceArray<Bf16> copy1(p1.size()), copy2(p2.size());
  DeviceArray<int64_t> counter(std::vector<int64_t>{0});
  AdamWTensor t1, t2;
  t1.param = dp1.get();
  t1.grad = dg1.get();
  t1.m = dm1.get();
  t1.v = dv1.get();
  t1.n = rows * cols;
  t1.bf16_copy = copy1.get();
  t1.copy_rows = rows;
  t1.copy_cols = cols;
  t2.param = dp2.get();
  t2.grad = dg2.get();
  t2.m = dm2.get();
  t2.v = dv2.get();
  t2.n = n2;
  t2.bf16_copy = copy2.get();
  AdamWTensor t3;
  t3.param = dp3.get();
  t3.grad = dg3.get();
  t3.m = dm3.get();
  t3.v = dv3.get();
  t3.n = n3;
  t3.bf16_copy = copy3.get();
  absl::StatusOr<std::unique_ptr<FusedAdamW>> adamw =
      FusedAdamW::Create(o, {t1, t2, t3}, counter.get());
  ASSERT_TRUE(adamw.ok()) << adamw.status();
  for (int step = 1; step <= 5; ++step) {
    const std::vector<float> g1 = RandomFloat(p1.size(), 1e-2f);
    const std::vector<float> g2 = RandomFloat(p2.size(), 1e-2f);
    const std::vector<float> g3 = RandomFloat(n3, 1e-2f);
    dg1.Upload(g1);
    dg2.Upload(g2);
    dg3.Upload(g3);
    // The two tensors in separate launches on alternate steps, as the engine's overlapped
    // optimizer updates them.
    if (step % 2 == 0) {
      STATUS_ASSERT((*adamw)->Step(nullptr));
    } else {
      STATUS_ASSERT((*adamw)->PrepareStep(nullptr));
      STATUS_ASSERT((*adamw)->Update(1, 2, nullptr));
      STATUS_ASSERT((*adamw)->Update(0, 1, nullptr));
    }
    cpu::AdamWUpdate<float>(o, step, static_cast<int64_t>(p1.size()), g1.data(), p1.data(), m1.data(), v1.data());
    cpu::AdamWUpdate<float>(o, step, static_cast<int64_t>(p2.size()), g2.data(), p2.data(), m2.data(), v2.data());
    cpu::AdamWUpdate<float>(o, step, n3, g3.data(), p3.data(), m3.data(), v3.data());
  }
  EXPECT_EQ(counter.Download()[0], 5);
  const std::vector<float> got1 = dp1.Download(), got2 = dp2.Download();
  for (size_t i = 0; i < p1.size(); ++i) ASSERT_NEAR(got1[i], p1[i], 2e-6f * (1 + std::fabs(p1[i]))) << i;
  for (size_t i = 0; i < p2.size(); ++i) ASSERT_NEAR(got2[i], p2[i], 2e-6f * (1 + std::fabs(p2[i]))) << i;
  const std::vector<Bf16> c1 = copy1.Download(), c2 = copy2.Download();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(c1[c * rows + r].bits, FloatToBf16(got1[r * cols + c]).bits) << r << "," << c;
    }
  }
  for (size_t i = 0; i < p2.size(); ++i) ASSERT_EQ(c2[i].bits, FloatToBf16(got2[i]).bits) << i;
  const std::vector<float> got3 = dp3.Download();
  const std::vector<Bf16> c3 = copy3.Download();
  for (int64_t i = 0; i < n3; ++i) {
    ASSERT_NEAR(got3[i], p3[i], 2e-6f * (1 + std::fabs(p3[i]))) << i;
    ASSERT_EQ(c3[i].bits, FloatToBf16(got3[i]).bits) << i;
  }
}

TEST_F(EngineKernelsGpu, SumSquaredErrorTransposeAndBias) {
  const int64_t n = 100003;
  const std::vector<Bf16> a = RandomBf16(n), b = RandomBf16(n), c = RandomBf16(n);
  DeviceArray<Bf16> da(a), db(b), dc(c), out(n);
  STATUS_ASSERT(SumBf16(n, {da.get(), db.get(), dc.get()}, out.get(), nullptr));
  const std::vector<Bf16> sum = out.Download();
  for (int64_t i = 0; i < n; ++i) {
    const float want = (Bf16ToFloat(a[i]) + Bf16ToFloat(b[i])) + Bf16ToFloat(c[i]);
    ASSERT_EQ(sum[i].bits, FloatToBf16(want).bits) << i;
  }
  // Unaligned pointers (one element in: the element-wise path) and out aliasing the first input.
  STATUS_ASSERT(SumBf16(n - 1, {da.get() + 1, db.get() + 1}, da.get() + 1, nullptr));
  const std::vector<Bf16> sum2 = da.Download();
  ASSERT_EQ(sum2[0].bits, a[0].bits);
  for (int64_t i = 1; i < n; ++i) {
    ASSERT_EQ(sum2[i].bits, FloatToBf16(Bf16ToFloat(a[i]) + Bf16ToFloat(b[i])).bits) << i;
  }
  da.Upload(a);

  DeviceArray<double> sq(std::vector<double>{0.0});
  DeviceArray<Bf16> grad(n);
  STATUS_ASSERT(SquaredErrorAndGrad(n, da.get(), db.get(), 0.5f, sq.get(), grad.get(), nullptr));
  double want_sq = 0;
  const std::vector<Bf16> g = grad.Download();
  for (int64_t i = 0; i < n; ++i) {
    const float diff = Bf16ToFloat(a[i]) - Bf16ToFloat(b[i]);
    want_sq += static_cast<double>(diff) * diff;
    ASSERT_EQ(g[i].bits, FloatToBf16(0.5f * diff).bits) << i;
  }
  EXPECT_NEAR(sq.Download()[0], want_sq, 1e-9 * want_sq);

  const int64_t batch = 3, rows = 70, cols = 33;
  const std::vector<float> m = RandomFloat(batch * rows * cols);
  DeviceArray<float> dm(m), dt(m.size());
  STATUS_ASSERT(Transpose(batch, rows, cols, dm.get(), dt.get(), nullptr));
  const std::vector<float> t = dt.Download();
  for (int64_t z = 0; z < batch; ++z) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t col = 0; col < cols; ++col) {
        ASSERT_EQ(t[z * rows * cols + col * rows + r], m[z * rows * cols + r * cols + col]);
      }
    }
  }
  const std::vector<float> bias = RandomFloat(cols);
  DeviceArray<float> dbias(bias);
  STATUS_ASSERT(AddRowBias(rows, cols, dbias.get(), dm.get(), nullptr));
  const std::vector<float> biased = dm.Download();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t col = 0; col < cols; ++col) {
      ASSERT_EQ(biased[r * cols + col], m[r * cols + col] + bias[col]);
    }
  }
}

}  // namespace
}  // namespace dropless::cuda_engine
