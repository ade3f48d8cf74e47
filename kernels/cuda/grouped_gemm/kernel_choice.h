// Kernel choices made on the device, per call, from the group sizes: the rules, shared with a CPU
// unit test (tests/unit/kernels/kernel_choice_test.cc). Header-only, no CUDA headers.
//
// bf16: the forward / data-gradient pair "coop_128x256x64_c2x1_or_c1x2" (paired_runner.cu).
// A 2x1 cluster (two M tiles share each weight tile through TMA multicast) halves the weight
// traffic from L2, but CUTLASS's grouped scheduler rounds every group's M tiles up to a multiple
// of 2, so a group with an odd tile count computes one tile of padding. Measured on an H200 with
// dropless and torch interleaved in one process (docs/grouped_gemm.md): with no padding the 2x1
// cluster is 0-10% faster than the 1x2 cluster (dsv3 uniform forward +10%, mixtral +2%); with
// 5% padding (qwen3 zipf) 3-5% slower, with 31% (dsv3 zipf) 7-14% slower. The rule takes the 2x1
// cluster while the padding is at most 2% of the tiles.
#ifndef DROPLESS_KERNELS_CUDA_GROUPED_GEMM_KERNEL_CHOICE_H_
#define DROPLESS_KERNELS_CUDA_GROUPED_GEMM_KERNEL_CHOICE_H_

#include <cstdint>

#include "dropless/kernels/types.h"

namespace dropless::kernels::grouped_gemm_internal {

inline constexpr int kPairedTileM = 128;

// Tiles of one group of `rows` rows, and its padding tiles under a 2x1 cluster.
DROPLESS_KERNELS_HD inline int64_t GroupTilesM(int64_t rows) {
  return (rows + kPairedTileM - 1) / kPairedTileM;
}
DROPLESS_KERNELS_HD inline int64_t ClusterPaddingTiles(int64_t rows) {
  return GroupTilesM(rows) % 2;
}

// True: the 2x1 cluster (padding <= 2% of the tiles, and some work); false: the 1x2 cluster.
DROPLESS_KERNELS_HD inline bool PreferClusterAlongM(int64_t tiles, int64_t padding_tiles) {
  return tiles > 0 && padding_tiles * 50 <= tiles;
}

// MXFP8 weight gradient (mxfp8/mx_grouped_gemm.cu): 256 x 128 tiles ("wide") or 128 x 128 tiles.
// Its reduction runs over each group's padded rows, so a tile's main loop is as long as its group:
// short groups leave the wide kernel's larger tiles with few stages to amortize their start and
// store. Measured on an H200 (fp32 out, TFLOP/s, wide / 128 x 128; docs/mxfp8_gemm.md): dsv3
// uniform (256-row groups) 178 / 226, dsv3 zipf 163 / 196, qwen3 zipf 300 / 309 and 274 / 306,
// qwen3 uniform 359 / 341, mixtral 367-391 / 346-377. The share of rows in groups of at least 512
// padded rows is 0, 57%, 82%, 100% and 100% for those distributions; the wide kernel is taken
// from 90%.
inline constexpr int64_t kWideWgradGroupRows = 512;

DROPLESS_KERNELS_HD inline bool PreferWideWeightGradient(int64_t rows_in_long_groups,
                                                         int64_t rows) {
  return rows > 0 && rows_in_long_groups * 10 >= rows * 9;
}

// The bf16 weight gradient to fp32 (grouped_gemm.cc, DefaultKernel) takes its tiles by the
// device's peak memory bandwidth, double data rate over the memory bus (the device's memory clock
// and bus width): H200-class devices (4.8 TB/s of HBM3e) keep the 128x128 ping-pong kernel, the
// others (H100 SXM 3.35 TB/s; H100 NVL, H20 and GH200-96GB 3.9-4.0) take 128x256 tiles. The
// threshold sits in the gap, clear of any part's rounding; a device reporting no memory clock
// gets the 128x256 tiles.
inline constexpr double kHighMemoryBandwidth = 4.4e12;

inline double PeakMemoryBytesPerSecond(int memory_khz, int bus_bits) {
  return 2.0 * memory_khz * 1e3 * bus_bits / 8.0;
}
inline bool IsHighMemoryBandwidth(int memory_khz, int bus_bits) {
  return PeakMemoryBytesPerSecond(memory_khz, bus_bits) >= kHighMemoryBandwidth;
}

}  // namespace dropless::kernels::grouped_gemm_internal

#endif  // DROPLESS_KERNELS_CUDA_GROUPED_GEMM_KERNEL_CHOICE_H_
