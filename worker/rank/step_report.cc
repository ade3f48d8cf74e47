#include "worker/rank/step_report.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dropless {
namespace {

// One field of the line: its key and where it lives in StepReport (exactly one pointer is set).
struct Field {
  absl::string_view key;
  int64_t StepReport::*integer;
  double StepReport::*real;
};

const std::vector<Field>& Fields() {
  static const std::vector<Field> fields = {
      {"step", &StepReport::step, nullptr},
      {"steps", &StepReport::steps, nullptr},
      {"loss", nullptr, &StepReport::loss},
      {"aux_loss", nullptr, &StepReport::aux_loss},
      {"step_seconds", nullptr, &StepReport::step_seconds},
      {"flops", nullptr, &StepReport::flops},
      {"tokens", &StepReport::tokens, nullptr},
      {"dispatch_seconds", nullptr, &StepReport::dispatch_seconds},
      {"combine_seconds", nullptr, &StepReport::combine_seconds},
      {"gemm_seconds", nullptr, &StepReport::gemm_seconds},
      {"gemm_forward_seconds", nullptr, &StepReport::gemm_forward_seconds},
      {"gemm_dgrad_seconds", nullptr, &StepReport::gemm_dgrad_seconds},
      {"gemm_wgrad_seconds", nullptr, &StepReport::gemm_wgrad_seconds},
      {"load_imbalance", nullptr, &StepReport::load_imbalance},
      {"device_memory_bytes", &StepReport::device_memory_bytes, nullptr},
      {"peak_flops", nullptr, &StepReport::peak_flops},
  };
  return fields;
}

std::string FormatDouble(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

absl::Status Invalid(absl::string_view key, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("step report: ", key, ": ", why));
}

}  // namespace

double StepReport::FlopsPerSecond() const {
  return step_seconds > 0 ? flops / step_seconds : 0;
}

double StepReport::Mfu() const {
  return peak_flops > 0 ? FlopsPerSecond() / peak_flops : 0;
}

double StepReport::TokensPerSecond() const {
  return step_seconds > 0 ? static_cast<double>(tokens) / step_seconds : 0;
}

std::string FormatStepReport(const StepReport& report) {
  std::string line;
  for (const Field& f : Fields()) {
    if (!line.empty()) line += ' ';
    absl::StrAppend(&line, f.key, "=",
                    f.integer ? absl::StrCat(report.*(f.integer)) : FormatDouble(report.*(f.real)));
  }
  return line;
}

absl::StatusOr<StepReport> ParseStepReport(absl::string_view line) {
  StepReport report;
  std::vector<bool> seen(Fields().size(), false);
  for (absl::string_view token : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    size_t eq = token.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return Invalid(token, "expected key=value");
    }
    absl::string_view key = token.substr(0, eq);
    absl::string_view value = token.substr(eq + 1);
    for (size_t i = 0; i < Fields().size(); ++i) {
      const Field& f = Fields()[i];
      if (f.key != key) continue;
      if (seen[i]) return Invalid(key, "repeated");
      seen[i] = true;
      if (f.integer) {
        if (!absl::SimpleAtoi(value, &(report.*(f.integer)))) {
          return Invalid(key, absl::StrCat("not an integer: '", value, "'"));
        }
      } else if (!absl::SimpleAtod(value, &(report.*(f.real)))) {
        return Invalid(key, absl::StrCat("not a number: '", value, "'"));
      }
    }
  }
  for (size_t i = 0; i < Fields().size(); ++i) {
    if (!seen[i]) return Invalid(Fields()[i].key, "missing");
  }
  if (report.step < 1) return Invalid("step", "must be >= 1");
  if (report.steps < report.step) return Invalid("steps", "must be >= step");
  const std::pair<absl::string_view, double> non_negative[] = {
      {"step_seconds", report.step_seconds},
      {"flops", report.flops},
      {"tokens", static_cast<double>(report.tokens)},
      {"dispatch_seconds", report.dispatch_seconds},
      {"combine_seconds", report.combine_seconds},
      {"gemm_seconds", report.gemm_seconds},
      {"gemm_forward_seconds", report.gemm_forward_seconds},
      {"gemm_dgrad_seconds", report.gemm_dgrad_seconds},
      {"gemm_wgrad_seconds", report.gemm_wgrad_seconds},
      {"load_imbalance", report.load_imbalance},
      {"device_memory_bytes", static_cast<double>(report.device_memory_bytes)},
      {"peak_flops", report.peak_flops},
  };
  for (const auto& [key, v] : non_negative) {
    if (!(v >= 0) || std::isinf(v)) return Invalid(key, "must be a finite number >= 0");
  }
  return report;
}

}  // namespace dropless
