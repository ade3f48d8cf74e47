// Collective scenarios shared by the local and Gloo transport tests: each runs on one rank's
// Communicator and asserts what that rank received against values it can compute on its own.
#ifndef DROPLESS_TESTS_UNIT_TRANSPORT_COLLECTIVE_CHECKS_H_
#define DROPLESS_TESTS_UNIT_TRANSPORT_COLLECTIVE_CHECKS_H_

#include <cstdint>

#include "worker/transport/communicator.h"

namespace dropless::testing {

// The byte that `src` sends to `dst` at position `index` of round `round`.
inline uint8_t PatternByte(int src, int dst, int round, int64_t index) {
  return static_cast<uint8_t>(src * 131 + dst * 71 + round * 29 + index * 7 + 1);
}

// Bytes that `src` sends to `dst` in round `round`: pseudo-random in [0, max_bytes], zero for
// about a quarter of the pairs, the same on every rank (seeded by seed, round, src, dst).
int64_t PairBytes(uint64_t seed, int round, int src, int dst, int64_t max_bytes);

enum class SliceLayout {
  kPacked,     // slices back to back in peer order
  kScattered,  // slices in reverse peer order with gaps between them
};

// `rounds` AllToAllV calls with random (zero included) sizes and a poisoned receive buffer; checks
// every received byte, that bytes outside the slices stay untouched and that the send buffer is
// unchanged. Uses gtest assertions.
void CheckAllToAllV(Communicator& comm, uint64_t seed, int rounds, int64_t max_bytes,
                    SliceLayout layout = SliceLayout::kScattered);

// AllToAll of `bytes_per_peer` bytes per peer, checked byte by byte.
void CheckAllToAll(Communicator& comm, int round, size_t bytes_per_peer);

// AllReduceSum on float and double data of `count` elements, random per rank; compares with the
// sum computed in rank order from the same seeds. When `bit_exact` the comparison is exact,
// otherwise within a few ulps of the fp64 sum (transports may sum in another order).
void CheckAllReduceSum(Communicator& comm, uint64_t seed, size_t count, bool bit_exact);

}  // namespace dropless::testing

#endif  // DROPLESS_TESTS_UNIT_TRANSPORT_COLLECTIVE_CHECKS_H_
