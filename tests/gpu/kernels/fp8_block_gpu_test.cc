// fp8-block CUDA kernels against the CPU reference, bit for bit: row-wise, grouped row-wise +
// column-wise (per column and per 128x128 block) with empty and odd group sizes, special values,
// both scale modes, the weight blocks in both orientations, a captured graph replayed with new
// device offsets, and SwiGLU (forward and backward) and the combine's backward with the fp8-block
// output against the quantizers applied to their bf16 output.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "dropless/kernels/dispatch_plan.h"
#include "dropless/kernels/fp8_block.h"
#include "dropless/kernels/permute.h"
#include "dropless/kernels/swiglu.h"
#include "tests/gpu/kernels/gpu_test_util.h"
#include "tests/unit/kernels/test_data.h"

namespace dropless::kernels {
namespace {

using testing::BitEqual;
using testing::DeviceArray;
using testing::Poisoned;
using testing::QuantizeInput;
using testing::RandomBf16WideRange;
using testing::RandomGroupOffsets;

class Fp8BlockGpu : public testing::GpuTest {};

// The fp8-block forms of a [rows][cols] matrix in poisoned device buffers.
struct DeviceForms {
  DeviceForms(int64_t rows, int64_t cols, int64_t padded, int groups, Fp8ColwiseScaling scaling)
      : rdata(rows * cols),
        cdata(cols * padded),
        rscales(rows * cols / kFp8Block),
        cscales(cols * padded / kFp8Block),
        poffsets(groups + 1),
        row{rdata.get(), rscales.get()},
        col{cdata.get(), cscales.get(), poffsets.get(), padded, scaling} {}
  DeviceArray<uint8_t> rdata, cdata;
  DeviceArray<float> rscales, cscales;
  DeviceArray<int32_t> poffsets;
  Fp8BlockRowwise row;
  Fp8BlockColwise col;
};

// The CPU reference's forms of the same shapes, poisoned as the device's are.
struct HostForms {
  HostForms(int64_t rows, int64_t cols, int64_t padded, int groups, Fp8ColwiseScaling scaling)
      : rdata(Poisoned<uint8_t>(rows * cols)),
        cdata(Poisoned<uint8_t>(cols * padded)),
        rscales(Poisoned<float>(rows * cols / kFp8Block)),
        cscales(Poisoned<float>(cols * padded / kFp8Block)),
        poffsets(Poisoned<int32_t>(groups + 1)),
        row{rdata.data(), rscales.data()},
        col{cdata.data(), cscales.data(), poffsets.data(), padded, scaling} {}
  HostForms(const HostForms&) = delete;
  HostForms& operator=(const HostForms&) = delete;
  std::vector<uint8_t> rdata, cdata;
  std::vector<float> rscales, cscales;
  std::vector<int32_t> poffsets;
  Fp8BlockRowwise row;
  Fp8BlockColwise col;
};

constexpr Fp8ScaleMode kModes[] = {Fp8ScaleMode::kFloat32, Fp8ScaleMode::kPowerOfTwo};

const char* ModeName(Fp8ScaleMode mode) {
  return mode == Fp8ScaleMode::kFloat32 ? "fp32 scales" : "power-of-two scales";
}

TEST_F(Fp8BlockGpu, RowwiseMatchesReference) {
  for (Fp8ScaleMode mode : kModes) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 128}, {37, 384}, {1000, 2048},
                              {4099, 128}, {301, 7168}}) {
      SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " " << ModeName(mode));
      const std::vector<Bf16> x = QuantizeInput(rows, cols);
      // One group ending before the buffer's last rows: those rows stay untouched.
      const std::vector<int32_t> offsets = {0, static_cast<int32_t>(rows - rows / 7)};
      DeviceArray<Bf16> d_x(x);
      DeviceArray<int32_t> d_offsets(offsets);
      DeviceArray<uint8_t> d_data(rows * cols);
      DeviceArray<float> d_scales(rows * cols / kFp8Block);
      Fp8BlockRowwise d_rowwise{d_data.get(), d_scales.get()};
      STATUS_ASSERT(cuda::QuantizeFp8Block({rows, cols, 1, mode}, d_x.get(), d_offsets.get(),
                                           &d_rowwise, nullptr, nullptr));
      auto data = Poisoned<uint8_t>(rows * cols);
      auto scales = Poisoned<float>(rows * cols / kFp8Block);
      Fp8BlockRowwise rowwise{data.data(), scales.data()};
      STATUS_ASSERT(cpu::QuantizeFp8Block({rows, cols, 1, mode}, x.data(), offsets.data(),
                                          &rowwise, nullptr));
      EXPECT_TRUE(BitEqual(d_data.Download(), data));
      EXPECT_TRUE(BitEqual(d_scales.Download(), scales));
    }
  }
}

