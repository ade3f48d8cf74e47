// What failed commits keep for the next one stays bounded however long the store fails: the
// latest row per attempt and per worker, and the newest events up to the cap, with one event
// that counts the dropped ones.
#include "coordinator/controller/unstored_writes.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

using ::testing::HasSubstr;

WorkerRecord WorkerRow(const std::string& id, v1::WorkerState state) {
  WorkerRecord w;
  w.info.set_id(id);
  w.info.set_state(state);
  return w;
}

v1::Event EventOf(const std::string& type, int64_t time_ms) {
  v1::Event e;
  e.set_type(type);
  e.set_time_ms(time_ms);
  return e;
}

AttemptRecord AttemptRow(const std::string& job_id, int32_t attempt, v1::JobState state) {
  AttemptRecord a;
  a.job_id = job_id;
  a.attempt = attempt;
  a.state = state;
  return a;
}

// A worker that reconnects every few seconds through an outage: one row kept for it (its
// latest), and one for each (job, attempt), whatever the number of failed commits.
TEST(UnstoredWritesTest, KeepsTheLatestRowPerWorkerAndAttempt) {
  UnstoredWrites kept;
  EXPECT_TRUE(kept.empty());
  for (int round = 0; round < 1000; ++round) {
    kept.Keep({AttemptRow("job-1", 1, v1::JOB_STATE_FAILED)},
              {WorkerRow("w-1", v1::WORKER_STATE_LOST), WorkerRow("w-2", v1::WORKER_STATE_LOST)},
              {});
    kept.Keep({AttemptRow("job-1", 2, v1::JOB_STATE_CANCELLED)},
              {WorkerRow("w-1", v1::WORKER_STATE_READY)}, {});
  }
  EXPECT_EQ(kept.workers(), 2u);
  EXPECT_EQ(kept.attempts(), 2u);

  StoreWrite write;
  write.workers.push_back(WorkerRow("w-2", v1::WORKER_STATE_READY));  // newer: after the kept
  kept.PrependTo(write);
  ASSERT_EQ(write.workers.size(), 3u);
  EXPECT_EQ(write.workers[0].info.id(), "w-1");
  EXPECT_EQ(write.workers[0].info.state(), v1::WORKER_STATE_READY) << "the latest row of w-1";
  EXPECT_EQ(write.workers[2].info.state(), v1::WORKER_STATE_READY) << "the write's own row last";
  ASSERT_EQ(write.attempts.size(), 2u);
  EXPECT_EQ(write.attempts[0].state, v1::JOB_STATE_FAILED);
  EXPECT_EQ(write.attempts[1].state, v1::JOB_STATE_CANCELLED);

  kept.Clear();
  EXPECT_TRUE(kept.empty());
}

// A worker forgotten while the store fails: its kept row goes (it would bring the worker back),
// its deletion and the highest worker number are kept, once, and come before the write's own.
TEST(UnstoredWritesTest, KeepsTheForgottenWorkersInsteadOfTheirRows) {
  UnstoredWrites kept;
  kept.Keep({}, {WorkerRow("w-1", v1::WORKER_STATE_LOST), WorkerRow("w-2", v1::WORKER_STATE_LOST)},
            {});
  kept.KeepForgotten({"w-1"}, 7);
  kept.KeepForgotten({"w-1"}, 5);
  EXPECT_FALSE(kept.empty());
  EXPECT_EQ(kept.workers(), 1u);
  EXPECT_EQ(kept.forgotten_workers(), 1u);

  StoreWrite write;
  write.forgotten_workers.push_back("w-3");
  write.last_worker_number = 3;
  kept.PrependTo(write);
  ASSERT_EQ(write.workers.size(), 1u);
  EXPECT_EQ(write.workers[0].info.id(), "w-2");
  EXPECT_EQ(write.forgotten_workers, (std::vector<std::string>{"w-1", "w-3"}));
  EXPECT_EQ(write.last_worker_number, 7) << "the highest";

  kept.Clear();
  EXPECT_TRUE(kept.empty());
}

// Beyond the cap the oldest events go, and one EventsDropped (at the time of the first dropped)
// stands first in their place; the newest are kept in order.
TEST(UnstoredWritesTest, KeepsTheNewestEventsAndCountsTheDropped) {
  UnstoredWrites kept(/*max_events=*/10);
  for (int i = 0; i < 25; ++i) kept.Keep({}, {}, {EventOf(absl::StrCat("E", i), 1000 + i)});
  EXPECT_EQ(kept.events(), 10u);
  EXPECT_EQ(kept.dropped_events(), 15);

  StoreWrite write;
  write.events.push_back(EventOf("Own", 2000));
  kept.PrependTo(write);
  ASSERT_EQ(write.events.size(), 12u);
  EXPECT_EQ(write.events[0].type(), "EventsDropped");
  EXPECT_EQ(write.events[0].job_id(), "") << "a cluster event";
  EXPECT_EQ(write.events[0].time_ms(), 1000);
  EXPECT_THAT(write.events[0].message(), HasSubstr("15 events were dropped"));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(write.events[1 + i].type(), absl::StrCat("E", 15 + i));
  EXPECT_EQ(write.events[11].type(), "Own");

  kept.Clear();
  StoreWrite after;
  kept.PrependTo(after);
  EXPECT_TRUE(after.events.empty()) << "the count is stored once";
}

}  // namespace
}  // namespace dropless::coordinator
