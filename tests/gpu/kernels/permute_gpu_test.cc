// Permute / unpermute and SwiGLU CUDA kernels against the CPU references, and the whole forward
// chain captured in a CUDA graph (no host synchronization anywhere).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "dropless/kernels/dispatch_plan.h"
#include "dropless/kernels/permute.h"
#include "dropless/kernels/routing.h"
#include "dropless/kernels/swiglu.h"
#include "tests/gpu/kernels/gpu_test_util.h"
#include "tests/unit/kernels/test_data.h"

namespace dropless::kernels {
namespace {

using testing::BitEqual;
using testing::DeviceArray;
using testing::Poisoned;
using testing::RandomBf16;
using testing::RandomBf16WideRange;
using testing::RandomFloat;
using testing::Rng;

class PermuteGpu : public testing::GpuTest {};

// A slot map as a dispatch plan makes it (a permutation of the T*k slots), with a few dropped
// choices (-1) whose slots then stay unwritten.
std::vector<int32_t> RandomSlots(int64_t tokens, int top_k, int dropped) {
  std::vector<int32_t> slots(tokens * top_k);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), Rng());
  for (int i = 0; i < dropped && i < static_cast<int>(slots.size()); ++i) slots[i * 7 % slots.size()] = -1;
  return slots;
}

struct PermuteCase {
  int64_t tokens, hidden;
  int top_k;
};
// Hidden sizes past 8192 take several passes per token in PermuteMxfp8; 8320 and 8800 give scale
// rows that are not a multiple of 16 bytes (4-byte and 1-byte scale stores).
const PermuteCase kPermuteCases[] = {{1, 32, 1},     {517, 136, 3},  {4099, 2048, 8},
                                     {333, 7168, 8}, {77, 256, 16}, {1023, 4096, 2},
                                     {129, 16384, 4}, {65, 8320, 3}, {31, 8800, 5}};

TEST_F(PermuteGpu, PermuteAndMxfp8MatchReference) {
  for (const PermuteCase& c : kPermuteCases) {
    SCOPED_TRACE(::testing::Message() << "T=" << c.tokens << " H=" << c.hidden << " k=" << c.top_k);
    const PermuteShape shape{c.tokens, c.hidden, c.top_k};
    const int64_t rows = c.tokens * c.top_k;
    const std::vector<Bf16> x = RandomBf16WideRange(c.tokens * c.hidden);
    const std::vector<int32_t> slots = RandomSlots(c.tokens, c.top_k, 3);
    DeviceArray<Bf16> d_x(x), d_rows(rows * c.hidden);
    DeviceArray<int32_t> d_slots(slots);
    STATUS_ASSERT(cuda::Permute(shape, d_x.get(), d_slots.get(), d_rows.get(), nullptr));
    auto want = Poisoned<Bf16>(rows * c.hidden);
    STATUS_ASSERT(cpu::Permute(shape, x.data(), slots.data(), want.data()));
    EXPECT_TRUE(BitEqual(d_rows.Download(), want));

    if (c.hidden % 32 != 0) continue;
    DeviceArray<uint8_t> d_data(rows * c.hidden), d_scales(rows * c.hidden / 32);
    STATUS_ASSERT(cuda::PermuteMxfp8(shape, d_x.get(), d_slots.get(), {d_data.get(), d_scales.get()},
                                     nullptr));
    auto data = Poisoned<uint8_t>(rows * c.hidden), scales = Poisoned<uint8_t>(rows * c.hidden / 32);
    STATUS_ASSERT(cpu::PermuteMxfp8(shape, x.data(), slots.data(), {data.data(), scales.data()}));
    EXPECT_TRUE(BitEqual(d_data.Download(), data));
    EXPECT_TRUE(BitEqual(d_scales.Download(), scales));
  }
}