// Row-wise over a run of the groups (offsets + first, as the engine quantizes one chunk of experts
// at a time): the run's rows as the whole quantization writes them, every other row untouched.
TEST_F(Fp8BlockGpu, RowwiseOfARunOfGroupsTouchesOnlyItsRows) {
  const int64_t rows = 1000, cols = 384, tiles = cols / kFp8Block;
  const std::vector<Bf16> x = QuantizeInput(rows, cols);
  const std::vector<int32_t> offsets = {0, 130, 130, 517, 901};  // the run: groups 1-2, rows 130-517
  DeviceArray<Bf16> d_x(x);
  DeviceArray<int32_t> d_offsets(offsets);
  DeviceArray<uint8_t> d_data(rows * cols);
  DeviceArray<float> d_scales(rows * tiles);
  Fp8BlockRowwise d_rowwise{d_data.get(), d_scales.get()};
  STATUS_ASSERT(cuda::QuantizeFp8Block({rows, cols, 2, Fp8ScaleMode::kFloat32}, d_x.get(),
                                       d_offsets.get() + 1, &d_rowwise, nullptr, nullptr));
  auto data = Poisoned<uint8_t>(rows * cols);
  auto scales = Poisoned<float>(rows * tiles);
  Fp8BlockRowwise rowwise{data.data(), scales.data()};
  STATUS_ASSERT(cpu::QuantizeFp8Block({rows, cols, 4, Fp8ScaleMode::kFloat32}, x.data(),
                                      offsets.data(), &rowwise, nullptr));
  auto want_data = Poisoned<uint8_t>(rows * cols);
  auto want_scales = Poisoned<float>(rows * tiles);
  std::copy(data.begin() + 130 * cols, data.begin() + 517 * cols, want_data.begin() + 130 * cols);
  std::copy(scales.begin() + 130 * tiles, scales.begin() + 517 * tiles,
            want_scales.begin() + 130 * tiles);
  EXPECT_TRUE(BitEqual(d_data.Download(), want_data));
  EXPECT_TRUE(BitEqual(d_scales.Download(), want_scales));
}

TEST_F(Fp8BlockGpu, GroupedRowAndColumnwiseMatchReference) {
  struct Case {
    int64_t rows, cols;
    int groups;
    bool null_offsets;
  };
  for (Fp8ScaleMode mode : kModes) {
    for (const Case& c : {Case{200, 128, 6, false}, Case{1531, 384, 7, false},
                          Case{4099, 2048, 128, false}, Case{8191, 256, 256, false},
                          Case{555, 128, 1, true}, Case{3, 128, 3, false},
                          Case{20011, 1024, 40, false}}) {
      SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.cols << " groups " << c.groups
                                        << " " << ModeName(mode));
      const std::vector<Bf16> x = QuantizeInput(c.rows, c.cols);
      std::vector<int32_t> offsets =
          c.null_offsets ? std::vector<int32_t>{0, static_cast<int32_t>(c.rows)}
                         : RandomGroupOffsets(c.groups, c.rows - std::min<int64_t>(5, c.rows / 2));
      if (c.groups > 8) {  // a run of empty groups at the end
        for (int g = c.groups - 6; g <= c.groups; ++g) offsets[g] = offsets[c.groups - 6];
      }
      const int64_t padded = Fp8ColwisePaddedRows(c.rows, c.groups);
      const Fp8BlockQuantizeShape shape{c.rows, c.cols, c.groups, mode};
      for (auto [with_rowwise, scaling] :
           {std::pair{true, Fp8ColwiseScaling::kPerColumn},
            std::pair{false, Fp8ColwiseScaling::kPerColumn},
            std::pair{true, Fp8ColwiseScaling::kPerBlock},
            std::pair{false, Fp8ColwiseScaling::kPerBlock}}) {
        SCOPED_TRACE(scaling == Fp8ColwiseScaling::kPerBlock ? "per 128x128 block" : "per column");
        // Per block, the scales fill the buffer's first cols / 128 of each tile's cols; the rest
        // stays poisoned on both sides.
        DeviceArray<Bf16> d_x(x);
        DeviceArray<int32_t> d_offsets(offsets);
        DeviceForms dev(c.rows, c.cols, padded, c.groups, scaling);
        STATUS_ASSERT(cuda::QuantizeFp8Block(shape, d_x.get(),
                                             c.null_offsets ? nullptr : d_offsets.get(),
                                             with_rowwise ? &dev.row : nullptr, &dev.col, nullptr));
        HostForms host(c.rows, c.cols, padded, c.groups, scaling);
        STATUS_ASSERT(cpu::QuantizeFp8Block(shape, x.data(),
                                            c.null_offsets ? nullptr : offsets.data(),
                                            with_rowwise ? &host.row : nullptr, &host.col));
        EXPECT_TRUE(BitEqual(dev.poffsets.Download(), host.poffsets));
        EXPECT_TRUE(BitEqual(dev.cdata.Download(), host.cdata));  // includes untouched rows past G
        EXPECT_TRUE(BitEqual(dev.cscales.Download(), host.cscales));
        EXPECT_TRUE(BitEqual(dev.rdata.Download(), host.rdata));  // all poison when !with_rowwise
        EXPECT_TRUE(BitEqual(dev.rscales.Download(), host.rscales));
      }
    }
  }
}

