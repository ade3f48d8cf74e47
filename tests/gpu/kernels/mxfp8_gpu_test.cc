// MXFP8 CUDA kernels against the CPU reference, bit for bit: row-wise, grouped row-wise +
// column-wise with zero and odd group sizes, special values, and dequantization.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dropless/kernels/mxfp8.h"
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
using testing::Rng;

class Mxfp8Gpu : public testing::GpuTest {};

TEST_F(Mxfp8Gpu, RowwiseMatchesReference) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 32}, {37, 96}, {1000, 2048},
                            {4099, 160}, {301, 7168}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << cols);
    const std::vector<Bf16> x = QuantizeInput(rows, cols);
    // A single group ending before the buffer's last rows: those rows stay untouched.
    const std::vector<int32_t> offsets = {0, static_cast<int32_t>(rows - rows / 7)};
    DeviceArray<Bf16> d_x(x);
    DeviceArray<int32_t> d_offsets(offsets);
    DeviceArray<uint8_t> d_data(rows * cols), d_scales(rows * cols / 32);
    MxRowwise d_rowwise{d_data.get(), d_scales.get()};
    STATUS_ASSERT(cuda::QuantizeMxfp8({rows, cols, 1}, d_x.get(), d_offsets.get(), &d_rowwise,
                                      nullptr, nullptr));
    auto data = Poisoned<uint8_t>(rows * cols), scales = Poisoned<uint8_t>(rows * cols / 32);
    MxRowwise rowwise{data.data(), scales.data()};
    STATUS_ASSERT(cpu::QuantizeMxfp8({rows, cols, 1}, x.data(), offsets.data(), &rowwise, nullptr));
    EXPECT_TRUE(BitEqual(d_data.Download(), data));
    EXPECT_TRUE(BitEqual(d_scales.Download(), scales));
  }
}

// Row-wise over a run of the groups (offsets + first, as the engine quantizes one chunk of experts
// at a time): the run's rows as the whole quantization writes them, every other row untouched.
TEST_F(Mxfp8Gpu, RowwiseOfARunOfGroupsTouchesOnlyItsRows) {
  const int64_t rows = 1000, cols = 160, blocks = cols / 32;
  const std::vector<Bf16> x = QuantizeInput(rows, cols);
  const std::vector<int32_t> offsets = {0, 131, 131, 517, 901};  // the run: groups 1-2, rows 131-517
  DeviceArray<Bf16> d_x(x);
  DeviceArray<int32_t> d_offsets(offsets);
  DeviceArray<uint8_t> d_data(rows * cols), d_scales(rows * blocks);
  MxRowwise d_rowwise{d_data.get(), d_scales.get()};
  STATUS_ASSERT(cuda::QuantizeMxfp8({rows, cols, 2}, d_x.get(), d_offsets.get() + 1, &d_rowwise,
                                    nullptr, nullptr));
  auto data = Poisoned<uint8_t>(rows * cols), scales = Poisoned<uint8_t>(rows * blocks);
  MxRowwise rowwise{data.data(), scales.data()};
  STATUS_ASSERT(cpu::QuantizeMxfp8({rows, cols, 4}, x.data(), offsets.data(), &rowwise, nullptr));
  auto want_data = Poisoned<uint8_t>(rows * cols), want_scales = Poisoned<uint8_t>(rows * blocks);
  std::copy(data.begin() + 131 * cols, data.begin() + 517 * cols, want_data.begin() + 131 * cols);
  std::copy(scales.begin() + 131 * blocks, scales.begin() + 517 * blocks,
            want_scales.begin() + 131 * blocks);
  EXPECT_TRUE(BitEqual(d_data.Download(), want_data));
  EXPECT_TRUE(BitEqual(d_scales.Download(), want_scales));
}