TEST_F(PermuteGpu, CombineAndBackwardsMatchReference) {
  for (const PermuteCase& c : kPermuteCases) {
    SCOPED_TRACE(::testing::Message() << "T=" << c.tokens << " H=" << c.hidden << " k=" << c.top_k);
    const PermuteShape shape{c.tokens, c.hidden, c.top_k};
    const int64_t rows = c.tokens * c.top_k;
    const std::vector<Bf16> expert_out = RandomBf16(rows * c.hidden);
    const std::vector<Bf16> d_y = RandomBf16(c.tokens * c.hidden);
    const std::vector<float> weights = RandomFloat(rows);
    const std::vector<int32_t> slots = RandomSlots(c.tokens, c.top_k, 2);
    DeviceArray<Bf16> d_expert_out(expert_out), d_dy(d_y);
    DeviceArray<Bf16> d_combined(c.tokens * c.hidden), d_dx(c.tokens * c.hidden);
    DeviceArray<Bf16> d_drows(rows * c.hidden);
    DeviceArray<float> d_weights(weights), d_dweights(rows, 0xFF);
    DeviceArray<int32_t> d_slots(slots);
    STATUS_ASSERT(cuda::UnpermuteCombine(shape, d_expert_out.get(), d_slots.get(), d_weights.get(),
                                         d_combined.get(), nullptr));
    STATUS_ASSERT(cuda::PermuteBackward(shape, d_expert_out.get(), d_slots.get(), d_dx.get(), nullptr));
    STATUS_ASSERT(cuda::UnpermuteCombineBackward(shape, d_dy.get(), d_expert_out.get(),
                                                 d_slots.get(), d_weights.get(), d_drows.get(),
                                                 d_dweights.get(), nullptr));
    auto combined = Poisoned<Bf16>(c.tokens * c.hidden), dx = Poisoned<Bf16>(c.tokens * c.hidden);
    auto drows = Poisoned<Bf16>(rows * c.hidden);
    std::vector<float> dweights(rows);
    STATUS_ASSERT(cpu::UnpermuteCombine(shape, expert_out.data(), slots.data(), weights.data(),
                                        combined.data()));
    STATUS_ASSERT(cpu::PermuteBackward(shape, expert_out.data(), slots.data(), dx.data()));
    STATUS_ASSERT(cpu::UnpermuteCombineBackward(shape, d_y.data(), expert_out.data(), slots.data(),
                                                weights.data(), drows.data(), dweights.data()));
    // Same fp32 FMA order and one bf16 rounding: bit for bit.
    EXPECT_TRUE(BitEqual(d_combined.Download(), combined));
    EXPECT_TRUE(BitEqual(d_dx.Download(), dx));
    EXPECT_TRUE(BitEqual(d_drows.Download(), drows));
    // d_weights: H-term dot products in another order; the error bound scales with sum |terms|.
    const std::vector<float> got = d_dweights.Download();
    for (int64_t i = 0; i < rows; ++i) {
      double magnitude = 0;
      const int64_t t = i / c.top_k;
      if (slots[i] >= 0) {
        for (int64_t h = 0; h < c.hidden; ++h) {
          magnitude += std::fabs(double(Bf16ToFloat(d_y[t * c.hidden + h])) *
                                 Bf16ToFloat(expert_out[slots[i] * c.hidden + h]));
        }
      }
      ASSERT_NEAR(got[i], dweights[i], 1e-5 * magnitude + 1e-30) << "choice " << i;
    }
  }
}

// Difference in bf16 units of the larger magnitude.
double UlpDiff(Bf16 a, Bf16 b) {
  const double x = Bf16ToFloat(a), y = Bf16ToFloat(b);
  if (x == y) return 0;
  int e;
  std::frexp(std::max(std::fabs(x), std::fabs(y)), &e);
  return std::fabs(x - y) / std::ldexp(1.0, e - 8);
}