TEST_F(Fp8BlockGpu, WeightBlocksMatchReferenceInBothOrientations) {
  struct Case {
    int experts;
    int64_t k, n;
  };
  for (Fp8ScaleMode mode : kModes) {
    for (const Case& c : {Case{1, 128, 128}, Case{3, 256, 384}, Case{8, 1024, 512},
                          Case{2, 7168, 256}}) {
      SCOPED_TRACE(::testing::Message() << c.experts << "x" << c.k << "x" << c.n << " "
                                        << ModeName(mode));
      const int64_t elements = c.experts * c.k * c.n;
      const int64_t blocks = elements / (kFp8Block * kFp8Block);
      std::vector<Bf16> w = RandomBf16WideRange(elements, 16);
      w[elements / 3] = Bf16{0x7FC0};  // one NaN block
      for (bool both : {true, false}) {
        DeviceArray<Bf16> d_w(w);
        DeviceArray<uint8_t> d_data(elements), d_data_t(elements);
        DeviceArray<float> d_scales(blocks), d_scales_t(blocks);
        Fp8BlockWeights d_out{both ? d_data.get() : nullptr, both ? d_scales.get() : nullptr,
                              d_data_t.get(), d_scales_t.get()};
        STATUS_ASSERT(cuda::QuantizeFp8BlockWeights({c.experts, c.k, c.n, mode}, d_w.get(), d_out,
                                                    nullptr));
        auto data = Poisoned<uint8_t>(elements), data_t = Poisoned<uint8_t>(elements);
        auto scales = Poisoned<float>(blocks), scales_t = Poisoned<float>(blocks);
        Fp8BlockWeights out{both ? data.data() : nullptr, both ? scales.data() : nullptr,
                            data_t.data(), scales_t.data()};
        STATUS_ASSERT(cpu::QuantizeFp8BlockWeights({c.experts, c.k, c.n, mode}, w.data(), out));
        EXPECT_TRUE(BitEqual(d_data.Download(), data));  // all poison when !both
        EXPECT_TRUE(BitEqual(d_scales.Download(), scales));
        EXPECT_TRUE(BitEqual(d_data_t.Download(), data_t));
        EXPECT_TRUE(BitEqual(d_scales_t.Download(), scales_t));
      }
    }
  }
}

// Captured once, replayed with different group sizes written into the same device offsets: the
// kernels read the sizes on the device at every replay.
TEST_F(Fp8BlockGpu, CapturedGraphFollowsDeviceOffsets) {
  const int64_t rows = 3000, cols = 512;
  const int groups = 9;
  const int64_t padded = Fp8ColwisePaddedRows(rows, groups);
  const Fp8BlockQuantizeShape shape{rows, cols, groups, Fp8ScaleMode::kFloat32};
  const std::vector<Bf16> x = QuantizeInput(rows, cols);
  DeviceArray<Bf16> d_x(x);
  DeviceArray<int32_t> d_offsets(groups + 1);
  DeviceArray<uint8_t> d_rdata(rows * cols), d_cdata(cols * padded);
  DeviceArray<float> d_rscales(rows * cols / kFp8Block), d_cscales(cols * padded / kFp8Block);
  DeviceArray<int32_t> d_poffsets(groups + 1);
  Fp8BlockRowwise d_rowwise{d_rdata.get(), d_rscales.get()};
  Fp8BlockColwise d_colwise{d_cdata.get(), d_cscales.get(), d_poffsets.get(), padded};

  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status captured =
      cuda::QuantizeFp8Block(shape, d_x.get(), d_offsets.get(), &d_rowwise, &d_colwise, stream);
  CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  STATUS_ASSERT(captured);
  cudaGraphExec_t exec;
  CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE(::testing::Message() << "replay " << replay);
    const std::vector<int32_t> offsets = RandomGroupOffsets(groups, rows - 7);
    d_offsets.Upload(offsets);
    for (auto* a : {&d_rdata, &d_cdata}) a->Poison(0xA5);
    for (auto* a : {&d_rscales, &d_cscales}) a->Poison(0xA5);
    CUDA_ASSERT(cudaGraphLaunch(exec, stream));
    CUDA_ASSERT(cudaStreamSynchronize(stream));
    auto rdata = Poisoned<uint8_t>(rows * cols), cdata = Poisoned<uint8_t>(cols * padded);
    auto rscales = Poisoned<float>(rows * cols / kFp8Block);
    auto cscales = Poisoned<float>(cols * padded / kFp8Block);
    auto poffsets = Poisoned<int32_t>(groups + 1);
    Fp8BlockRowwise rowwise{rdata.data(), rscales.data()};
    Fp8BlockColwise colwise{cdata.data(), cscales.data(), poffsets.data(), padded};
    STATUS_ASSERT(cpu::QuantizeFp8Block(shape, x.data(), offsets.data(), &rowwise, &colwise));
    EXPECT_TRUE(BitEqual(d_poffsets.Download(), poffsets));
    EXPECT_TRUE(BitEqual(d_cdata.Download(), cdata));
    EXPECT_TRUE(BitEqual(d_cscales.Download(), cscales));
    EXPECT_TRUE(BitEqual(d_rdata.Download(), rdata));
    EXPECT_TRUE(BitEqual(d_rscales.Download(), rscales));
  }
  CUDA_ASSERT(cudaGraphExecDestroy(exec));
  CUDA_ASSERT(cudaGraphDestroy(graph));
  CUDA_ASSERT(cudaStreamDestroy(stream));
}