TEST_F(Mxfp8Gpu, GroupedRowAndColumnwiseMatchReference) {
  struct Case {
    int64_t rows, cols;
    int groups;
    bool null_offsets;
  };
  for (const Case& c : {Case{200, 64, 6, false}, Case{1531, 160, 7, false},
                        Case{4099, 2048, 128, false}, Case{8191, 256, 256, false},
                        Case{555, 96, 1, true}, Case{3, 32, 3, false}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.cols << " groups " << c.groups);
    const std::vector<Bf16> x = QuantizeInput(c.rows, c.cols);
    const std::vector<int32_t> offsets =
        c.null_offsets ? std::vector<int32_t>{0, static_cast<int32_t>(c.rows)}
                       : RandomGroupOffsets(c.groups, c.rows - std::min<int64_t>(5, c.rows / 2));
    const int64_t padded = ColwisePaddedRows(c.rows, c.groups);
    const MxQuantizeShape shape{c.rows, c.cols, c.groups};
    for (bool with_rowwise : {true, false}) {
      DeviceArray<Bf16> d_x(x);
      DeviceArray<int32_t> d_offsets(offsets);
      DeviceArray<uint8_t> d_rdata(c.rows * c.cols), d_rscales(c.rows * c.cols / 32);
      DeviceArray<uint8_t> d_cdata(c.cols * padded), d_cscales(c.cols * padded / 32);
      DeviceArray<int32_t> d_poffsets(c.groups + 1);
      MxRowwise d_rowwise{d_rdata.get(), d_rscales.get()};
      MxColwise d_colwise{d_cdata.get(), d_cscales.get(), d_poffsets.get(), padded};
      STATUS_ASSERT(cuda::QuantizeMxfp8(shape, d_x.get(), c.null_offsets ? nullptr : d_offsets.get(),
                                        with_rowwise ? &d_rowwise : nullptr, &d_colwise, nullptr));
      auto rdata = Poisoned<uint8_t>(c.rows * c.cols), rscales = Poisoned<uint8_t>(c.rows * c.cols / 32);
      auto cdata = Poisoned<uint8_t>(c.cols * padded), cscales = Poisoned<uint8_t>(c.cols * padded / 32);
      auto poffsets = Poisoned<int32_t>(c.groups + 1);
      MxRowwise rowwise{rdata.data(), rscales.data()};
      MxColwise colwise{cdata.data(), cscales.data(), poffsets.data(), padded};
      STATUS_ASSERT(cpu::QuantizeMxfp8(shape, x.data(), c.null_offsets ? nullptr : offsets.data(),
                                       with_rowwise ? &rowwise : nullptr, &colwise));
      EXPECT_TRUE(BitEqual(d_poffsets.Download(), poffsets));
      EXPECT_TRUE(BitEqual(d_cdata.Download(), cdata));    // includes untouched padding past G
      EXPECT_TRUE(BitEqual(d_cscales.Download(), cscales));
      EXPECT_TRUE(BitEqual(d_rdata.Download(), rdata));    // all poison when !with_rowwise
      EXPECT_TRUE(BitEqual(d_rscales.Download(), rscales));
    }
  }
}

// Enough tiles that every block of the persistent grid walks many of them (the copy pipeline wraps
// around its stages), a partial last column tile, and a long run of empty groups at the end.
TEST_F(Mxfp8Gpu, ColumnwiseManyTilesPerBlockMatchReference) {
  const int64_t rows = 30011, cols = 1056;
  const int groups = 40;
  const std::vector<Bf16> x = QuantizeInput(rows, cols);
  std::vector<int32_t> offsets = RandomGroupOffsets(groups, rows - 3);
  for (int g = groups - 6; g <= groups; ++g) offsets[g] = offsets[groups - 6];  // empty tail
  const int64_t padded = ColwisePaddedRows(rows, groups);
  const MxQuantizeShape shape{rows, cols, groups};
  for (bool with_rowwise : {true, false}) {
    SCOPED_TRACE(with_rowwise ? "row and column" : "column only");
    DeviceArray<Bf16> d_x(x);
    DeviceArray<int32_t> d_offsets(offsets);
    DeviceArray<uint8_t> d_rdata(rows * cols), d_rscales(rows * cols / 32);
    DeviceArray<uint8_t> d_cdata(cols * padded), d_cscales(cols * padded / 32);
    DeviceArray<int32_t> d_poffsets(groups + 1);
    MxRowwise d_rowwise{d_rdata.get(), d_rscales.get()};
    MxColwise d_colwise{d_cdata.get(), d_cscales.get(), d_poffsets.get(), padded};
    STATUS_ASSERT(cuda::QuantizeMxfp8(shape, d_x.get(), d_offsets.get(),
                                      with_rowwise ? &d_rowwise : nullptr, &d_colwise, nullptr));
    auto rdata = Poisoned<uint8_t>(rows * cols), rscales = Poisoned<uint8_t>(rows * cols / 32);
    auto cdata = Poisoned<uint8_t>(cols * padded), cscales = Poisoned<uint8_t>(cols * padded / 32);
    auto poffsets = Poisoned<int32_t>(groups + 1);
    MxRowwise rowwise{rdata.data(), rscales.data()};
    MxColwise colwise{cdata.data(), cscales.data(), poffsets.data(), padded};
    STATUS_ASSERT(cpu::QuantizeMxfp8(shape, x.data(), offsets.data(),
                                     with_rowwise ? &rowwise : nullptr, &colwise));
    EXPECT_TRUE(BitEqual(d_poffsets.Download(), poffsets));
    EXPECT_TRUE(BitEqual(d_cdata.Download(), cdata));
    EXPECT_TRUE(BitEqual(d_cscales.Download(), cscales));
    EXPECT_TRUE(BitEqual(d_rdata.Download(), rdata));
    EXPECT_TRUE(BitEqual(d_rscales.Download(), rscales));
  }
}

