#include "common/status_context.h"

#include "absl/strings/cord.h"
#include "common/job_error.h"
#include "gtest/gtest.h"

namespace dropless {
namespace {

TEST(StatusContextTest, PrefixesTheMessageAndKeepsTheCode) {
  const absl::Status s = WithContext("step 3", absl::DataLossError("bad file"));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "step 3: bad file");
}

// The job-error mark (a payload) survives any number of prefixes: the rank exits with
// kRankExitJobError for an error its engine marked, however deep it was made.
TEST(StatusContextTest, KeepsEveryPayloadTheJobErrorMarkIncluded) {
  absl::Status inner = MarkJobError(absl::ResourceExhaustedError("too large"));
  inner.SetPayload("type.example/other", absl::Cord("x"));
  const absl::Status s = WithContext("building the cuda engine", WithContext("arena", inner));
  EXPECT_EQ(s.message(), "building the cuda engine: arena: too large");
  EXPECT_TRUE(IsJobError(s));
  ASSERT_TRUE(s.GetPayload("type.example/other").has_value());
  EXPECT_EQ(*s.GetPayload("type.example/other"), "x");
  EXPECT_FALSE(IsJobError(WithContext("step 1", absl::InternalError("launch failed"))));
}

TEST(StatusContextTest, AnOkStatusStaysOk) {
  EXPECT_TRUE(WithContext("anything", absl::OkStatus()).ok());
}

}  // namespace
}  // namespace dropless
