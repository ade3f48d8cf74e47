// StepStats is the one definition of a step report: its field list covers the struct, and every
// field reaches v1.StepMetrics under its own name (or is named as off the wire).
#include "worker/daemon/step_metrics_proto.h"

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "worker/rank/step_report.h"

namespace dropless {
namespace {

bool OffTheWire(absl::string_view name) {
  for (absl::string_view n : kStepStatsOffTheWire) {
    if (n == name) return true;
  }
  return false;
}

void SetDistinct(double v, int64_t* out) { *out = static_cast<int64_t>(v); }
void SetDistinct(double v, double* out) { *out = v; }
void SetDistinct(double v, std::vector<int64_t>* out) {
  *out = {static_cast<int64_t>(v), static_cast<int64_t>(v) + 1000, 0};
}

// Every field a different value: 1, 2, 3, ... in list order (a list starts with its value).
StepStats Distinct() {
  StepStats s;
  double v = 1;
  ForEachStepStatsField([&](absl::string_view, auto member) {
    SetDistinct(v, &(s.*member));
    v += 1;
  });
  return s;
}

TEST(StepStatsTest, FieldListCoversTheStruct) {
  size_t bytes = 0;
  std::set<std::string> names;
  ForEachStepStatsField([&](absl::string_view name, auto member) {
    bytes += sizeof(StepStats{}.*member);
    EXPECT_TRUE(names.insert(std::string(name)).second) << name << " listed twice";
  });
  // Every field is 8 bytes or a vector (24), so there is no padding: a field missing from the list
  // shows here.
  EXPECT_EQ(bytes, sizeof(StepStats));
}

TEST(StepStatsTest, EveryFieldHasAStepMetricsFieldOfItsNameAndType) {
  const google::protobuf::Descriptor& d = *v1::StepMetrics::descriptor();
  ForEachStepStatsField([&](absl::string_view name, auto member) {
    const google::protobuf::FieldDescriptor* f = d.FindFieldByName(std::string(name));
    if (OffTheWire(name)) {
      EXPECT_EQ(f, nullptr) << name << " is on the wire: drop it from kStepStatsOffTheWire";
      return;
    }
    ASSERT_NE(f, nullptr) << "v1.StepMetrics has no field " << name;
    using Field = std::decay_t<decltype(StepStats{}.*member)>;
    const bool list = std::is_same_v<Field, std::vector<int64_t>>;
    const bool integer = list || std::is_same_v<Field, int64_t>;
    EXPECT_EQ(f->is_repeated(), list) << name;
    EXPECT_EQ(f->cpp_type(), integer ? google::protobuf::FieldDescriptor::CPPTYPE_INT64
                                     : google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE)
        << name;
  });
}

TEST(StepStatsTest, ToProtoSetsEveryFieldAndTheRates) {
  StepStats s = Distinct();
  v1::StepMetrics m;
  m.set_job_id("j");
  m.set_rank(3);
  StepStatsToProto(s, &m);
  EXPECT_EQ(m.job_id(), "j");  // identity is the caller's
  EXPECT_EQ(m.rank(), 3);
  EXPECT_EQ(m.step(), s.step);
  EXPECT_EQ(m.steps(), s.steps);
  EXPECT_EQ(m.loss(), s.loss);
  EXPECT_EQ(m.aux_loss(), s.aux_loss);
  EXPECT_EQ(m.step_seconds(), s.step_seconds);
  EXPECT_EQ(m.dispatch_seconds(), s.dispatch_seconds);
  EXPECT_EQ(m.combine_seconds(), s.combine_seconds);
  EXPECT_EQ(m.gemm_seconds(), s.gemm_seconds);
  EXPECT_EQ(m.gemm_forward_seconds(), s.gemm_forward_seconds);
  EXPECT_EQ(m.gemm_dgrad_seconds(), s.gemm_dgrad_seconds);
  EXPECT_EQ(m.gemm_wgrad_seconds(), s.gemm_wgrad_seconds);
  EXPECT_EQ(m.load_imbalance(), s.load_imbalance);
  EXPECT_EQ(m.device_memory_bytes(), s.device_memory_bytes);
  EXPECT_EQ(std::vector<int64_t>(m.expert_tokens().begin(), m.expert_tokens().end()),
            s.expert_tokens);
  EXPECT_EQ(m.dispatch_bytes(), s.dispatch_bytes);
  EXPECT_EQ(m.combine_bytes(), s.combine_bytes);
  EXPECT_DOUBLE_EQ(m.tflops(), s.FlopsPerSecond() / 1e12);
  EXPECT_DOUBLE_EQ(m.mfu(), s.Mfu());
  EXPECT_DOUBLE_EQ(m.tokens_per_second(), s.TokensPerSecond());
}

TEST(StepStatsTest, ReportLineCarriesEveryField) {
  StepStats s = Distinct();
  s.steps = 100;  // >= step
  absl::StatusOr<StepStats> back = ParseStepReport(FormatStepReport(s));
  ASSERT_TRUE(back.ok()) << back.status();
  ForEachStepStatsField(
      [&](absl::string_view name, auto member) { EXPECT_EQ((*back).*member, s.*member) << name; });
}

}  // namespace
}  // namespace dropless