TEST_F(Fp8BlockGpu, PermuteAndDequantizeMatchReference) {
  for (Fp8ScaleMode mode : kModes) {
    for (auto [tokens, hidden, k] : {std::tuple<int64_t, int64_t, int>{1, 128, 1}, {333, 1024, 4},
                                     {2048, 7168, 8}}) {
      SCOPED_TRACE(::testing::Message() << tokens << "x" << hidden << " k " << k << " "
                                        << ModeName(mode));
      const PermuteShape shape{tokens, hidden, k};
      const std::vector<Bf16> x = QuantizeInput(tokens, hidden);
      // A random permutation of the T*k slots, a few choices dropped (-1).
      std::vector<int32_t> slots(tokens * k);
      for (int64_t i = 0; i < tokens * k; ++i) slots[i] = static_cast<int32_t>(i);
      std::shuffle(slots.begin(), slots.end(), testing::Rng());
      for (int64_t i = 0; i < tokens * k; i += 7) slots[i] = -1;
      const int64_t rows = tokens * k;
      DeviceArray<Bf16> d_x(x);
      DeviceArray<int32_t> d_slots(slots);
      DeviceArray<uint8_t> d_data(rows * hidden);
      DeviceArray<float> d_scales(rows * hidden / kFp8Block);
      STATUS_ASSERT(cuda::PermuteFp8Block(shape, d_x.get(), d_slots.get(),
                                          {d_data.get(), d_scales.get()}, mode, nullptr));
      auto data = Poisoned<uint8_t>(rows * hidden);
      auto scales = Poisoned<float>(rows * hidden / kFp8Block);
      STATUS_ASSERT(
          cpu::PermuteFp8Block(shape, x.data(), slots.data(), {data.data(), scales.data()}, mode));
      EXPECT_TRUE(BitEqual(d_data.Download(), data));  // dropped slots stay poisoned in both
      EXPECT_TRUE(BitEqual(d_scales.Download(), scales));

      // Dequantize what the reference wrote (every slot written: no poison), the first 90% rows.
      const int32_t live = static_cast<int32_t>(rows * 9 / 10);
      std::vector<uint8_t> q = data;
      std::vector<float> qs = scales;
      for (int64_t i = 0; i < tokens * k; i += 7) {  // fill the dropped slots with real rows
        std::fill(q.begin() + i * hidden, q.begin() + (i + 1) * hidden, uint8_t{0x38});
        std::fill(qs.begin() + i * (hidden / kFp8Block), qs.begin() + (i + 1) * (hidden / kFp8Block), 0.5f);
      }
      DeviceArray<uint8_t> d_q(q);
      DeviceArray<float> d_qs(qs);
      DeviceArray<int32_t> d_live(std::vector<int32_t>{live});
      DeviceArray<Bf16> d_out(rows * hidden);
      STATUS_ASSERT(cuda::DequantizeFp8BlockRowwise(rows, hidden, d_live.get(), d_q.get(), d_qs.get(),
                                                    d_out.get(), nullptr));
      auto out = Poisoned<Bf16>(rows * hidden);
      STATUS_ASSERT(cpu::DequantizeFp8BlockRowwise(rows, hidden, &live, q.data(), qs.data(),
                                                   out.data()));
      const std::vector<Bf16> got = d_out.Download();
      int64_t mismatches = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const bool both_nan = (got[i].bits & 0x7fff) > 0x7f80 && (out[i].bits & 0x7fff) > 0x7f80;
        mismatches += !both_nan && got[i].bits != out[i].bits;
      }
      EXPECT_EQ(mismatches, 0);
    }
  }
}

