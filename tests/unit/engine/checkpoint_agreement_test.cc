// The step a job's ranks resume from: the rule on every rank's holdings, and the exchange of those
// holdings over a group of ranks in threads (each rank knows only its own).
#include "worker/engine/checkpoint/checkpoint_agreement.h"

#include <thread>
#include <vector>

#include "common/job_error.h"
#include "gtest/gtest.h"
#include "worker/transport/transport_factory.h"

namespace dropless::engine {
namespace {

HeldCheckpoints Held(std::vector<int64_t> steps) {
  HeldCheckpoints h;
  h.steps = std::move(steps);
  return h;
}

TEST(CheckpointAgreementTest, TheNewestStepEveryRankHolds) {
  EXPECT_EQ(*AgreeOnCheckpointStep("d", {Held({8, 4}), Held({8, 4})}), 8);
  // Rank 1 was killed before committing 8: everyone goes back to 4.
  EXPECT_EQ(*AgreeOnCheckpointStep("d", {Held({8, 4}), Held({4}), Held({8, 4})}), 4);
  EXPECT_EQ(*AgreeOnCheckpointStep("d", {Held({8, 4}), Held({4, 0})}), 4);
  // No checkpoint anywhere, or the first one cut short on some rank: a fresh start.
  EXPECT_EQ(*AgreeOnCheckpointStep("d", {Held({}), Held({})}), 0);
  EXPECT_EQ(*AgreeOnCheckpointStep("d", {Held({4}), Held({})}), 0);
  EXPECT_EQ(*AgreeOnCheckpointStep("d", {}), 0);
}

TEST(CheckpointAgreementTest, NoCommonStepOrAnUnreadableManifestIsRefused) {
  absl::StatusOr<int64_t> apart = AgreeOnCheckpointStep("ckpt", {Held({12, 8}), Held({4})});
  ASSERT_EQ(apart.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(apart.status().message().find("checkpoint.dir ckpt"), std::string::npos);
  EXPECT_NE(apart.status().message().find("rank 0: 12, 8; rank 1: 4"), std::string::npos)
      << apart.status();
  // Some ranks hold none while another holds two: not a first checkpoint cut short.
  EXPECT_FALSE(AgreeOnCheckpointStep("d", {Held({8, 4}), Held({})}).ok());
  HeldCheckpoints unreadable;
  unreadable.unreadable = true;
  absl::StatusOr<int64_t> bad = AgreeOnCheckpointStep("d", {Held({4}), unreadable});
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(bad.status().message().find("rank 1 could not read"), std::string::npos);
  EXPECT_FALSE(IsJobError(bad.status()));  // that rank's own error may be an I/O error's
  unreadable.unreadable_job_error = true;  // damaged: every rank fails with a job error
  bad = AgreeOnCheckpointStep("d", {Held({4}), unreadable});
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(IsJobError(bad.status())) << bad.status();
  // One damaged manifest, one that an I/O error kept from being read: a retry on every rank.
  HeldCheckpoints io_error;
  io_error.unreadable = true;
  const absl::Status damaged = MarkJobError(absl::DataLossError("manifest: not JSON"));
  for (const absl::Status& local : {absl::OkStatus(), damaged}) {
    bad = AgreeOnCheckpointStep("d", {Held({4}), unreadable, io_error}, local);
    ASSERT_FALSE(bad.ok());
    EXPECT_FALSE(IsJobError(bad.status())) << bad.status();
  }
  EXPECT_EQ(AgreeOnCheckpointStep("d", {Held({4}), unreadable}, damaged).status(), damaged);
}

// Six ranks in three processes of two ranks each (as the CUDA engine's local ranks) and six
// processes of one rank: every rank ends with everyone's holdings, unreadable ones included.
TEST(CheckpointAgreementTest, ExchangeGivesEveryRankEveryonesHoldings) {
  HeldCheckpoints damaged, unreadable;
  damaged.unreadable = damaged.unreadable_job_error = unreadable.unreadable = true;
  const std::vector<HeldCheckpoints> truth = {Held({8, 4}),  Held({4}), Held({}),
                                              Held({12, 8}), damaged,   unreadable};
  for (int per_process : {1, 2}) {
    const int processes = 6 / per_process;
    std::vector<RankGroups> groups = CreateLocalGroups(processes, 1);
    std::vector<std::vector<HeldCheckpoints>> got(processes);
    std::vector<std::thread> threads;
    for (int p = 0; p < processes; ++p) {
      threads.emplace_back([&, p] {
        std::vector<HeldCheckpoints> local(truth.begin() + p * per_process,
                                           truth.begin() + (p + 1) * per_process);
        absl::StatusOr<std::vector<HeldCheckpoints>> all =
            ExchangeHeldCheckpoints(groups[p].world.get(), 6, p * per_process, local);
        ASSERT_TRUE(all.ok()) << all.status();
        got[p] = *all;
      });
    }
    for (std::thread& t : threads) t.join();
    for (int p = 0; p < processes; ++p) {
      ASSERT_EQ(got[p].size(), truth.size());
      for (size_t r = 0; r < truth.size(); ++r) {
        EXPECT_EQ(got[p][r].steps, truth[r].steps) << "process " << p << " rank " << r;
        EXPECT_EQ(got[p][r].unreadable, truth[r].unreadable) << "process " << p << " rank " << r;
        EXPECT_EQ(got[p][r].unreadable_job_error, truth[r].unreadable_job_error) << r;
      }
    }
  }
  // Without a group the local ranks must be the whole job.
  EXPECT_TRUE(ExchangeHeldCheckpoints(nullptr, 2, 0, {Held({4}), Held({4})}).ok());
  EXPECT_EQ(ExchangeHeldCheckpoints(nullptr, 4, 0, {Held({4})}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Three ranks in threads agree on their reads (`read[r]`): what each returns, and *only_damaged.
struct Agreed {
  std::vector<absl::Status> status = std::vector<absl::Status>(3);
  std::vector<bool> only_damaged = std::vector<bool>(3, false);
};
Agreed AgreeInThreads(const std::vector<absl::Status>& read) {
  std::vector<RankGroups> groups = CreateLocalGroups(3, 1);
  Agreed out;
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      bool d = false;
      out.status[r] = AgreeOnRestoreOutcome(groups[r].world.get(), 3, r, {read[r]}, "ckpt", &d);
      out.only_damaged[r] = d;
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

// Each rank reads its own files: when one cannot, every rank fails, and as a job error on all of
// them when that rank's error is one (the coordinator acts on whichever exit it hears first).
TEST(CheckpointAgreementTest, EveryRankFailsAlikeWhenOneCannotRestore) {
  const absl::Status ok, damaged = MarkJobError(absl::DataLossError("rank-1-step-8: checksum"));
  const absl::Status io = absl::InternalError("read: I/O error");
  for (const absl::Status& failure : {ok, damaged, io}) {
    const Agreed got = AgreeInThreads({ok, failure, ok});
    if (failure.ok()) {
      for (const absl::Status& s : got.status) EXPECT_TRUE(s.ok()) << s;
      continue;
    }
    EXPECT_EQ(got.status[1], failure);  // the rank that failed reports its own error
    for (int r : {0, 2}) {
      EXPECT_EQ(got.status[r].code(), absl::StatusCode::kFailedPrecondition) << got.status[r];
      EXPECT_NE(got.status[r].message().find("rank 1 could not restore"), std::string::npos)
          << got.status[r];
      EXPECT_EQ(IsJobError(got.status[r]), IsJobError(failure)) << got.status[r];
    }
  }
  // Rank 1's files damaged (a job error) and rank 2's read failed otherwise (worth a retry): one
  // verdict everywhere, a retry; rank 1's own error without its mark.
  const Agreed mixed = AgreeInThreads({ok, damaged, io});
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(mixed.status[r].ok() || IsJobError(mixed.status[r])) << r << mixed.status[r];
  }
  EXPECT_EQ(mixed.status[1].code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(mixed.status[1].message(), damaged.message());
  EXPECT_EQ(mixed.status[2], io);
  EXPECT_NE(mixed.status[0].message().find("rank 1 could not restore"), std::string::npos);
  // Damaged files (DataLoss) on some rank and nothing else: the ranks may go back together.
  for (const absl::Status& other : {ok, damaged, io}) {
    const Agreed got = AgreeInThreads({ok, damaged, other});
    for (int r = 0; r < 3; ++r) EXPECT_EQ(got.only_damaged[r], other.code() != io.code()) << r;
  }
  // One process holding every rank needs no group.
  EXPECT_EQ(AgreeOnRestoreOutcome(nullptr, 2, 0, {ok, damaged}, "d"), damaged);
  EXPECT_EQ(AgreeOnRestoreOutcome(nullptr, 4, 0, {ok}, "d").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointAgreementTest, TheOlderStepEveryRankHolds) {
  EXPECT_EQ(OlderCommonStep({Held({8, 4}), Held({8, 4})}, 8), std::optional<int64_t>(4));
  EXPECT_EQ(OlderCommonStep({Held({8, 4}), Held({8})}, 8), std::nullopt);
  EXPECT_EQ(OlderCommonStep({Held({8, 4}), Held({8, 4})}, 4), std::nullopt);
  EXPECT_EQ(OlderCommonStep({Held({12, 8}), Held({8, 4})}, 12), std::optional<int64_t>(8));
  EXPECT_EQ(OlderCommonStep({}, 8), std::nullopt);
}

}  // namespace
}  // namespace dropless::engine
