#include "worker/daemon/step_metrics_proto.h"

#include <cstdint>
#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"

namespace dropless {
namespace {

void SetField(const google::protobuf::Reflection& r, const google::protobuf::FieldDescriptor& f,
              int64_t v, v1::StepMetrics* out) {
  r.SetInt64(out, &f, v);
}

void SetField(const google::protobuf::Reflection& r, const google::protobuf::FieldDescriptor& f,
              double v, v1::StepMetrics* out) {
  r.SetDouble(out, &f, v);
}

void SetField(const google::protobuf::Reflection& r, const google::protobuf::FieldDescriptor& f,
              const std::vector<int64_t>& v, v1::StepMetrics* out) {
  r.ClearField(out, &f);
  for (int64_t x : v) r.AddInt64(out, &f, x);
}

}  // namespace

void StepStatsToProto(const StepStats& stats, v1::StepMetrics* out) {
  const google::protobuf::Descriptor& descriptor = *v1::StepMetrics::descriptor();
  const google::protobuf::Reflection& reflection = *v1::StepMetrics::GetReflection();
  ForEachStepStatsField([&](absl::string_view name, auto member) {
    const google::protobuf::FieldDescriptor* field = descriptor.FindFieldByName(std::string(name));
    if (field != nullptr) SetField(reflection, *field, stats.*member, out);
  });
  out->set_tflops(stats.FlopsPerSecond() / 1e12);
  out->set_mfu(stats.Mfu());
  out->set_tokens_per_second(stats.TokensPerSecond());
}

}  // namespace dropless
