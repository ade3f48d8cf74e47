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

}  // namespace
}  // namespace dropless::coordinator
