// Duplicate keys of a job spec (common/yaml_tree.cc) are found in a time that does not grow with
// the square of a map's size: a spec is untrusted input, parsed on every SubmitJob before any
// schema check. A real duplicate is named as before: the first key that repeats an earlier one,
// with the line of that first occurrence.
#include <chrono>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

double SecondsFor(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The distinct keys of one to three letters and digits, shortest first, that fit a flow map of
// at most `max_bytes` ("{0,1,...,a0,...}": each key null).
std::string ManyShortKeys(size_t max_bytes, int* count) {
  const std::string chars = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::string keys;
  *count = 0;
  auto add = [&](const std::string& key) {
    if (keys.size() + key.size() + 3 > max_bytes) return false;
    absl::StrAppend(&keys, keys.empty() ? "" : ",", key);
    ++*count;
    return true;
  };
  for (char a : chars) add(std::string(1, a));
  for (char a : chars) {
    for (char b : chars) add(std::string{a, b});
  }
  for (char a : chars) {
    for (char b : chars) {
      for (char c : chars) {
        if (!add(std::string{a, b, c})) return "{" + keys + "}\n";
      }
    }
  }
  return "{" + keys + "}\n";
}

// A spec as large as one may be, all distinct short keys: refused by the schema as before, fast.
TEST(JobSpecDuplicateKeysTest, ASpecOfThousandsOfShortKeysIsRefusedQuickly) {
  int count = 0;
  const std::string text = ManyShortKeys(kMaxJobSpecBytes, &count);
  ASSERT_LE(text.size(), kMaxJobSpecBytes);
  ASSERT_GT(count, 17000);
  absl::StatusOr<JobSpec> spec;
  const double seconds = SecondsFor([&] { spec = ParseSubmittedJobSpec(text); });
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), Not(HasSubstr("duplicate key")));
  EXPECT_LT(seconds, 0.5) << count << " keys";
}

// The same keys with one repeated at the end: named, with its first line, as quickly.
TEST(JobSpecDuplicateKeysTest, ARepeatAmongThousandsOfKeysIsNamed) {
  int count = 0;
  std::string text = ManyShortKeys(kMaxJobSpecBytes - 16, &count);
  text.insert(text.size() - 2, ",\nzz,\nab");  // "zz" (line 2) and "ab" (line 3) again
  absl::StatusOr<JobSpec> spec;
  const double seconds = SecondsFor([&] { spec = ParseSubmittedJobSpec(text); });
  EXPECT_EQ(spec.status(),
            absl::InvalidArgumentError("zz: duplicate key (line 2, first at line 1)"));
  EXPECT_LT(seconds, 0.5) << count << " keys";
}

TEST(JobSpecDuplicateKeysTest, TheFirstRepeatIsNamedWithItsPathAndFirstLine) {
  // b repeats first (line 5; again at line 6), d later (line 7).
  EXPECT_EQ(ParseJobSpec("a:\n  b: 1\n  d: {x: 1}\n  c: 2\n  b: 2\n  b: 3\n  d: 4\n").status(),
            absl::InvalidArgumentError("a.b: duplicate key (line 5, first at line 2)"));
  EXPECT_EQ(ParseJobSpec("x: 1\ny: 2\nx: 3\ny: 4\nx: 5\n").status(),
            absl::InvalidArgumentError("x: duplicate key (line 3, first at line 1)"));
  // Quoted or not, a key is its text; in a list's map too.
  const absl::Status in_list = ParseJobSpec("list:\n  - {p: 1, \"p\": 2}\n").status();
  EXPECT_THAT(std::string(in_list.message()),
              StartsWith("list[0].p: duplicate key (line 2, first at line 2)"));
  // Equal keys in different maps are no duplicates: the schema speaks instead.
  const absl::Status apart = ParseJobSpec("a: 1\nb: {a: 1, b: 2}\nc: [{a: 1}, {a: 2}]\n").status();
  EXPECT_THAT(std::string(apart.message()), Not(HasSubstr("duplicate key")));
}

}  // namespace
}  // namespace dropless
