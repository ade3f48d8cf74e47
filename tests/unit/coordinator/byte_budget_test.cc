// ByteBudget bounds what a worker session's reader thread holds ahead of the coordinator.
#include "coordinator/util/byte_budget.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

// True once `done` is set within `timeout`.
bool Eventually(const std::atomic<bool>& done, absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done.load() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  return done.load();
}

TEST(ByteBudgetTest, TakeWaitsPastTheLimitUntilTheConsumerGivesBack) {
  ByteBudget budget(100);
  ASSERT_TRUE(budget.Take(60));
  ASSERT_TRUE(budget.Take(40));
  EXPECT_EQ(budget.held(), 100u);
  std::atomic<bool> taken{false};
  std::thread producer([&] {
    EXPECT_TRUE(budget.Take(30));
    taken = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(taken.load()) << "took 30 bytes past a full budget of 100";
  budget.Give(20);  // 80 held: 30 more would be 110
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(taken.load()) << "took 30 bytes with 80 of 100 held";
  budget.Give(60);  // 20 held
  EXPECT_TRUE(Eventually(taken));
  producer.join();
  EXPECT_EQ(budget.held(), 50u);
}

TEST(ByteBudgetTest, AnItemLargerThanTheLimitGoesWhenNothingIsHeld) {
  ByteBudget budget(100);
  ASSERT_TRUE(budget.Take(10));
  std::atomic<bool> taken{false};
  std::thread producer([&] {
    EXPECT_TRUE(budget.Take(1000));
    taken = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(taken.load());
  budget.Give(10);
  EXPECT_TRUE(Eventually(taken));
  producer.join();
  EXPECT_EQ(budget.held(), 1000u);
  budget.Give(5000);  // never below zero
  EXPECT_EQ(budget.held(), 0u);
}

TEST(ByteBudgetTest, CloseWakesAWaitingProducerWithNothingTaken) {
  ByteBudget budget(10);
  ASSERT_TRUE(budget.Take(10));
  std::atomic<bool> returned{false};
  std::atomic<bool> result{true};
  std::thread producer([&] {
    result = budget.Take(5);
    returned = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(returned.load());
  budget.Close();
  EXPECT_TRUE(Eventually(returned));
  producer.join();
  EXPECT_FALSE(result.load());
  EXPECT_EQ(budget.held(), 10u);
  EXPECT_FALSE(budget.Take(1));
}

}  // namespace
}  // namespace dropless::coordinator
