// The workers' rows in the job store (job_store_workers.cc): since when a LOST worker has been
// away survives a reopen (schema 5), a forgotten worker's row and receipt are deleted while the
// highest worker number given is kept, and a file of schema 4 opens with no time known.
#include <stdlib.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/store/job_store.h"
#include "coordinator/store/sqlite.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

std::string TempDbPath() {
  std::string dir = ::testing::TempDir();
  std::string pattern = absl::StrCat(dir, dir.empty() || dir.back() != '/' ? "/" : "",
                                     "job_store_workers_test_XXXXXX");
  EXPECT_NE(mkdtemp(pattern.data()), nullptr);
  return pattern + "/dropless.db";
}

WorkerRecord Worker(const std::string& id, v1::WorkerState state, int64_t lost_since_ms) {
  WorkerRecord row;
  row.info.set_id(id);
  row.info.set_node(absl::StrCat("node-", id));
  row.info.set_slot_kind("cpu");
  row.info.set_slots(1);
  row.info.set_state(state);
  row.lost_since_ms = lost_since_ms;
  return row;
}

TEST(JobStoreWorkersTest, AwayTimesSurviveAndForgottenWorkersGoWithTheirReceipts) {
  const std::string path = TempDbPath();
  {
    auto opened = JobStore::Open(path);
    ASSERT_TRUE(opened.ok()) << opened.status();
    JobStore& store = **opened;
    StoreWrite write;
    write.workers = {Worker("worker-0001", v1::WORKER_STATE_LOST, 1234),
                     Worker("worker-0002", v1::WORKER_STATE_READY, 0),
                     Worker("worker-0007", v1::WORKER_STATE_LOST, 99)};
    ASSERT_TRUE(store.Commit(write).ok());
    v1::LogLine line;
    line.set_job_id("job-000001");
    line.set_text("x");
    const WorkerReceipt receipt{"worker-0007", "boot-a", 5};
    ASSERT_TRUE(store.AppendLogs({line}, &receipt).ok());

    // worker-0007 forgotten: its row and receipt go, in the same commit as another row's upsert.
    StoreWrite forget;
    forget.workers = {Worker("worker-0002", v1::WORKER_STATE_LOST, 5678)};
    forget.forgotten_workers = {"worker-0007"};
    forget.last_worker_number = 7;
    ASSERT_FALSE(forget.empty());
    ASSERT_TRUE(store.Commit(forget).ok());
  }
  auto reopened = JobStore::Open(path);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  absl::StatusOr<ActiveState> active = (*reopened)->LoadActive();
  ASSERT_TRUE(active.ok()) << active.status();
  ASSERT_EQ(active->workers.size(), 2u);
  EXPECT_EQ(active->workers[0].info.id(), "worker-0001");
  EXPECT_EQ(active->workers[0].lost_since_ms, 1234);
  EXPECT_EQ(active->workers[1].info.id(), "worker-0002");
  EXPECT_EQ(active->workers[1].info.state(), v1::WORKER_STATE_LOST);
  EXPECT_EQ(active->workers[1].lost_since_ms, 5678);
  EXPECT_TRUE(active->receipts.empty()) << "the forgotten worker's receipt went with it";
  EXPECT_EQ(active->last_worker_number, 7);

  // The counter only rises.
  StoreWrite lower;
  lower.last_worker_number = 3;
  ASSERT_TRUE((*reopened)->Commit(lower).ok());
  EXPECT_EQ((*reopened)->LoadActive()->last_worker_number, 7);
}

// A file of schema version 4 (no lost_since_ms) opens: its workers' away times are unknown (0),
// which the registry reads as "away from this start".
TEST(JobStoreWorkersTest, VersionFourFileGainsAwayTimes) {
  const std::string path = TempDbPath();
  {
    auto opened = JobStore::Open(path);
    ASSERT_TRUE(opened.ok());
    StoreWrite write;
    write.workers = {Worker("worker-0001", v1::WORKER_STATE_LOST, 1234)};
    ASSERT_TRUE((*opened)->Commit(write).ok());
  }
  {
    auto db = SqliteDb::Open(path);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE(
        (*db)->Exec("ALTER TABLE workers DROP COLUMN lost_since_ms; PRAGMA user_version=4").ok());
  }
  auto opened = JobStore::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  absl::StatusOr<ActiveState> active = (*opened)->LoadActive();
  ASSERT_TRUE(active.ok()) << active.status();
  ASSERT_EQ(active->workers.size(), 1u);
  EXPECT_EQ(active->workers[0].info.id(), "worker-0001");
  EXPECT_EQ(active->workers[0].lost_since_ms, 0);
  EXPECT_EQ(active->last_worker_number, 0);
}

}  // namespace
}  // namespace dropless::coordinator
