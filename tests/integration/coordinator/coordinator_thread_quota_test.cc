// The coordinator's per-listener thread quota (--max-server-threads): once every server thread
// holds a call, a further call is refused with RESOURCE_EXHAUSTED instead of a new thread, the
// calls already held keep being served, and the server serves again once they end.
#include <atomic>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"

namespace dropless::testing {
namespace {

constexpr int kMaxServerThreads = 16;  // the smallest quota the coordinator accepts

struct HeldWatch {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::JobUpdate>> reader;
  std::atomic<bool> served{false};  // read its first update: it holds a server thread
  std::atomic<bool> ended{false};
  grpc::Status status;
};

TEST(CoordinatorThreadQuotaTest, CallsPastTheQuotaAreRefusedAndTheServerRecovers) {
  // The coordinator's own stream limits far above the quota, so that only threads run out.
  auto c = CoordinatorUnderTest::Start("", kLeaseMs,
                                       {absl::StrCat("--max-server-threads=", kMaxServerThreads),
                                        "--max-streams=1000", "--max-streams-per-user=1000"});
  absl::StatusOr<v1::Job> job = c->Submit(TinySpec(1));  // no worker: stays PENDING
  ASSERT_TRUE(job.ok()) << job.status();

  constexpr int kWatches = 3 * kMaxServerThreads;
  std::vector<std::unique_ptr<HeldWatch>> watches;
  std::vector<std::thread> threads;
  for (int i = 0; i < kWatches; ++i) {
    HeldWatch* w = watches.emplace_back(std::make_unique<HeldWatch>()).get();
    v1::WatchJobRequest request;
    request.set_id(job->id());
    w->reader = c->jobs().WatchJob(&w->context, request);
    threads.emplace_back([w] {
      v1::JobUpdate update;
      while (w->reader->Read(&update)) w->served = true;
      w->status = w->reader->Finish();
      w->ended = true;
    });
  }
  // Every watch is either served (holding a thread) or has ended.
  auto settled = [&] {
    for (auto& w : watches) {
      if (!w->served.load() && !w->ended.load()) return false;
    }
    return true;
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!settled() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(settled());

  int served = 0, refused = 0;
  for (auto& w : watches) {
    if (w->served.load()) {
      EXPECT_FALSE(w->ended.load()) << "a served watch ended early: " << w->status.error_message();
      ++served;
    } else {
      EXPECT_EQ(w->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << w->status.error_message();
      ++refused;
    }
  }
  EXPECT_GE(served, 1);
  EXPECT_LT(served, kMaxServerThreads) << "more calls held than the quota has threads";
  EXPECT_GE(refused, kWatches - kMaxServerThreads);

  // Cancelling the job ends every watch if the cancel finds a thread; with all of them held it
  // is refused like any other call, and the watchers walk away instead: either way every held
  // handler returns and gives its thread back.
  {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_id(job->id());
    v1::Job cancelled;
    grpc::Status status = c->jobs().CancelJob(&context, request, &cancelled);
    if (!status.ok()) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      for (auto& w : watches) w->context.TryCancel();
    }
  }
  for (std::thread& t : threads) t.join();
  // The server gives a call's thread back once its handler has returned: poll a little.
  absl::StatusOr<v1::Job> after = c->Get(job->id());
  const absl::Time start = absl::Now();
  while (!after.ok() && absl::Now() < start + absl::Seconds(10)) {
    EXPECT_EQ(after.status().code(), absl::StatusCode::kResourceExhausted) << after.status();
    absl::SleepFor(absl::Milliseconds(50));
    after = c->Get(job->id());
  }
  ASSERT_TRUE(after.ok()) << after.status();
  std::cerr << "served " << served << ", refused " << refused << ", serving again after "
            << absl::Now() - start << "\n";
  absl::StatusOr<v1::Job> next = c->Submit(TinySpec(1), "after-the-quota");
  EXPECT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(c->process().Running());
}

}  // namespace
}  // namespace dropless::testing
