// The CUDA engine's own kernels against host references on fresh random data each run, outputs
// poisoned first: parameter fills and tokens against the CPU engine's generators, fused AdamW
// (with bf16 and transposed bf16 copies, vectorized and scalar paths, updates in separate
// launches, fp32 and bf16 moments, fp32 and bf16 gradients) against cpu::AdamWUpdate over several
// steps, the sum, squared-error, transpose and bias kernels against plain loops.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "dropless/kernels/fp8_block.h"
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

// The optimizer's moment_dtype.
class EngineKernelsMomentsGpu : public GpuTest,
                                public ::testing::WithParamInterface<MomentDtype> {};

// A tensor's AdamW moments on the device, zeroed, in the dtype asked for.
class DeviceMoments {
 public:
  DeviceMoments(int64_t n, MomentDtype dtype)
      : bf16_(dtype == MomentDtype::kBf16),
        m_(static_cast<size_t>(n) * (bf16_ ? 2 : 4), 0),
        v_(static_cast<size_t>(n) * (bf16_ ? 2 : 4), 0) {}  // zeroed
  kernels::AdamWMoments get() const { return kernels::AdamWMoments{m_.get(), v_.get(), bf16_}; }
  // The moments widened to fp32.
  std::vector<float> DownloadM() const { return Widen(m_.Download()); }
  std::vector<float> DownloadV() const { return Widen(v_.Download()); }

 private:
  std::vector<float> Widen(const std::vector<uint8_t>& raw) const {
    std::vector<float> out(raw.size() / (bf16_ ? 2 : 4));
    for (size_t i = 0; i < out.size(); ++i) {
      if (bf16_) {
        Bf16 b;
        std::memcpy(&b, raw.data() + 2 * i, 2);
        out[i] = Bf16ToFloat(b);
      } else {
        std::memcpy(&out[i], raw.data() + 4 * i, 4);
      }
    }
    return out;
  }
  bool bf16_;
  DeviceArray<uint8_t> m_, v_;
};

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

// The AdamW settings of the tests below: a short warmup, decay, moments of `dtype`.
OptimizerSpec TestOptimizer(MomentDtype dtype) {
  OptimizerSpec o;
  o.moment_dtype = dtype;
  o.lr = 3e-3;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  o.warmup_steps = 3;
  return o;
}

TEST_P(EngineKernelsMomentsGpu, FusedAdamWMatchesTheCpuUpdateOverSteps) {
  const OptimizerSpec o = TestOptimizer(GetParam());
  // A transposed copy (scalar loop); a tensor of many chunks ending off a multiple of four (its
  // last values in the scalar loop); a vectorized one ending on a partial chunk.
  const int64_t rows = 37, cols = 45, n2 = 70001, n3 = 3 * 16384 + 4 * 1000 + 3;
  std::vector<float> p1 = RandomFloat(rows * cols), p2 = RandomFloat(n2), p3 = RandomFloat(n3);
  std::vector<float> m3(n3, 0), v3(n3, 0);
  DeviceArray<float> dp3(p3), dg3(n3);
  DeviceMoments dmv3(n3, o.moment_dtype);
  DeviceArray<Bf16> copy3(n3);
  std::vector<float> m1(p1.size(), 0), v1(p1.size(), 0), m2(p2.size(), 0), v2(p2.size(), 0);
  DeviceArray<float> dp1(p1), dp2(p2);
  DeviceMoments dmv1(rows * cols, o.moment_dtype), dmv2(n2, o.moment_dtype);
  DeviceArray<float> dg1(p1.size()), dg2(p2.size());
  DeviceArray<Bf16> copy1(p1.size()), copy2(p2.size());
  DeviceArray<int64_t> counter(std::vector<int64_t>{0});
  AdamWTensor t1, t2;
  t1.param = dp1.get();
  t1.grad = dg1.get();
  t1.moments = dmv1.get();
  t1.n = rows * cols;
  t1.bf16_copy = copy1.get();
  t1.copy_rows = rows;
  t1.copy_cols = cols;
  t2.param = dp2.get();
  t2.grad = dg2.get();
  t2.moments = dmv2.get();
  t2.n = n2;
  t2.bf16_copy = copy2.get();
  AdamWTensor t3;
  t3.param = dp3.get();
  t3.grad = dg3.get();
  // Placed across 2^32 in the experts' stream (bf16 moments draw their rounding from the place):
  // the vector group at element 10004 holds indices 2^32 - 1 .. 2^32 + 2.
  constexpr int64_t kFirst3 = (int64_t{1} << 32) - 10005;
  t3.moments = dmv3.get();
  t3.moments.stream = cpu::kExpertMoments;
  t3.moments.first = kFirst3;
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
    cpu::AdamWUpdate<float>(o, step, n3, g3.data(), p3.data(), m3.data(), v3.data(),
                            cpu::kExpertMoments, kFirst3);
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
  // The moments: the CPU's bits (bf16: rounded stochastically after each step).
  ASSERT_TRUE(kernels::testing::BitEqual(dmv1.DownloadM(), m1));
  ASSERT_TRUE(kernels::testing::BitEqual(dmv1.DownloadV(), v1));
  ASSERT_TRUE(kernels::testing::BitEqual(dmv2.DownloadM(), m2));
  ASSERT_TRUE(kernels::testing::BitEqual(dmv2.DownloadV(), v2));
  ASSERT_TRUE(kernels::testing::BitEqual(dmv3.DownloadM(), m3));
  ASSERT_TRUE(kernels::testing::BitEqual(dmv3.DownloadV(), v3));
  if (o.moment_dtype == MomentDtype::kBf16) {
    for (size_t i = 0; i < m2.size(); ++i) {
      ASSERT_EQ(Bf16ToFloat(FloatToBf16(m2[i])), m2[i]) << "not a bf16 value at " << i;
    }
  }
}

