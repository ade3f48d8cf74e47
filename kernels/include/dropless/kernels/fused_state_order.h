// The order in which the weight gradient fused with AdamW (grouped_wgrad_adamw.h) keeps an expert
// weight's fp32 master and AdamW moments: tile by tile in the order its epilogue holds them, so
// that each of its loads and stores is contiguous (a [E][k][n] row-major state is read and
// written in 256-byte runs 4 n bytes apart instead). Only the AdamW state takes this order; the
// bf16 working copy, the gradient and the checkpoints stay [E][k][n] row-major.
//
// Element (e, r, c) of W (k and n multiples of kFusedStateTile) belongs to the 128 x 128 tile
// (e, r / 128, c / 128), tiles numbered row-major per expert and experts one after another, so
// expert e's state occupies the same index range in either order. Within its tile the element
// sits in piece q (accumulator half r / 64, row octet (r / 8) % 2, column half c / 64; 2048
// elements a piece) at the place of the consumer thread that holds it (thread 32 w + 4 (r % 8) +
// (c % 8) / 2 of its warpgroup, w = (r % 64) / 16) and of that thread's column pair (c % 64) / 8:
// index 2 (128 pair + thread) + c % 2.
#ifndef DROPLESS_KERNELS_FUSED_STATE_ORDER_H_
#define DROPLESS_KERNELS_FUSED_STATE_ORDER_H_

#include <cstdint>

#include "dropless/kernels/types.h"

namespace dropless::kernels {

inline constexpr int kFusedStateTile = 128;
inline constexpr int kFusedStatePiece = 2048;  // elements

// Index in the fused order of element (e, r, c) of a [E][k][n] weight.
DROPLESS_KERNELS_HD inline int64_t FusedStateIndex(int64_t e, int64_t r, int64_t c, int64_t k,
                                                   int64_t n) {
  const int64_t tile = (e * (k / kFusedStateTile) + r / kFusedStateTile) * (n / kFusedStateTile) +
                       c / kFusedStateTile;
  const int64_t rr = r % kFusedStateTile, cc = c % kFusedStateTile;
  const int64_t q = 4 * (rr / 64) + 2 * ((rr / 8) % 2) + cc / 64;
  const int64_t thread = 32 * ((rr % 64) / 16) + 4 * (rr % 8) + (cc % 8) / 2;
  const int64_t pair = (cc % 64) / 8;
  return (tile * 8 + q) * kFusedStatePiece + 2 * (128 * pair + thread) + cc % 2;
}

}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_FUSED_STATE_ORDER_H_