TEST_F(Mxfp8Gpu, DequantizeMatchesReference) {
  const int64_t rows = 777, cols = 192;
  const std::vector<Bf16> x = QuantizeInput(rows, cols);
  std::vector<uint8_t> data(rows * cols), scales(rows * cols / 32);
  MxRowwise rowwise{data.data(), scales.data()};
  STATUS_ASSERT(cpu::QuantizeMxfp8({rows, cols, 1}, x.data(), nullptr, &rowwise, nullptr));
  const int32_t live = 700;
  DeviceArray<uint8_t> d_data(data), d_scales(scales);
  DeviceArray<int32_t> d_live(std::vector<int32_t>{live});
  DeviceArray<float> d_float(rows * cols);
  DeviceArray<Bf16> d_bf16(rows * cols);
  STATUS_ASSERT(cuda::DequantizeMxfp8Rowwise(rows, cols, d_live.get(), d_data.get(),
                                             d_scales.get(), d_float.get(), nullptr));
  STATUS_ASSERT(cuda::DequantizeMxfp8Rowwise(rows, cols, d_live.get(), d_data.get(),
                                             d_scales.get(), d_bf16.get(), nullptr));
  auto want_float = Poisoned<float>(rows * cols);
  auto want_bf16 = Poisoned<Bf16>(rows * cols);
  STATUS_ASSERT(cpu::DequantizeMxfp8Rowwise(rows, cols, &live, data.data(), scales.data(),
                                            want_float.data()));
  STATUS_ASSERT(cpu::DequantizeMxfp8Rowwise(rows, cols, &live, data.data(), scales.data(),
                                            want_bf16.data()));
  // NaNs compare by bits too: both sides produce the canonical quiet NaN.
  std::vector<float> got_float = d_float.Download();
  for (size_t i = 0; i < got_float.size(); ++i) {
    if (std::isnan(got_float[i]) && std::isnan(want_float[i])) got_float[i] = want_float[i];
  }
  EXPECT_TRUE(BitEqual(got_float, want_float));
  std::vector<Bf16> got_bf16 = d_bf16.Download();
  for (size_t i = 0; i < got_bf16.size(); ++i) {
    const bool g_nan = (got_bf16[i].bits & 0x7fff) > 0x7f80, w_nan = (want_bf16[i].bits & 0x7fff) > 0x7f80;
    if (g_nan && w_nan) got_bf16[i] = want_bf16[i];
  }
  EXPECT_TRUE(BitEqual(got_bf16, want_bf16));
}

TEST_F(Mxfp8Gpu, RejectsBadArguments) {
  DeviceArray<Bf16> x(64);
  DeviceArray<uint8_t> data(64), scales(2);
  MxRowwise rowwise{data.get(), scales.get()};
  EXPECT_FALSE(cuda::QuantizeMxfp8({1, 48, 1}, x.get(), nullptr, &rowwise, nullptr, nullptr).ok());
  EXPECT_FALSE(cuda::QuantizeMxfp8({1, 64, 2}, x.get(), nullptr, &rowwise, nullptr, nullptr).ok());
  // Misaligned buffers are refused by name before any launch.
  const absl::Status bad_x =
      cuda::QuantizeMxfp8({1, 32, 1}, x.get() + 1, nullptr, &rowwise, nullptr, nullptr);
  EXPECT_NE(bad_x.message().find("x:"), std::string::npos) << bad_x;
  MxRowwise shifted{data.get() + 4, scales.get()};
  const absl::Status bad_out =
      cuda::QuantizeMxfp8({1, 32, 1}, x.get(), nullptr, &shifted, nullptr, nullptr);
  EXPECT_NE(bad_out.message().find("rowwise.data"), std::string::npos) << bad_out;
}

}  // namespace
}  // namespace dropless::kernels