// SwiGLU with the fp8-block output (fused: one pass over h) equals the row-wise quantization of
// its own bf16 output, bit for bit, by the CUDA quantizer and by the CPU reference; the bf16 output
// equals SwigluForward's; rows past num_rows keep their poison in every output.
TEST_F(Fp8BlockGpu, SwigluOutputMatchesTheQuantizedBf16Output) {
  for (Fp8ScaleMode mode : kModes) {
    for (auto [rows, ffn] : {std::pair<int64_t, int64_t>{1, 128}, {1531, 768}, {37, 2048},
                             {4099, 384}, {9, 14336}}) {
      SCOPED_TRACE(::testing::Message() << rows << " x 2*" << ffn << " " << ModeName(mode));
      const SwigluShape shape{rows, ffn};
      const int32_t live = static_cast<int32_t>(rows - rows / 5);
      const std::vector<Bf16> h = testing::RandomBf16(rows * 2 * ffn, 3.0f);
      DeviceArray<Bf16> d_h(h), d_ref_out(rows * ffn), d_out(Poisoned<Bf16>(rows * ffn));
      DeviceArray<int32_t> d_live(std::vector<int32_t>{live});
      DeviceArray<uint8_t> d_data(Poisoned<uint8_t>(rows * ffn)),
          d_only(Poisoned<uint8_t>(rows * ffn)), d_ref_data(rows * ffn);
      DeviceArray<float> d_scales(Poisoned<float>(rows * ffn / kFp8Block)),
          d_only_scales(Poisoned<float>(rows * ffn / kFp8Block)),
          d_ref_scales(rows * ffn / kFp8Block);
      STATUS_ASSERT(cuda::SwigluForwardFp8Block(shape, d_live.get(), d_h.get(), d_out.get(),
                                                {d_data.get(), d_scales.get()}, mode, nullptr));
      STATUS_ASSERT(cuda::SwigluForwardFp8Block(shape, d_live.get(), d_h.get(), nullptr,
                                                {d_only.get(), d_only_scales.get()}, mode, nullptr));
      // The unfused path: SwiGLU to bf16, then the row-wise quantizer over the live rows.
      STATUS_ASSERT(cuda::SwigluForward(shape, d_live.get(), d_h.get(), d_ref_out.get(), nullptr,
                                        nullptr));
      const std::vector<int32_t> offsets = {0, live};
      DeviceArray<int32_t> d_offsets(offsets);
      Fp8BlockRowwise d_ref{d_ref_data.get(), d_ref_scales.get()};
      STATUS_ASSERT(cuda::QuantizeFp8Block({rows, ffn, 1, mode}, d_ref_out.get(), d_offsets.get(),
                                           &d_ref, nullptr, nullptr));
      const std::vector<Bf16> ref_out = d_ref_out.Download();
      auto data = Poisoned<uint8_t>(rows * ffn);
      auto scales = Poisoned<float>(rows * ffn / kFp8Block);
      Fp8BlockRowwise cpu_ref{data.data(), scales.data()};
      STATUS_ASSERT(cpu::QuantizeFp8Block({rows, ffn, 1, mode}, ref_out.data(), offsets.data(),
                                          &cpu_ref, nullptr));
      const size_t n = static_cast<size_t>(live) * ffn, ns = n / kFp8Block;
      const std::vector<Bf16> got_out = d_out.Download();
      const std::vector<uint8_t> got = d_data.Download(), only = d_only.Download();
      const std::vector<uint8_t> ref_data = d_ref_data.Download();
      const std::vector<float> got_scales = d_scales.Download(), ref_scales = d_ref_scales.Download();
      const std::vector<float> only_scales = d_only_scales.Download();
      auto prefix = [](const auto& v, size_t k) { return std::vector(v.begin(), v.begin() + k); };
      auto suffix = [](const auto& v, size_t k) { return std::vector(v.begin() + k, v.end()); };
      EXPECT_TRUE(BitEqual(prefix(got_out, n), prefix(ref_out, n))) << "bf16 output";
      EXPECT_TRUE(BitEqual(prefix(got, n), prefix(ref_data, n))) << "data vs the CUDA quantizer";
      EXPECT_TRUE(BitEqual(prefix(got, n), prefix(data, n))) << "data vs the CPU reference";
      EXPECT_TRUE(BitEqual(prefix(got_scales, ns), prefix(scales, ns))) << "scales";
      EXPECT_TRUE(BitEqual(prefix(got_scales, ns), prefix(ref_scales, ns))) << "scales (CUDA)";
      EXPECT_TRUE(BitEqual(only, got)) << "fp8-block only output";
      EXPECT_TRUE(BitEqual(only_scales, got_scales)) << "fp8-block only scales";
      EXPECT_TRUE(BitEqual(suffix(got_out, n), Poisoned<Bf16>(rows * ffn - n))) << "bf16 tail";
      EXPECT_TRUE(BitEqual(suffix(got, n), Poisoned<uint8_t>(rows * ffn - n))) << "data tail";
      EXPECT_TRUE(BitEqual(suffix(got_scales, ns), Poisoned<float>(rows * ffn / kFp8Block - ns)))
          << "scales tail";
    }
  }
  DeviceArray<Bf16> d_h(256);
  DeviceArray<uint8_t> d_data(128);
  DeviceArray<float> d_scales(1);
  const absl::Status s = cuda::SwigluForwardFp8Block({1, 64}, nullptr, d_h.get(), nullptr,
                                                     {d_data.get(), d_scales.get()},
                                                     Fp8ScaleMode::kFloat32, nullptr);
  EXPECT_NE(s.message().find("ffn"), std::string::npos) << s;
}