// AdamW fused with the fp8-block weight quantization against the two passes it replaces (Update
// with a bf16 copy, then QuantizeFp8BlockWeights of the copy): the same master, moment and
// quantized bits over several steps, in both scale modes, and the quantized weight against the
// CPU reference of the updated masters.
TEST_P(EngineKernelsMomentsGpu, FusedAdamWFp8BlockMatchesUpdateThenQuantize) {
  OptimizerSpec o;
  o.moment_dtype = GetParam();
  o.lr = 1e-2;
  o.beta1 = 0.9;
  o.beta2 = 0.99;
  o.eps = 1e-8;
  o.weight_decay = 0.05;
  const int experts = 3;
  const int64_t k = 256, n = 384, size = experts * k * n, blocks = size / (128 * 128);
  for (const kernels::Fp8ScaleMode mode :
       {kernels::Fp8ScaleMode::kFloat32, kernels::Fp8ScaleMode::kPowerOfTwo}) {
    const kernels::Fp8BlockWeightShape shape{experts, k, n, mode};
    const std::vector<float> p0 = RandomFloat(size);
    // Path 0: Update then QuantizeFp8BlockWeights; path 1: UpdateFp8Block.
    DeviceArray<float> p[2] = {DeviceArray<float>(p0), DeviceArray<float>(p0)};
    DeviceMoments mv[2] = {DeviceMoments(size, o.moment_dtype),
                           DeviceMoments(size, o.moment_dtype)};
    DeviceArray<float> g(size);
    DeviceArray<Bf16> copy(size);
    DeviceArray<uint8_t> data[2] = {DeviceArray<uint8_t>(size), DeviceArray<uint8_t>(size)};
    DeviceArray<uint8_t> data_t[2] = {DeviceArray<uint8_t>(size), DeviceArray<uint8_t>(size)};
    DeviceArray<float> scales[2] = {DeviceArray<float>(blocks), DeviceArray<float>(blocks)};
    DeviceArray<float> scales_t[2] = {DeviceArray<float>(blocks), DeviceArray<float>(blocks)};
    DeviceArray<int64_t> counter0(std::vector<int64_t>{0}), counter1(std::vector<int64_t>{0});
    std::unique_ptr<FusedAdamW> adamw[2];
    kernels::Fp8BlockWeights out[2];
    for (int i = 0; i < 2; ++i) {
      AdamWTensor t;
      t.param = p[i].get();
      t.grad = g.get();
      t.moments = mv[i].get();
      t.moments.stream = cpu::kExpertMoments;  // as the engine's routed experts, far in
      t.moments.first = 3'000'000'001;
      t.n = size;
      t.bf16_copy = i == 0 ? copy.get() : nullptr;
      absl::StatusOr<std::unique_ptr<FusedAdamW>> a =
          FusedAdamW::Create(o, {t}, i == 0 ? counter0.get() : counter1.get());
      ASSERT_TRUE(a.ok()) << a.status();
      adamw[i] = *std::move(a);
      out[i] = kernels::Fp8BlockWeights{data[i].get(), scales[i].get(), data_t[i].get(),
                                        scales_t[i].get()};
    }
    // The CPU engine's update of the same elements.
    std::vector<float> cpu_p = p0, cpu_m(size, 0.0f), cpu_v(size, 0.0f);
    for (int step = 1; step <= 3; ++step) {
      const std::vector<float> grad = RandomFloat(size, 1e-2f);
      g.Upload(grad);
      cpu::AdamWUpdate<float>(o, step, size, grad.data(), cpu_p.data(), cpu_m.data(), cpu_v.data(),
                              cpu::kExpertMoments, 3'000'000'001);
      STATUS_ASSERT(adamw[0]->Step(nullptr));
      STATUS_ASSERT(kernels::cuda::QuantizeFp8BlockWeights(shape, copy.get(), out[0], nullptr));
      STATUS_ASSERT(adamw[1]->PrepareStep(nullptr));
      STATUS_ASSERT(adamw[1]->UpdateFp8Block(0, shape, out[1], nullptr));
    }
    ASSERT_TRUE(kernels::testing::BitEqual(p[1].Download(), p[0].Download()));
    ASSERT_TRUE(kernels::testing::BitEqual(mv[1].DownloadM(), mv[0].DownloadM()));
    ASSERT_TRUE(kernels::testing::BitEqual(mv[1].DownloadV(), mv[0].DownloadV()));
    ASSERT_TRUE(kernels::testing::BitEqual(mv[1].DownloadM(), cpu_m));
    ASSERT_TRUE(kernels::testing::BitEqual(mv[1].DownloadV(), cpu_v));
    const std::vector<float> gpu_p = p[1].Download();
    for (int64_t i = 0; i < size; ++i) {
      ASSERT_NEAR(gpu_p[i], cpu_p[i], 2e-6f * (1 + std::fabs(cpu_p[i]))) << i;
    }
    ASSERT_TRUE(kernels::testing::BitEqual(data[1].Download(), data[0].Download()));
    ASSERT_TRUE(kernels::testing::BitEqual(data_t[1].Download(), data_t[0].Download()));
    ASSERT_TRUE(kernels::testing::BitEqual(scales[1].Download(), scales[0].Download()));
    ASSERT_TRUE(kernels::testing::BitEqual(scales_t[1].Download(), scales_t[0].Download()));
    // The CPU quantization of the updated masters' bf16 values.
    const std::vector<float> updated = p[1].Download();
    std::vector<Bf16> w(size);
    for (int64_t i = 0; i < size; ++i) w[i] = FloatToBf16(updated[i]);
    std::vector<uint8_t> want(size), want_t(size);
    std::vector<float> want_s(blocks), want_st(blocks);
    STATUS_ASSERT(kernels::cpu::QuantizeFp8BlockWeights(
        shape, w.data(),
        kernels::Fp8BlockWeights{want.data(), want_s.data(), want_t.data(), want_st.data()}));
    ASSERT_TRUE(kernels::testing::BitEqual(data[1].Download(), want));
    ASSERT_TRUE(kernels::testing::BitEqual(data_t[1].Download(), want_t));
    ASSERT_TRUE(kernels::testing::BitEqual(scales[1].Download(), want_s));
  }
  // Refusals: a tensor index out of range, a shape that is not the tensor's.
  DeviceArray<float> a(128 * 128), b(128 * 128);
  DeviceMoments cd(128 * 128, o.moment_dtype);
  DeviceArray<int64_t> counter(std::vector<int64_t>{0});
  AdamWTensor t;
  t.param = a.get();
  t.grad = b.get();
  t.moments = cd.get();
  t.n = 128 * 128;
  // Moments of the other dtype than the optimizer's are refused.
  AdamWTensor other = t;
  other.moments.bf16 = !other.moments.bf16;
  EXPECT_FALSE(FusedAdamW::Create(o, {other}, counter.get()).ok());
  absl::StatusOr<std::unique_ptr<FusedAdamW>> one = FusedAdamW::Create(o, {t}, counter.get());
  ASSERT_TRUE(one.ok());
  DeviceArray<uint8_t> q(2 * 128 * 128);
  DeviceArray<float> qs(2);
  const kernels::Fp8BlockWeights qo{q.get(), qs.get(), nullptr, nullptr};
  EXPECT_FALSE((*one)->UpdateFp8Block(1, kernels::Fp8BlockWeightShape{1, 128, 128}, qo, nullptr).ok());
  EXPECT_FALSE((*one)->UpdateFp8Block(0, kernels::Fp8BlockWeightShape{2, 128, 128}, qo, nullptr).ok());
}

// AdamW reading bf16 gradients (the routed experts' with DROPLESS_BF16_EXPERT_GRAD) against the
// CPU update fed the same bf16 values: a vectorized tensor of several chunks ending off a multiple
// of four; scalar loops for a gradient 2 bytes off the vector loads' alignment and for a
// transposed copy; an fp32-gradient tensor in the same launches.
TEST_P(EngineKernelsMomentsGpu, FusedAdamWReadsBf16Gradients) {
  const OptimizerSpec o = TestOptimizer(GetParam());
  const int64_t rows = 37, cols = 45;
  // One tensor: the CPU reference's state and the device's (param and copy poisoned until set).
  struct Tensor {
    Tensor(int64_t n, MomentDtype dtype, bool bf16_grad, int64_t grad_offset)
        : p(RandomFloat(n)),
          m(n, 0),
          v(n, 0),
          dp(p),
          dmv(n, dtype),
          dg(bf16_grad ? 0 : n),
          dg_bf16(bf16_grad ? grad_offset + n : 0),
          copy(n) {}
    std::vector<float> p, m, v;
    DeviceArray<float> dp;
    DeviceMoments dmv;
    DeviceArray<float> dg;
    DeviceArray<Bf16> dg_bf16;
    DeviceArray<Bf16> copy;
  };
  struct Case {
    int64_t n, grad_offset, copy_rows;
    bool bf16_grad;
  };
  const Case cases[] = {{2 * 16384 + 4 * 100 + 3, 0, 0, true},
                        {5001, 1, 0, true},
                        {rows * cols, 0, rows, true},
                        {4099, 0, 0, false}};
  std::vector<std::unique_ptr<Tensor>> host;
  std::vector<AdamWTensor> tensors;
  for (const Case& c : cases) {
    host.push_back(std::make_unique<Tensor>(c.n, o.moment_dtype, c.bf16_grad, c.grad_offset));
    Tensor& h = *host.back();
    AdamWTensor t;
    t.param = h.dp.get();
    if (c.bf16_grad) {
      t.grad_bf16 = h.dg_bf16.get() + c.grad_offset;
    } else {
      t.grad = h.dg.get();
    }
    t.moments = h.dmv.get();
    t.moments.stream = cpu::kExpertMoments;
    t.moments.first = int64_t{1'000'000} * static_cast<int64_t>(tensors.size());
    t.n = c.n;
    t.bf16_copy = h.copy.get();
    t.copy_rows = c.copy_rows;
    t.copy_cols = c.copy_rows > 0 ? cols : 0;
    tensors.push_back(t);
  }
  DeviceArray<int64_t> counter(std::vector<int64_t>{0});
  absl::StatusOr<std::unique_ptr<FusedAdamW>> adamw = FusedAdamW::Create(o, tensors, counter.get());
  ASSERT_TRUE(adamw.ok()) << adamw.status();
  for (int step = 1; step <= 4; ++step) {
    for (size_t i = 0; i < host.size(); ++i) {
      const Case& c = cases[i];
      Tensor& h = *host[i];
      std::vector<float> g(c.n);
      if (c.bf16_grad) {
        const std::vector<Bf16> b = RandomBf16(c.grad_offset + c.n, 1e-2f);
        for (int64_t j = 0; j < c.n; ++j) g[j] = Bf16ToFloat(b[c.grad_offset + j]);
        h.dg_bf16.Upload(b);
      } else {
        g = RandomFloat(c.n, 1e-2f);
        h.dg.Upload(g);
      }
      cpu::AdamWUpdate<float>(o, step, c.n, g.data(), h.p.data(), h.m.data(), h.v.data(),
                              cpu::kExpertMoments, tensors[i].moments.first);
    }
    // One launch on odd steps, one per tensor (last first) on even ones.
    STATUS_ASSERT((*adamw)->PrepareStep(nullptr));
    if (step % 2 == 1) {
      STATUS_ASSERT((*adamw)->Update(0, static_cast<int>(host.size()), nullptr));
    } else {
      for (int t = static_cast<int>(host.size()) - 1; t >= 0; --t) {
        STATUS_ASSERT((*adamw)->Update(t, 1, nullptr));
      }
    }
  }
  for (size_t i = 0; i < host.size(); ++i) {
    const Case& c = cases[i];
    const Tensor& h = *host[i];
    const std::vector<float> got = h.dp.Download();
    const std::vector<Bf16> copy = h.copy.Download();
    for (int64_t j = 0; j < c.n; ++j) {
      ASSERT_NEAR(got[j], h.p[j], 2e-6f * (1 + std::fabs(h.p[j]))) << "tensor " << i << ", " << j;
      const int64_t at = c.copy_rows > 0 ? j % cols * c.copy_rows + j / cols : j;
      ASSERT_EQ(copy[at].bits, FloatToBf16(got[j]).bits) << "tensor " << i << ", " << j;
    }
    ASSERT_TRUE(kernels::testing::BitEqual(h.dmv.DownloadM(), h.m)) << "tensor " << i;
    ASSERT_TRUE(kernels::testing::BitEqual(h.dmv.DownloadV(), h.v)) << "tensor " << i;
  }
  // Refused: both gradients or neither; the fp8-block update of a bf16-gradient tensor.
  AdamWTensor both = tensors[0], neither = tensors[0];
  both.grad = host[3]->dg.get();
  neither.grad_bf16 = nullptr;
  EXPECT_FALSE(FusedAdamW::Create(o, {both}, counter.get()).ok());
  EXPECT_FALSE(FusedAdamW::Create(o, {neither}, counter.get()).ok());
  AdamWTensor block = tensors[0];
  block.n = 128 * 128;
  absl::StatusOr<std::unique_ptr<FusedAdamW>> one = FusedAdamW::Create(o, {block}, counter.get());
  ASSERT_TRUE(one.ok()) << one.status();
  DeviceArray<uint8_t> q(128 * 128);
  DeviceArray<float> qs(1);
  const kernels::Fp8BlockWeights qo{q.get(), qs.get(), q.get(), qs.get()};
  EXPECT_FALSE(
      (*one)->UpdateFp8Block(0, kernels::Fp8BlockWeightShape{1, 128, 128}, qo, nullptr).ok());
}

INSTANTIATE_TEST_SUITE_P(MomentDtypes, EngineKernelsMomentsGpu,
                         ::testing::Values(MomentDtype::kFp32, MomentDtype::kBf16),
                         [](const ::testing::TestParamInfo<MomentDtype>& info) {
                           return info.param == MomentDtype::kBf16 ? "bf16_moments"
                                                                   : "fp32_moments";
                         });

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
  // Every input count the kernel is instantiated for, vector path, out aliasing the first input.
  {
    std::vector<std::vector<Bf16>> host;
    std::vector<std::unique_ptr<DeviceArray<Bf16>>> device;
    for (int j = 0; j < kMaxSumInputs; ++j) host.push_back(RandomBf16(n));
    for (int j = 0; j < kMaxSumInputs; ++j) {
      device.push_back(std::make_unique<DeviceArray<Bf16>>(host[j]));
    }
    for (int count = 1; count <= kMaxSumInputs; ++count) {
      device[0]->Upload(host[0]);
      std::vector<const Bf16*> in;
      for (int j = 0; j < count; ++j) in.push_back(device[j]->get());
      STATUS_ASSERT(SumBf16(n, in, device[0]->get(), nullptr));
      const std::vector<Bf16> got = device[0]->Download();
      for (int64_t i = 0; i < n; ++i) {
        float want = 0;
        for (int j = 0; j < count; ++j) want += Bf16ToFloat(host[j][i]);
        ASSERT_EQ(got[i].bits, FloatToBf16(want).bits) << count << " inputs, element " << i;
      }
    }
  }

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
