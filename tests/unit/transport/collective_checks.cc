#include "tests/unit/transport/collective_checks.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dropless::testing {
namespace {

constexpr uint8_t kPoison = 0xAB;
constexpr int64_t kGap = 3;  // unused bytes between slices, which must stay untouched

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Rank `rank`'s input to all-reduce: reproducible on every rank.
template <typename T>
std::vector<T> ReduceInput(uint64_t seed, int rank, size_t count) {
  std::mt19937_64 gen(Mix(seed * 1000003 + rank));
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<T> data(count);
  for (T& x : data) x = static_cast<T>(dist(gen));
  return data;
}

uint64_t Fingerprint(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Every rank learns every rank's fingerprint of its result; all must match.
void ExpectSameOnEveryRank(Communicator& comm, uint64_t fingerprint, const char* what) {
  const int n = comm.size();
  std::vector<uint64_t> send(n, fingerprint), recv(n, 0);
  ASSERT_TRUE(comm.AllToAll(send.data(), recv.data(), sizeof(uint64_t)).ok());
  for (int p = 0; p < n; ++p) {
    EXPECT_EQ(recv[p], fingerprint) << what << ": rank " << comm.rank() << " and rank " << p
                                    << " hold different results";
  }
}

template <typename T>
void CheckAllReduceOf(Communicator& comm, uint64_t seed, size_t count, bool bit_exact) {
  const int n = comm.size();
  std::vector<T> data = ReduceInput<T>(seed, comm.rank(), count);
  std::vector<T> in_order(count);
  std::vector<double> exact(count, 0.0), magnitude(count, 0.0);
  for (int p = 0; p < n; ++p) {
    const std::vector<T> input = ReduceInput<T>(seed, p, count);
    for (size_t i = 0; i < count; ++i) {
      in_order[i] = p == 0 ? input[i] : in_order[i] + input[i];
      exact[i] += input[i];
      magnitude[i] += std::fabs(static_cast<double>(input[i]));
    }
  }
  absl::Status status = comm.AllReduceSum(data.data(), count);
  ASSERT_TRUE(status.ok()) << status;
  const double eps = std::numeric_limits<T>::epsilon();
  for (size_t i = 0; i < count; ++i) {
    if (bit_exact) {
      ASSERT_EQ(std::memcmp(&data[i], &in_order[i], sizeof(T)), 0)
          << "element " << i << ": got " << data[i] << ", rank-order sum " << in_order[i];
    } else {
      ASSERT_NEAR(data[i], exact[i], 2 * n * eps * magnitude[i] + 1e-300) << "element " << i;
    }
  }
  ExpectSameOnEveryRank(comm, Fingerprint(data.data(), count * sizeof(T)), "AllReduceSum");
}

}  // namespace

int64_t PairBytes(uint64_t seed, int round, int src, int dst, int64_t max_bytes) {
  const uint64_t h = Mix(Mix(Mix(seed) + round) * 31 + src * 1009 + dst);
  if (h % 4 == 0) return 0;
  return static_cast<int64_t>((h >> 8) % static_cast<uint64_t>(max_bytes + 1));
}

void CheckAllToAllV(Communicator& comm, uint64_t seed, int rounds, int64_t max_bytes,
                    SliceLayout layout) {
  const int n = comm.size();
  const int me = comm.rank();
  const bool packed = layout == SliceLayout::kPacked;
  const int64_t gap = packed ? 0 : kGap;
  for (int round = 0; round < rounds; ++round) {
    std::vector<int64_t> send_bytes(n), send_offsets(n), recv_bytes(n), recv_offsets(n);
    int64_t send_total = gap, recv_total = gap;
    for (int i = 0; i < n; ++i) {
      const int p = packed ? i : n - 1 - i;
      send_bytes[p] = PairBytes(seed, round, me, p, max_bytes);
      send_offsets[p] = send_total;
      send_total += send_bytes[p] + gap;
      recv_bytes[p] = PairBytes(seed, round, p, me, max_bytes);
      recv_offsets[p] = recv_total;
      recv_total += recv_bytes[p] + gap;
    }
    std::vector<uint8_t> send(send_total, kPoison), recv(recv_total, kPoison);
    for (int p = 0; p < n; ++p) {
      for (int64_t i = 0; i < send_bytes[p]; ++i) {
        send[send_offsets[p] + i] = PatternByte(me, p, round, i);
      }
    }
    const std::vector<uint8_t> send_before = send;
    absl::Status status = comm.AllToAllV(send.data(), send_bytes, send_offsets, recv.data(),
                                         recv_bytes, recv_offsets);
    ASSERT_TRUE(status.ok()) << "round " << round << ": " << status;
    ASSERT_EQ(send, send_before) << "AllToAllV modified its send buffer";
    std::vector<bool> written(recv_total, false);
    for (int p = 0; p < n; ++p) {
      for (int64_t i = 0; i < recv_bytes[p]; ++i) {
        ASSERT_EQ(recv[recv_offsets[p] + i], PatternByte(p, me, round, i))
            << "round " << round << ", rank " << me << ", from rank " << p << ", byte " << i;
        written[recv_offsets[p] + i] = true;
      }
    }
    for (int64_t i = 0; i < recv_total; ++i) {
      if (!written[i]) ASSERT_EQ(recv[i], kPoison) << "byte " << i << " outside every slice written";
    }
  }
}

void CheckAllToAll(Communicator& comm, int round, size_t bytes_per_peer) {
  const int n = comm.size();
  const int me = comm.rank();
  std::vector<uint8_t> send(n * bytes_per_peer), recv(n * bytes_per_peer, kPoison);
  for (int p = 0; p < n; ++p) {
    for (size_t i = 0; i < bytes_per_peer; ++i) {
      send[p * bytes_per_peer + i] = PatternByte(me, p, round, i);
    }
  }
  absl::Status status = comm.AllToAll(send.data(), recv.data(), bytes_per_peer);
  ASSERT_TRUE(status.ok()) << status;
  for (int p = 0; p < n; ++p) {
    for (size_t i = 0; i < bytes_per_peer; ++i) {
      ASSERT_EQ(recv[p * bytes_per_peer + i], PatternByte(p, me, round, i))
          << "from rank " << p << ", byte " << i;
    }
  }
}

void CheckAllReduceSum(Communicator& comm, uint64_t seed, size_t count, bool bit_exact) {
  CheckAllReduceOf<float>(comm, seed, count, bit_exact);
  CheckAllReduceOf<double>(comm, seed + 1, count, bit_exact);
}

}  // namespace dropless::testing
