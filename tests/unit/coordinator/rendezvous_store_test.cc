#include "coordinator/rendezvous/rendezvous_store.h"

#include <atomic>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

using ::testing::HasSubstr;

TEST(RendezvousStoreTest, PutThenGetWithinTheAttemptOnly) {
  RendezvousStore store;
  store.Open("job-1", 1);
  store.Open("job-1", 2);
  ASSERT_TRUE(store.Put("job-1", 1, "nccl_id", std::string("\0\x01\x02", 3)).ok());
  auto value = store.Get("job-1", 1, "nccl_id");
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(*value, std::string("\0\x01\x02", 3));
  auto other_attempt = store.Get("job-1", 2, "nccl_id");
  EXPECT_EQ(other_attempt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(other_attempt.status().message(), HasSubstr("nccl_id"));
  ASSERT_TRUE(store.Put("job-1", 1, "nccl_id", "overwritten").ok());
  EXPECT_EQ(*store.Get("job-1", 1, "nccl_id"), "overwritten");
}

TEST(RendezvousStoreTest, CheckPutAnswersLikePutWithoutStoring) {
  RendezvousStore::Limits limits;
  limits.max_keys_per_attempt = 1;
  RendezvousStore store(limits);
  EXPECT_EQ(store.CheckPut("job-1", 1, "k", 1).code(), absl::StatusCode::kFailedPrecondition);
  store.Open("job-1", 1);
  EXPECT_TRUE(store.CheckPut("job-1", 1, "k", 1).ok());
  EXPECT_EQ(store.Get("job-1", 1, "k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.CheckPut("job-1", 1, "", 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.CheckPut("job-1", 1, "k", (1 << 20) + 1).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(store.Put("job-1", 1, "k", "v").ok());
  EXPECT_TRUE(store.CheckPut("job-1", 1, "k", 3).ok());  // an overwrite fits
  EXPECT_EQ(store.CheckPut("job-1", 1, "k2", 1).code(), absl::StatusCode::kResourceExhausted);
}

TEST(RendezvousStoreTest, InactiveAttemptIsRefused) {
  RendezvousStore store;
  absl::Status put = store.Put("job-9", 1, "k", "v");
  EXPECT_EQ(put.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(put.message(), HasSubstr("job-9"));
  EXPECT_EQ(store.Get("job-9", 1, "k").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(RendezvousStoreTest, CloseDropsKeys) {
  RendezvousStore store;
  store.Open("job-1", 1);
  ASSERT_TRUE(store.Put("job-1", 1, "k", "v").ok());
  store.Close("job-1", 1);
  EXPECT_EQ(store.OpenAttempts(), 0u);
  store.Open("job-1", 1);
  EXPECT_EQ(store.Get("job-1", 1, "k").status().code(), absl::StatusCode::kNotFound);
}

TEST(RendezvousStoreTest, WaitReturnsWhenEveryKeyArrives) {
  RendezvousStore store;
  store.Open("job-1", 1);
  ASSERT_TRUE(store.Put("job-1", 1, "a", "1").ok());
  std::thread writer([&] {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(store.Put("job-1", 1, "b", "2").ok());
  });
  absl::Time start = absl::Now();
  absl::Status waited = store.Wait("job-1", 1, {"a", "b"}, absl::Seconds(10));
  writer.join();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(RendezvousStoreTest, WaitTimesOutNamingMissingKeys) {
  RendezvousStore store;
  store.Open("job-1", 1);
  ASSERT_TRUE(store.Put("job-1", 1, "present", "1").ok());
  absl::Time start = absl::Now();
  absl::Status waited =
      store.Wait("job-1", 1, {"present", "rank1", "rank2"}, absl::Milliseconds(300));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(waited.message(), HasSubstr("missing keys: rank1, rank2"));
  EXPECT_THAT(waited.message(), ::testing::Not(HasSubstr("present")));
}

TEST(RendezvousStoreTest, ZeroTimeoutChecksOnce) {
  RendezvousStore store;
  store.Open("job-1", 1);
  ASSERT_TRUE(store.Put("job-1", 1, "a", "1").ok());
  EXPECT_TRUE(store.Wait("job-1", 1, {"a"}, absl::ZeroDuration()).ok());
  EXPECT_EQ(store.Wait("job-1", 1, {"b"}, absl::ZeroDuration()).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(store.Wait("job-1", 1, {"a"}, absl::Milliseconds(-1)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RendezvousStoreTest, WaitEndsWhenTheAttemptEnds) {
  RendezvousStore store;
  store.Open("job-1", 1);
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(100));
    store.Close("job-1", 1);
  });
  absl::Status waited = store.Wait("job-1", 1, {"never"}, absl::Seconds(30));
  closer.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kFailedPrecondition);
}

TEST(RendezvousStoreTest, WaitHonoursCancellation) {
  RendezvousStore store;
  store.Open("job-1", 1);
  std::atomic<bool> cancelled{false};
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(100));
    cancelled = true;
  });
  absl::Time start = absl::Now();
  absl::Status waited =
      store.Wait("job-1", 1, {"never"}, absl::Seconds(30), [&] { return cancelled.load(); });
  canceller.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kCancelled);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(RendezvousStoreTest, ShutdownWakesWaiters) {
  RendezvousStore store;
  store.Open("job-1", 1);
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(100));
    store.Shutdown();
  });
  absl::Status waited = store.Wait("job-1", 1, {"never"}, absl::Seconds(30));
  stopper.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable);
}