// A fused kernel's forms (`fused`) against the quantizers applied to the bf16 matrix it stands for
// (`bf16`, device and host copies): the CUDA quantizer's and the CPU reference's, bit for bit,
// every poisoned byte included.
void ExpectQuantizedEqual(const DeviceForms& fused, const Fp8BlockQuantizeShape& q,
                          const DeviceArray<Bf16>& bf16, const std::vector<Bf16>& host_bf16,
                          const int32_t* d_offsets, const int32_t* offsets, int64_t padded,
                          Fp8ColwiseScaling scaling, bool with_rowwise) {
  DeviceForms ref(q.rows, q.cols, padded, q.num_groups, scaling);
  STATUS_ASSERT(cuda::QuantizeFp8Block(q, bf16.get(), d_offsets, with_rowwise ? &ref.row : nullptr,
                                       &ref.col, nullptr));
  HostForms host(q.rows, q.cols, padded, q.num_groups, scaling);
  STATUS_ASSERT(cpu::QuantizeFp8Block(q, host_bf16.data(), offsets,
                                      with_rowwise ? &host.row : nullptr, &host.col));
  EXPECT_TRUE(BitEqual(fused.cdata.Download(), ref.cdata.Download())) << "column-wise data";
  EXPECT_TRUE(BitEqual(fused.cdata.Download(), host.cdata)) << "column-wise data (CPU)";
  EXPECT_TRUE(BitEqual(fused.cscales.Download(), host.cscales)) << "column-wise scales (CPU)";
  EXPECT_TRUE(BitEqual(fused.poffsets.Download(), host.poffsets)) << "padded offsets";
  EXPECT_TRUE(BitEqual(fused.rdata.Download(), ref.rdata.Download())) << "row-wise data";
  EXPECT_TRUE(BitEqual(fused.rdata.Download(), host.rdata)) << "row-wise data (CPU)";
  EXPECT_TRUE(BitEqual(fused.rscales.Download(), host.rscales)) << "row-wise scales (CPU)";
}