TEST_F(PermuteGpu, SwigluMatchesReference) {
  // Wide rows (4608, 14336) stream in row segments, the others in chunks of whole rows.
  for (auto [rows, ffn] : {std::pair<int64_t, int64_t>{1, 32}, {1531, 96}, {4099, 768},
                           {2048, 2048}, {37, 4608}, {9, 14336}}) {
    SCOPED_TRACE(::testing::Message() << rows << " x 2*" << ffn);
    const SwigluShape shape{rows, ffn};
    const int32_t live = static_cast<int32_t>(rows - rows / 5);  // tail rows stay untouched
    const std::vector<Bf16> h = RandomBf16(rows * 2 * ffn, 3.0f);
    const std::vector<Bf16> d_out = RandomBf16(rows * ffn);
    DeviceArray<Bf16> d_h(h), d_dout(d_out), d_out_bf16(rows * ffn), d_dh(rows * 2 * ffn);
    DeviceArray<int32_t> d_live(std::vector<int32_t>{live});
    DeviceArray<uint8_t> d_mx(rows * ffn), d_mx_scales(rows * ffn / 32);
    DeviceArray<uint8_t> d_mx_only(rows * ffn), d_mx_only_scales(rows * ffn / 32);
    MxRowwise mx{d_mx.get(), d_mx_scales.get()}, mx_only{d_mx_only.get(), d_mx_only_scales.get()};
    STATUS_ASSERT(cuda::SwigluForward(shape, d_live.get(), d_h.get(), d_out_bf16.get(), &mx, nullptr));
    STATUS_ASSERT(cuda::SwigluForward(shape, d_live.get(), d_h.get(), nullptr, &mx_only, nullptr));
    STATUS_ASSERT(cuda::SwigluBackward(shape, d_live.get(), d_h.get(), d_dout.get(), d_dh.get(), nullptr));
    auto out = Poisoned<Bf16>(rows * ffn), dh = Poisoned<Bf16>(rows * 2 * ffn);
    STATUS_ASSERT(cpu::SwigluForward(shape, &live, h.data(), out.data(), nullptr));
    STATUS_ASSERT(cpu::SwigluBackward(shape, &live, h.data(), d_out.data(), dh.data()));
    // bf16 outputs: fp32 math with the device's expf (2 ulp) against the host's: at most one bf16
    // ulp apart, and untouched rows keep their poison.
    const std::vector<Bf16> got_out = d_out_bf16.Download(), got_dh = d_dh.Download();
    size_t differ = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      if (i >= static_cast<size_t>(live) * ffn) {
        ASSERT_EQ(got_out[i].bits, out[i].bits) << "row past num_rows written";
        continue;
      }
      ASSERT_LE(UlpDiff(got_out[i], out[i]), 1.0) << "out element " << i;
      differ += got_out[i].bits != out[i].bits;
    }
    for (size_t i = 0; i < dh.size(); ++i) {
      if (i >= static_cast<size_t>(live) * 2 * ffn) {
        ASSERT_EQ(got_dh[i].bits, dh[i].bits) << "row past num_rows written";
        continue;
      }
      // d_gate = dy * u * s * (1 + g (1 - s)) cancels near g = -1.28: a few-ulp difference in s
      // (device expf) moves it by up to |dy u s| (1 + |g|) 2^-20 in absolute terms.
      const int64_t r = i / (2 * ffn), col = i % (2 * ffn);
      const bool is_gate = col < ffn;
      const double g = Bf16ToFloat(h[r * 2 * ffn + col % ffn]);
      const double u = Bf16ToFloat(h[r * 2 * ffn + ffn + col % ffn]);
      const double dy = Bf16ToFloat(d_out[r * ffn + col % ffn]);
      const double s = 1.0 / (1.0 + std::exp(-g));
      const double slack = is_gate ? std::fabs(dy * u * s) * (1 + std::fabs(g)) * 0x1p-20 : 0.0;
      const double diff = std::fabs(double(Bf16ToFloat(got_dh[i])) - Bf16ToFloat(dh[i]));
      ASSERT_TRUE(UlpDiff(got_dh[i], dh[i]) <= 1.0 || diff <= slack)
          << "d_h element " << i << ": " << Bf16ToFloat(got_dh[i]) << " vs " << Bf16ToFloat(dh[i]);
    }
    EXPECT_LE(differ, out.size() / 100) << "more than 1% of outputs off by one ulp";
    // The fused MXFP8 output equals quantizing the kernel's own bf16 output, bit for bit.
    auto data = Poisoned<uint8_t>(rows * ffn), scales = Poisoned<uint8_t>(rows * ffn / 32);
    MxRowwise want{data.data(), scales.data()};
    const std::vector<int32_t> one_group = {0, live};
    STATUS_ASSERT(cpu::QuantizeMxfp8({rows, ffn, 1}, got_out.data(), one_group.data(), &want, nullptr));
    EXPECT_TRUE(BitEqual(d_mx.Download(), data));
    EXPECT_TRUE(BitEqual(d_mx_scales.Download(), scales));
    EXPECT_TRUE(BitEqual(d_mx_only.Download(), data));
    EXPECT_TRUE(BitEqual(d_mx_only_scales.Download(), scales));
  }
}