TEST(RendezvousStoreTest, BoundsKeysAndValues) {
  RendezvousStore::Limits limits;
  limits.max_value_bytes = 16;
  limits.max_keys_per_attempt = 2;
  limits.max_key_bytes = 8;
  RendezvousStore store(limits);
  store.Open("job-1", 1);
  absl::Status big = store.Put("job-1", 1, "k", std::string(17, 'x'));
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.message(), HasSubstr("value: 17 bytes"));
  EXPECT_EQ(store.Put("job-1", 1, "", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Put("job-1", 1, "longerthan8", "v").code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(store.Put("job-1", 1, "a", "v").ok());
  ASSERT_TRUE(store.Put("job-1", 1, "b", "v").ok());
  EXPECT_TRUE(store.Put("job-1", 1, "a", "ok too").ok());
  EXPECT_EQ(store.Put("job-1", 1, "c", "v").code(), absl::StatusCode::kResourceExhausted);
}

TEST(RendezvousStoreTest, BoundsTheBytesOfAnAttempt) {
  RendezvousStore::Limits limits;
  limits.max_value_bytes = 100;
  limits.max_bytes_per_attempt = 250;
  RendezvousStore store(limits);
  store.Open("job-1", 1);
  store.Open("job-1", 2);
  ASSERT_TRUE(store.Put("job-1", 1, "a", std::string(100, 'x')).ok());  // 101 bytes
  ASSERT_TRUE(store.Put("job-1", 1, "b", std::string(100, 'x')).ok());  // 202 bytes
  absl::Status full = store.Put("job-1", 1, "c", std::string(100, 'x'));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("limit of 250"));
  // Overwriting counts the new size only; another attempt has its own budget.
  EXPECT_TRUE(store.Put("job-1", 1, "b", std::string(10, 'y')).ok());  // 101 + 11 bytes
  EXPECT_TRUE(store.Put("job-1", 1, "c", std::string(100, 'x')).ok());  // 213 bytes
  EXPECT_TRUE(store.Put("job-1", 2, "a", std::string(100, 'x')).ok());
  // Closing drops the bytes with the keys.
  store.Close("job-1", 1);
  store.Open("job-1", 1);
  EXPECT_TRUE(store.Put("job-1", 1, "a", std::string(100, 'x')).ok());
  EXPECT_TRUE(store.Put("job-1", 1, "b", std::string(100, 'x')).ok());
}

TEST(RendezvousStoreTest, TimeoutMessageStaysShortForManyMissingKeys) {
  RendezvousStore store;
  store.Open("job-1", 1);
  std::vector<std::string> keys;
  for (int i = 0; i < 10000; ++i) keys.push_back("rank-" + std::to_string(i) + std::string(500, 'k'));
  absl::Status waited = store.Wait("job-1", 1, keys, absl::ZeroDuration());
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(waited.message(), HasSubstr("missing keys: rank-0"));
  EXPECT_THAT(waited.message(), HasSubstr("(10000 missing)"));
  EXPECT_LT(waited.message().size(), 2048u);
}

}  // namespace
}  // namespace dropless::coordinator
