#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/transport/transport_factory.h"

namespace dropless {
namespace {

TEST(MemoryKvStoreTest, PutGetAndNotFound) {
  std::unique_ptr<KeyValueStore> store = NewMemoryKvStore();
  EXPECT_EQ(store->Get("a").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store->Put("a", std::string("x\0y", 3)).ok());
  ASSERT_EQ(*store->Get("a"), std::string("x\0y", 3));
  ASSERT_TRUE(store->Put("a", "replaced").ok());
  EXPECT_EQ(*store->Get("a"), "replaced");
}

TEST(MemoryKvStoreTest, WaitReturnsOnceEveryKeyIsPut) {
  std::unique_ptr<KeyValueStore> store = NewMemoryKvStore();
  ASSERT_TRUE(store->Put("k1", "1").ok());
  std::thread writer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(store->Put("k2", "2").ok());
  });
  EXPECT_TRUE(store->Wait({"k1", "k2"}, absl::Seconds(30)).ok());
  writer.join();
}

TEST(MemoryKvStoreTest, WaitTimesOutNamingTheMissingKeys) {
  std::unique_ptr<KeyValueStore> store = NewMemoryKvStore();
  ASSERT_TRUE(store->Put("present", "1").ok());
  const absl::Time start = absl::Now();
  absl::Status s = store->Wait({"present", "absent"}, absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("absent"), std::string_view::npos) << s;
  EXPECT_EQ(s.message().find("present"), std::string_view::npos) << s;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
}

}  // namespace
}  // namespace dropless
