#include <atomic>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/unit/transport/collective_checks.h"
#include "tests/unit/transport/rank_threads.h"
#include "worker/transport/rank_layout.h"
#include "worker/transport/transport_factory.h"

namespace dropless {
namespace {

using testing::RunRankThreads;

// Long enough for a loaded CI machine, short enough that a broken test fails instead of hanging.
constexpr absl::Duration kTestTimeout = absl::Seconds(60);

TEST(LocalGroupsTest, GroupsFollowTheRankLayout) {
  const int ep = 3, dp = 2;
  std::vector<RankGroups> groups = CreateLocalGroups(ep, dp, kTestTimeout);
  ASSERT_EQ(groups.size(), 6u);
  for (int r = 0; r < ep * dp; ++r) {
    EXPECT_EQ(groups[r].world->rank(), r);
    EXPECT_EQ(groups[r].world->size(), ep * dp);
    EXPECT_EQ(groups[r].ep->rank(), r % ep);
    EXPECT_EQ(groups[r].ep->size(), ep);
    EXPECT_EQ(groups[r].dp->rank(), r / ep);
    EXPECT_EQ(groups[r].dp->size(), dp);
    EXPECT_EQ(groups[r].world->name(), "local");
  }
  EXPECT_EQ(EpGroupRanks(4, 3), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(DpGroupRanks(4, 3, 2), (std::vector<int>{1, 4}));
}

TEST(LocalGroupsTest, SubGroupsExchangeOnlyAmongTheirMembers) {
  const int ep = 2, dp = 3;
  std::vector<RankGroups> groups = CreateLocalGroups(ep, dp, kTestTimeout);
  RunRankThreads(ep * dp, [&](int r) {
    // Each rank sends its world rank to every member of its EP group, then of its DP group.
    for (Communicator* comm : {groups[r].ep.get(), groups[r].dp.get()}) {
      const bool is_ep = comm == groups[r].ep.get();
      const std::vector<int> members = is_ep ? EpGroupRanks(r, ep) : DpGroupRanks(r, ep, dp);
      std::vector<int32_t> send(comm->size(), r), recv(comm->size(), -1);
      ASSERT_TRUE(comm->AllToAll(send.data(), recv.data(), sizeof(int32_t)).ok());
      for (int p = 0; p < comm->size(); ++p) EXPECT_EQ(recv[p], members[p]);
    }
  });
}

class LocalCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(LocalCollectivesTest, AllToAllVRandomSizesIncludingZeros) {
  const int n = GetParam();
  std::vector<RankGroups> groups = CreateLocalGroups(n, 1, kTestTimeout);
  RunRankThreads(n, [&](int r) {
    testing::CheckAllToAllV(*groups[r].ep, 7 + n, 25, 300, testing::SliceLayout::kScattered);
    testing::CheckAllToAllV(*groups[r].ep, 9 + n, 25, 300, testing::SliceLayout::kPacked);
  });
}

TEST_P(LocalCollectivesTest, AllToAllVAllZero) {
  const int n = GetParam();
  std::vector<RankGroups> groups = CreateLocalGroups(1, n, kTestTimeout);
  RunRankThreads(n, [&](int r) {
    std::vector<int64_t> zeros(n, 0);
    EXPECT_TRUE(groups[r].dp->AllToAllV(nullptr, zeros, zeros, nullptr, zeros, zeros).ok());
  });
}

TEST_P(LocalCollectivesTest, AllToAllRepeated) {
  const int n = GetParam();
  std::vector<RankGroups> groups = CreateLocalGroups(n, 1, kTestTimeout);
  RunRankThreads(n, [&](int r) {
    for (int round = 0; round < 10; ++round) testing::CheckAllToAll(*groups[r].world, round, round * 5);
  });
}

TEST_P(LocalCollectivesTest, AllReduceSumIsTheRankOrderSumOnEveryRank) {
  const int n = GetParam();
  std::vector<RankGroups> groups = CreateLocalGroups(1, n, kTestTimeout);
  RunRankThreads(n, [&](int r) {
    for (size_t count : {0, 1, 3, 1000, 4099}) {
      testing::CheckAllReduceSum(*groups[r].world, 100 + count, count, /*bit_exact=*/true);
    }
  });
}

TEST_P(LocalCollectivesTest, BarrierWaitsForEveryRank) {
  const int n = GetParam();
  std::vector<RankGroups> groups = CreateLocalGroups(n, 1, kTestTimeout);
  std::atomic<int> arrived{0};
  RunRankThreads(n, [&](int r) {
    for (int round = 1; round <= 20; ++round) {
      arrived.fetch_add(1);
      ASSERT_TRUE(groups[r].world->Barrier().ok());
      EXPECT_GE(arrived.load(), round * n);
      ASSERT_TRUE(groups[r].world->Barrier().ok());  // nobody starts the next round early
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, LocalCollectivesTest, ::testing::Values(1, 2, 3, 4, 8));

TEST(LocalGroupsTest, MismatchedSizesFailOnEveryRankAndTheGroupStaysUsable) {
  std::vector<RankGroups> groups = CreateLocalGroups(2, 1, kTestTimeout);
  RunRankThreads(2, [&](int r) {
    std::vector<uint8_t> send(8, 1), recv(8, 0);
    std::vector<int64_t> send_bytes = {4, 4}, offsets = {0, 4};
    // Rank 1 expects 3 bytes from rank 0, which sends 4.
    std::vector<int64_t> recv_bytes = r == 1 ? std::vector<int64_t>{3, 4} : std::vector<int64_t>{4, 4};
    absl::Status s = groups[r].world->AllToAllV(send.data(), send_bytes, offsets, recv.data(),
                                                recv_bytes, offsets);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    testing::CheckAllToAll(*groups[r].world, 0, 16);
  });
}

TEST(LocalGroupsTest, NegativeSizeOnOneRankFailsEveryRank) {
  std::vector<RankGroups> groups = CreateLocalGroups(3, 1, kTestTimeout);
  RunRankThreads(3, [&](int r) {
    std::vector<uint8_t> buf(8, 0);
    std::vector<int64_t> sizes = {0, 0, r == 2 ? -1 : 0}, offsets = {0, 0, 0};
    absl::Status s = groups[r].world->AllToAllV(buf.data(), sizes, offsets, buf.data(), sizes, offsets);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  });
}

TEST(LocalGroupsTest, DifferentCollectivesOnDifferentRanksFail) {
  std::vector<RankGroups> groups = CreateLocalGroups(2, 1, kTestTimeout);
  RunRankThreads(2, [&](int r) {
    float x = 1.0f;
    absl::Status s = r == 0 ? groups[r].world->Barrier() : groups[r].world->AllReduceSum(&x, 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  });
}

TEST(LocalGroupsTest, MissingRankGivesDeadlineExceededOnTheOthers) {
  const absl::Duration timeout = absl::Milliseconds(300);
  std::vector<RankGroups> groups = CreateLocalGroups(3, 1, timeout);
  RunRankThreads(2, [&](int r) {  // rank 2 never calls
    const absl::Time start = absl::Now();
    absl::Status s = groups[r].world->Barrier();
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_LT(absl::Now() - start, timeout + absl::Seconds(5));
    // The group stays failed rather than pairing later calls with a stale barrier.
    EXPECT_EQ(groups[r].world->Barrier().code(), absl::StatusCode::kDeadlineExceeded);
  });
}

}  // namespace
}  // namespace dropless
