#include "coordinator/controller/watch_hub.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

v1::JobUpdate Update(int64_t step) {
  v1::JobUpdate update;
  update.mutable_metrics()->set_step(step);
  return update;
}

v1::LogLine Line(const std::string& job, int32_t rank, const std::string& text) {
  v1::LogLine line;
  line.set_job_id(job);
  line.set_rank(rank);
  line.set_text(text);
  return line;
}

TEST(WatchHubTest, UpdatesReachTheJobsWatchersUntilTheJobCloses) {
  WatchHub hub(16, 16);
  EXPECT_FALSE(hub.Watched("job-1"));
  auto a = hub.Watch("job-1");
  auto b = hub.Watch("job-1");
  auto other = hub.Watch("job-2");
  EXPECT_TRUE(hub.Watched("job-1"));
  hub.Publish("job-1", Update(7));
  v1::JobUpdate got;
  for (auto* mailbox : {&a, &b}) {
    ASSERT_EQ((*mailbox)->Pop(absl::ZeroDuration(), &got), Mailbox<v1::JobUpdate>::Result::kItem);
    EXPECT_EQ(got.metrics().step(), 7);
  }
  EXPECT_EQ(other->Pop(absl::ZeroDuration(), &got), Mailbox<v1::JobUpdate>::Result::kTimeout);

  hub.EndWatch("job-1", a);  // a stream that ended: no more updates
  hub.Publish("job-1", Update(8));
  EXPECT_EQ(a->Pop(absl::ZeroDuration(), &got), Mailbox<v1::JobUpdate>::Result::kTimeout);
  hub.CloseJob("job-1");  // what is queued drains, then the stream ends
  ASSERT_EQ(b->Pop(absl::ZeroDuration(), &got), Mailbox<v1::JobUpdate>::Result::kItem);
  EXPECT_EQ(got.metrics().step(), 8);
  EXPECT_EQ(b->Pop(absl::ZeroDuration(), &got), Mailbox<v1::JobUpdate>::Result::kClosed);
  EXPECT_FALSE(hub.Watched("job-1"));
  hub.CloseAll();
  EXPECT_EQ(other->Pop(absl::ZeroDuration(), &got), Mailbox<v1::JobUpdate>::Result::kClosed);
}

TEST(WatchHubTest, LogFollowersGetTheirRanksLines) {
  WatchHub hub(16, 16);
  auto all = hub.FollowLogs("job-1", std::nullopt);
  auto rank1 = hub.FollowLogs("job-1", 1);
  hub.PublishLog(Line("job-1", 0, "zero"));
  hub.PublishLog(Line("job-1", 1, "one"));
  hub.PublishLog(Line("job-2", 1, "elsewhere"));
  v1::LogLine got;
  ASSERT_EQ(rank1->Pop(absl::ZeroDuration(), &got), Mailbox<v1::LogLine>::Result::kItem);
  EXPECT_EQ(got.text(), "one");
  EXPECT_EQ(rank1->Pop(absl::ZeroDuration(), &got), Mailbox<v1::LogLine>::Result::kTimeout);
  ASSERT_EQ(all->Pop(absl::ZeroDuration(), &got), Mailbox<v1::LogLine>::Result::kItem);
  EXPECT_EQ(got.text(), "zero");
  hub.EndLogs("job-1", all);
  hub.CloseJob("job-1");
  ASSERT_EQ(rank1->Pop(absl::ZeroDuration(), &got), Mailbox<v1::LogLine>::Result::kClosed);
}

// A follower that does not read (a paused `logs -f | less`) pins at most the byte bound: past it
// lines are dropped and the overflow noted (the stream tells its reader), whatever the line count.
TEST(WatchHubTest, AFollowerThatDoesNotReadHoldsAtMostItsByteBound) {
  WatchHub hub(/*update_capacity=*/4096, /*log_capacity=*/65536, /*update_bytes=*/1 << 20,
               /*log_bytes=*/64 << 10);
  auto stalled = hub.FollowLogs("job-1", std::nullopt);
  auto watcher = hub.Watch("job-1");
  const std::string text(16 * 1024, 'x');
  for (int i = 0; i < 100; ++i) hub.PublishLog(Line("job-1", 0, text));
  EXPECT_LE(stalled->bytes(), size_t{64} << 10);
  EXPECT_GE(stalled->bytes(), size_t{48} << 10);  // filled up to the bound
  EXPECT_TRUE(stalled->TakeOverflow());
  v1::LogLine got;
  int lines = 0;
  while (stalled->Pop(absl::ZeroDuration(), &got) == Mailbox<v1::LogLine>::Result::kItem) ++lines;
  EXPECT_EQ(lines, 3);
  EXPECT_EQ(stalled->bytes(), 0u);
  // After draining, it takes lines again; one line larger than the bound still goes when empty.
  hub.PublishLog(Line("job-1", 0, std::string(100 * 1024, 'y')));
  ASSERT_EQ(stalled->Pop(absl::ZeroDuration(), &got), Mailbox<v1::LogLine>::Result::kItem);
  EXPECT_EQ(got.text().size(), 100u * 1024);
  // A watcher's updates likewise.
  v1::JobUpdate big;
  big.mutable_job()->set_spec_yaml(std::string(400 * 1024, 's'));
  for (int i = 0; i < 10; ++i) hub.Publish("job-1", big);
  EXPECT_LE(watcher->bytes(), size_t{1} << 20);
  EXPECT_TRUE(watcher->TakeOverflow());
}

}  // namespace
}  // namespace dropless::coordinator