// SwiGLU's forward and backward with the fp8-block output in both forms (out and d_h computed per
// piece inside the tile quantizer, never stored) equal the quantization of SwigluForward's bf16 out
// and SwigluBackward's bf16 d_h, bit for bit, by the CUDA quantizer and by the CPU reference:
// row-wise and column-wise (per column and per 128x128 block) over random groups with empty ones
// and sizes that are not multiples of 128, every untouched byte of the poisoned outputs included.
TEST_F(Fp8BlockGpu, SwigluForwardAndBackwardMatchTheQuantizedBf16Outputs) {
  struct Case {
    int64_t rows, ffn;
    int groups;
    bool null_offsets;
  };
  for (Fp8ScaleMode mode : kModes) {
    for (const Case& c :
         {Case{200, 128, 6, false}, Case{1531, 384, 7, false}, Case{4099, 768, 40, false},
          Case{555, 256, 1, true}, Case{3, 128, 3, false}}) {
      SCOPED_TRACE(::testing::Message() << c.rows << " x 2*" << c.ffn << " groups " << c.groups
                                        << " " << ModeName(mode));
      const int64_t rows = c.rows, cols = 2 * c.ffn;
      const SwigluShape shape{rows, c.ffn};
      const std::vector<Bf16> h = testing::RandomBf16(rows * cols, 3.0f);
      const std::vector<Bf16> d_out = testing::RandomBf16(rows * c.ffn, 2.0f);
      std::vector<int32_t> offsets =
          c.null_offsets ? std::vector<int32_t>{0, static_cast<int32_t>(rows)}
                         : RandomGroupOffsets(c.groups, rows - std::min<int64_t>(5, rows / 2));
      if (c.groups > 8) {  // a run of empty groups at the end
        for (int g = c.groups - 6; g <= c.groups; ++g) offsets[g] = offsets[c.groups - 6];
      }
      const int64_t padded = Fp8ColwisePaddedRows(rows, c.groups);
      const Fp8BlockQuantizeShape qshape{rows, cols, c.groups, mode};
      DeviceArray<Bf16> d_h(h), d_dout(d_out), d_dh(Poisoned<Bf16>(rows * cols));
      DeviceArray<int32_t> d_offsets(offsets);
      const int32_t* group_offsets = c.null_offsets ? nullptr : d_offsets.get();
      // The unfused path: SwiGLU's backward to bf16 over the live rows, then the quantizer.
      STATUS_ASSERT(cuda::SwigluBackward(shape, d_offsets.get() + c.groups, d_h.get(), d_dout.get(),
                                         d_dh.get(), nullptr));
      const std::vector<Bf16> dh = d_dh.Download();
      DeviceArray<Bf16> d_out_bf16(Poisoned<Bf16>(rows * c.ffn));
      STATUS_ASSERT(cuda::SwigluForward(shape, d_offsets.get() + c.groups, d_h.get(),
                                        d_out_bf16.get(), nullptr, nullptr));
      const std::vector<Bf16> out_bf16 = d_out_bf16.Download();
      const Fp8BlockQuantizeShape fwd_shape{rows, c.ffn, c.groups, mode};
      for (auto [with_rowwise, scaling] : {std::pair{true, Fp8ColwiseScaling::kPerColumn},
                                           std::pair{false, Fp8ColwiseScaling::kPerBlock},
                                           std::pair{true, Fp8ColwiseScaling::kPerBlock}}) {
        SCOPED_TRACE(scaling == Fp8ColwiseScaling::kPerBlock ? "per 128x128 block" : "per column");
        DeviceForms fused(rows, cols, padded, c.groups, scaling);
        STATUS_ASSERT(cuda::SwigluBackwardFp8Block(
            shape, group_offsets, c.groups, d_h.get(), d_dout.get(),
            with_rowwise ? &fused.row : nullptr, &fused.col, mode, nullptr));
        ExpectQuantizedEqual(fused, qshape, d_dh, dh, group_offsets,
                             c.null_offsets ? nullptr : offsets.data(), padded, scaling,
                             with_rowwise);
        SCOPED_TRACE("forward");
        DeviceForms forward(rows, c.ffn, padded, c.groups, scaling);
        STATUS_ASSERT(cuda::SwigluForwardFp8BlockGrouped(shape, group_offsets, c.groups, d_h.get(),
                                                         with_rowwise ? &forward.row : nullptr,
                                                         &forward.col, mode, nullptr));
        ExpectQuantizedEqual(forward, fwd_shape, d_out_bf16, out_bf16, group_offsets,
                             c.null_offsets ? nullptr : offsets.data(), padded, scaling,
                             with_rowwise);
      }
    }
  }
  DeviceArray<Bf16> d_h(256), d_dout(128);
  DeviceArray<uint8_t> d_data(256);
  DeviceArray<float> d_scales(2);
  Fp8BlockRowwise rowwise{d_data.get(), d_scales.get()};
  absl::Status s = cuda::SwigluBackwardFp8Block({1, 64}, nullptr, 1, d_h.get(), d_dout.get(),
                                                &rowwise, nullptr, Fp8ScaleMode::kFloat32, nullptr);
  EXPECT_NE(s.message().find("ffn"), std::string::npos) << s;
  s = cuda::SwigluBackwardFp8Block({1, 128}, nullptr, 1, d_h.get(), nullptr, &rowwise, nullptr,
                                   Fp8ScaleMode::kFloat32, nullptr);
  EXPECT_NE(s.message().find("d_out"), std::string::npos) << s;
}