// Route -> plan -> permute (MXFP8) -> SwiGLU -> combine, captured once and replayed: the chain has
// no host synchronization, and a replay gives the same bits as the direct calls.
TEST_F(PermuteGpu, ForwardChainIsGraphCapturable) {
  const int64_t tokens = 1000, hidden = 256, ffn = 128;
  const int experts = 64, top_k = 4;
  const int64_t rows = tokens * top_k;
  const std::vector<float> logits = RandomFloat(tokens * experts);
  const std::vector<Bf16> x = RandomBf16(tokens * hidden);
  const std::vector<Bf16> h = RandomBf16(rows * 2 * ffn);
  DeviceArray<float> d_logits(logits), d_weights(rows), d_sums(experts);
  DeviceArray<int32_t> d_ids(rows), d_counts(experts), d_offsets(experts + 1), d_slot(rows),
      d_choice(rows);
  DeviceArray<char> d_ws(DispatchPlanWorkspaceBytes({tokens, experts, top_k}));
  DeviceArray<Bf16> d_x(x), d_h(h), d_act(rows * ffn), d_y(tokens * hidden);
  DeviceArray<uint8_t> d_q(rows * hidden), d_qs(rows * hidden / 32);
  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreate(&stream));
  auto chain = [&]() -> absl::Status {
    const RoutingShape rs{tokens, experts, top_k, ScoreFunction::kSoftmax, true};
    if (auto s = cuda::RouteTopK(rs, d_logits.get(), {d_ids.get(), d_weights.get(), d_counts.get(), d_sums.get()}, stream); !s.ok()) return s;
    if (auto s = cuda::BuildDispatchPlan({tokens, experts, top_k}, d_ids.get(), {d_offsets.get(), d_slot.get(), d_choice.get()}, d_ws.get(), stream); !s.ok()) return s;
    if (auto s = cuda::PermuteMxfp8({tokens, hidden, top_k}, d_x.get(), d_slot.get(), {d_q.get(), d_qs.get()}, stream); !s.ok()) return s;
    if (auto s = cuda::SwigluForward({rows, ffn}, d_offsets.get() + experts, d_h.get(), d_act.get(), nullptr, stream); !s.ok()) return s;
    // The activations stand in for the expert outputs (width ffn).
    return cuda::UnpermuteCombine({tokens, ffn, top_k}, d_act.get(), d_slot.get(), d_weights.get(), d_y.get(), stream);
  };
  STATUS_ASSERT(chain());
  CUDA_ASSERT(cudaStreamSynchronize(stream));
  const std::vector<Bf16> y_direct = d_y.Download();
  const std::vector<uint8_t> q_direct = d_q.Download();
  d_y.Poison(0xA5);
  d_q.Poison(0xA5);
  cudaGraph_t graph;
  CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  STATUS_ASSERT(chain());
  CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_ASSERT(cudaGraphLaunch(exec, stream));
  CUDA_ASSERT(cudaGraphLaunch(exec, stream));
  CUDA_ASSERT(cudaStreamSynchronize(stream));
  EXPECT_TRUE(BitEqual(d_y.Download(), y_direct));
  EXPECT_TRUE(BitEqual(d_q.Download(), q_direct));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace dropless::kernels
