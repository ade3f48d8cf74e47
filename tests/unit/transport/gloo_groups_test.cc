// Gloo groups of 1, 2 and 4 ranks, each rank a thread with its own TCP device on 127.0.0.1,
// rendezvoused through the in-memory store.
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/unit/transport/collective_checks.h"
#include "tests/unit/transport/rank_threads.h"
#include "worker/transport/rank_layout.h"
#include "worker/transport/transport_factory.h"

namespace dropless {
namespace {

using testing::RunRankThreads;

constexpr absl::Duration kTestTimeout = absl::Seconds(60);

GlooOptions Options(int rank, int ep, int dp, absl::Duration timeout = kTestTimeout) {
  GlooOptions options;
  options.layout.rank = rank;
  options.layout.world_size = ep * dp;
  options.layout.ep = ep;
  options.layout.dp = dp;
  options.host = "127.0.0.1";
  options.connect_timeout = timeout;
  options.collective_timeout = timeout;
  return options;
}

// Runs `body` on every rank of an ep x dp job after creating its Gloo groups.
void RunGlooJob(int ep, int dp, const std::function<void(int rank, RankGroups& groups)>& body) {
  std::unique_ptr<KeyValueStore> store = NewMemoryKvStore();
  RunRankThreads(ep * dp, [&](int r) {
    absl::StatusOr<RankGroups> groups = CreateGlooGroups(Options(r, ep, dp), store.get());
    ASSERT_TRUE(groups.ok()) << "rank " << r << ": " << groups.status();
    body(r, *groups);
  });
}

class GlooWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooWorldTest, AllToAllVRandomSizesIncludingZeros) {
  const int n = GetParam();
  RunGlooJob(n, 1, [&](int, RankGroups& g) {
    EXPECT_EQ(g.world->name(), "gloo");
    testing::CheckAllToAllV(*g.world, 11 + n, 15, 5000, testing::SliceLayout::kPacked);
    testing::CheckAllToAllV(*g.world, 13 + n, 15, 5000, testing::SliceLayout::kScattered);
    testing::CheckAllToAllV(*g.ep, 17 + n, 3, 300000, testing::SliceLayout::kPacked);
  });
}

TEST_P(GlooWorldTest, AllToAllVAllZero) {
  const int n = GetParam();
  RunGlooJob(n, 1, [&](int, RankGroups& g) {
    std::vector<int64_t> zeros(n, 0);
    for (int round = 0; round < 3; ++round) {
      absl::Status s = g.world->AllToAllV(nullptr, zeros, zeros, nullptr, zeros, zeros);
      EXPECT_TRUE(s.ok()) << s;
    }
  });
}

TEST_P(GlooWorldTest, AllToAll) {
  const int n = GetParam();
  RunGlooJob(n, 1, [&](int, RankGroups& g) {
    for (int round = 0; round < 5; ++round) testing::CheckAllToAll(*g.world, round, 1 + round * 37);
    testing::CheckAllToAll(*g.world, 9, 0);
  });
}

TEST_P(GlooWorldTest, AllReduceSumMatchesTheFp64SumAndIsIdenticalOnEveryRank) {
  const int n = GetParam();
  RunGlooJob(1, n, [&](int, RankGroups& g) {
    for (size_t count : {0, 1, 7, 1000, 300000}) {
      testing::CheckAllReduceSum(*g.world, 500 + count, count, /*bit_exact=*/false);
    }
  });
}

TEST_P(GlooWorldTest, BarrierRepeated) {
  const int n = GetParam();
  RunGlooJob(n, 1, [&](int, RankGroups& g) {
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(g.world->Barrier().ok());
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooWorldTest, ::testing::Values(1, 2, 4));

TEST(GlooGroupsTest, SubGroupsFollowTheRankLayout) {
  const int ep = 2, dp = 2;
  RunGlooJob(ep, dp, [&](int r, RankGroups& g) {
    ASSERT_EQ(g.world->rank(), r);
    ASSERT_EQ(g.ep->rank(), r % ep);
    ASSERT_EQ(g.ep->size(), ep);
    ASSERT_EQ(g.dp->rank(), r / ep);
    ASSERT_EQ(g.dp->size(), dp);
    for (Communicator* comm : {g.ep.get(), g.dp.get()}) {
      const std::vector<int> members =
          comm == g.ep.get() ? EpGroupRanks(r, ep) : DpGroupRanks(r, ep, dp);
      std::vector<int32_t> send(comm->size(), r), recv(comm->size(), -1);
      ASSERT_TRUE(comm->AllToAll(send.data(), recv.data(), sizeof(int32_t)).ok());
      for (int p = 0; p < comm->size(); ++p) EXPECT_EQ(recv[p], members[p]);
    }
    // The groups work interleaved, as the engine uses them.
    testing::CheckAllToAllV(*g.ep, 21, 5, 2000);
    testing::CheckAllReduceSum(*g.dp, 22, 513, /*bit_exact=*/false);
    testing::CheckAllToAllV(*g.world, 23, 5, 2000);
    ASSERT_TRUE(g.world->Barrier().ok());
  });
}

TEST(GlooGroupsTest, MissingPeerGivesDeadlineExceededWithinTheTimeout) {
  std::unique_ptr<KeyValueStore> store = NewMemoryKvStore();
  const absl::Duration timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  absl::StatusOr<RankGroups> groups = CreateGlooGroups(Options(0, 2, 1, timeout), store.get());
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kDeadlineExceeded) << groups.status();
  EXPECT_NE(groups.status().message().find("world"), std::string_view::npos) << groups.status();
  EXPECT_LT(absl::Now() - start, timeout + absl::Seconds(5));
}

TEST(GlooGroupsTest, PeerThatLeavesMakesCollectivesFailNotHang) {
  std::unique_ptr<KeyValueStore> store = NewMemoryKvStore();
  const absl::Duration timeout = absl::Seconds(2);
  RunRankThreads(2, [&](int r) {
    absl::StatusOr<RankGroups> groups = CreateGlooGroups(Options(r, 2, 1, timeout), store.get());
    ASSERT_TRUE(groups.ok()) << groups.status();
    ASSERT_TRUE(groups->world->Barrier().ok());
    if (r == 1) return;  // closes its connections
    absl::SleepFor(absl::Milliseconds(200));
    const absl::Time start = absl::Now();
    float x = 1.0f;
    absl::Status s = groups->world->AllReduceSum(&x, 1);
    EXPECT_FALSE(s.ok());
    EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable ||
                s.code() == absl::StatusCode::kDeadlineExceeded)
        << s;
    EXPECT_LT(absl::Now() - start, timeout + absl::Seconds(5));
    // The group stays failed.
    EXPECT_FALSE(groups->world->Barrier().ok());
  });
}

// The two timeouts are apart: a collective waits for a peer that is legitimately behind (skewed
// routing, a slow checkpoint write) longer than finding the peers may take. (Once one 120 s bound
// served both, and failed heavy CPU jobs whose slowest rank took longer than that.)
TEST(GlooGroupsTest, ACollectiveWaitsForASlowPeerLongerThanTheConnectTimeout) {
  std::unique_ptr<KeyValueStore> store = NewMemoryKvStore();
  RunRankThreads(2, [&](int r) {
    GlooOptions options = Options(r, 2, 1);
    options.connect_timeout = absl::Seconds(5);
    options.collective_timeout = absl::Seconds(60);
    absl::StatusOr<RankGroups> groups = CreateGlooGroups(options, store.get());
    ASSERT_TRUE(groups.ok()) << groups.status();
    if (r == 1) absl::SleepFor(absl::Seconds(8));  // behind by more than the connect timeout
    float x = static_cast<float>(r + 1);
    ASSERT_TRUE(groups->world->AllReduceSum(&x, 1).ok());
    EXPECT_EQ(x, 3.0f);
  });
}

TEST(GlooGroupsTest, InvalidOptionsNameTheField) {
  std::unique_ptr<KeyValueStore> store = NewMemoryKvStore();
  GlooOptions options = Options(0, 2, 2);
  options.layout.world_size = 3;
  EXPECT_EQ(CreateGlooGroups(options, store.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options(4, 2, 2);
  absl::Status s = CreateGlooGroups(options, store.get()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rank"), std::string_view::npos) << s;
  EXPECT_EQ(CreateGlooGroups(Options(0, 1, 1), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GlooGroupsTest, InvalidArgumentsAreRejectedBeforeAnyTraffic) {
  RunGlooJob(1, 1, [&](int, RankGroups& g) {
    std::vector<int64_t> wrong_length = {1, 2};
    std::vector<uint8_t> buf(4);
    EXPECT_EQ(g.world->AllToAllV(buf.data(), wrong_length, wrong_length, buf.data(), wrong_length,
                                 wrong_length).code(),
              absl::StatusCode::kInvalidArgument);
    std::vector<int64_t> one = {1}, zero = {0};
    EXPECT_EQ(g.world->AllToAllV(buf.data(), one, zero, buf.data(), {2}, zero).code(),
              absl::StatusCode::kInvalidArgument);
    // Still usable afterwards.
    testing::CheckAllToAllV(*g.world, 1, 2, 10);
  });
}

}  // namespace
}  // namespace dropless

namespace dropless {
namespace {

// Gloo itself aborts the process on such a mismatch; the communicator must catch it first.
TEST(GlooGroupsTest, MismatchedAllToAllVSizesFailOnBothRanksOfThePair) {
  std::unique_ptr<KeyValueStore> store = NewMemoryKvStore();
  RunRankThreads(2, [&](int r) {
    absl::StatusOr<RankGroups> groups =
        CreateGlooGroups(Options(r, 2, 1, absl::Seconds(10)), store.get());
    ASSERT_TRUE(groups.ok()) << groups.status();
    std::vector<uint8_t> send(8, 1), recv(8, 0);
    std::vector<int64_t> send_bytes = {4, 4}, offsets = {0, 4};
    // Rank 1 expects 3 bytes from rank 0, which sends 4.
    std::vector<int64_t> recv_bytes = r == 1 ? std::vector<int64_t>{3, 4} : std::vector<int64_t>{4, 4};
    absl::Status s = groups->world->AllToAllV(send.data(), send_bytes, offsets, recv.data(),
                                              recv_bytes, offsets);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("rank 0 sends 4 bytes to rank 1, which expects 3"),
              std::string_view::npos) << s;
  });
}

}  // namespace
}  // namespace dropless