// The permute's rows and the combine's row gradient with the fp8-block output (each slot's row
// gathered from the token rows through choice_of_slot, never stored in bf16) equal the quantization
// of the bf16 rows Permute and UnpermuteCombineBackward write, bit for bit, by the CUDA quantizer
// and by the CPU reference, over a random dispatch plan with skewed and empty experts;
// UnpermuteCombineBackward without d_rows computes the same weight gradients.
TEST_F(Fp8BlockGpu, GatheredRowsMatchTheQuantizedBf16Rows) {
  struct Case {
    int64_t tokens, hidden;
    int experts, top_k;
  };
  for (Fp8ScaleMode mode : kModes) {
    for (const Case& c : {Case{1, 128, 4, 1}, Case{333, 384, 16, 4}, Case{1024, 1024, 40, 8},
                          Case{257, 2048, 8, 2}}) {
      SCOPED_TRACE(::testing::Message() << c.tokens << "x" << c.hidden << " E " << c.experts
                                        << " k " << c.top_k << " " << ModeName(mode));
      const int64_t rows = c.tokens * c.top_k, H = c.hidden;
      const PermuteShape shape{c.tokens, H, c.top_k};
      // Skewed routing: expert 0 takes about two thirds, the last two experts none.
      std::vector<int32_t> ids(rows);
      std::uniform_int_distribution<int> pick(0, 3 * (c.experts - 3) - 1);
      for (int32_t& id : ids) id = std::max(0, pick(testing::Rng()) - 2 * (c.experts - 3) + 1);
      if (c.experts <= 4) std::fill(ids.begin(), ids.end(), 0);
      std::vector<int32_t> offsets(c.experts + 1), slot_of(rows), choice_of(rows);
      STATUS_ASSERT(cpu::BuildDispatchPlan({c.tokens, c.experts, c.top_k}, ids.data(),
                                           {offsets.data(), slot_of.data(), choice_of.data()},
                                           nullptr));
      std::vector<float> weights(rows);
      std::uniform_real_distribution<float> gate(0.0f, 1.0f);
      for (float& w : weights) w = gate(testing::Rng());
      const std::vector<Bf16> x = testing::RandomBf16(c.tokens * H, 2.0f);
      const std::vector<Bf16> expert_out = testing::RandomBf16(rows * H, 1.0f);
      DeviceArray<Bf16> d_x(x), d_rows_in(expert_out), d_grad_rows(rows * H), d_perm_rows(rows * H);
      DeviceArray<int32_t> d_offsets(offsets), d_slot(slot_of), d_choice(choice_of);
      DeviceArray<float> d_weights(weights), d_w_grad(rows), d_w_grad_only(rows);
      STATUS_ASSERT(cuda::UnpermuteCombineBackward(shape, d_x.get(), d_rows_in.get(), d_slot.get(),
                                                   d_weights.get(), d_grad_rows.get(),
                                                   d_w_grad.get(), nullptr));
      STATUS_ASSERT(cuda::UnpermuteCombineBackward(shape, d_x.get(), d_rows_in.get(), d_slot.get(),
                                                   d_weights.get(), nullptr, d_w_grad_only.get(),
                                                   nullptr));
      EXPECT_TRUE(BitEqual(d_w_grad_only.Download(), d_w_grad.Download())) << "weight gradients";
      STATUS_ASSERT(cuda::Permute(shape, d_x.get(), d_slot.get(), d_perm_rows.get(), nullptr));
      const int64_t padded = Fp8ColwisePaddedRows(rows, c.experts);
      const Fp8BlockQuantizeShape qshape{rows, H, c.experts, mode};
      for (bool combine : {false, true}) {
        SCOPED_TRACE(combine ? "combine's row gradient" : "permuted rows");
        const DeviceArray<Bf16>& bf16_rows = combine ? d_grad_rows : d_perm_rows;
        const std::vector<Bf16> host_rows = bf16_rows.Download();
        for (Fp8ColwiseScaling scaling :
             {Fp8ColwiseScaling::kPerColumn, Fp8ColwiseScaling::kPerBlock}) {
          DeviceForms fused(rows, H, padded, c.experts, scaling);
          if (combine) {
            STATUS_ASSERT(cuda::UnpermuteCombineBackwardFp8Block(
                shape, d_x.get(), d_choice.get(), d_weights.get(), d_offsets.get(), c.experts,
                &fused.row, &fused.col, mode, nullptr));
          } else {
            STATUS_ASSERT(cuda::PermuteFp8BlockGrouped(shape, d_x.get(), d_choice.get(),
                                                       d_offsets.get(), c.experts, &fused.row,
                                                       &fused.col, mode, nullptr));
          }
          ExpectQuantizedEqual(fused, qshape, bf16_rows, host_rows, d_offsets.get(), offsets.data(),
                               padded, scaling, /*with_rowwise=*/true);
        }
      }
    }
  }
}

TEST_F(Fp8BlockGpu, RejectsBadArgumentsNamingTheField) {
  DeviceArray<Bf16> d_x(256 * 8);
  DeviceArray<uint8_t> d_data(256 * 8);
  DeviceArray<float> d_scales(16);
  Fp8BlockRowwise rowwise{d_data.get(), d_scales.get()};
  absl::Status s = cuda::QuantizeFp8Block({8, 96, 1}, d_x.get(), nullptr, &rowwise, nullptr,
                                          nullptr);
  EXPECT_NE(s.message().find("cols"), std::string::npos) << s;
  s = cuda::QuantizeFp8Block({8, 256, 2}, d_x.get(), nullptr, &rowwise, nullptr, nullptr);
  EXPECT_NE(s.message().find("num_groups"), std::string::npos) << s;
  Fp8BlockWeights out{nullptr, nullptr, nullptr, nullptr};
  s = cuda::QuantizeFp8BlockWeights({1, 128, 128}, d_x.get(), out, nullptr);
  EXPECT_NE(s.message().find("out"), std::string::npos) << s;
}

}  // namespace
}  // namespace dropless::kernels
