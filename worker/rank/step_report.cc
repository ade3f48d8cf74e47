#include "worker/rank/step_report.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace dropless {
namespace {

std::string FormatValue(int64_t v) { return absl::StrCat(v); }

std::string FormatValue(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

// A list is its values joined by commas, nothing for an empty one: `expert_tokens=12,9,0,31`.
std::string FormatValue(const std::vector<int64_t>& v) { return absl::StrJoin(v, ","); }

bool ParseValue(absl::string_view text, int64_t* v) { return absl::SimpleAtoi(text, v); }
bool ParseValue(absl::string_view text, double* v) { return absl::SimpleAtod(text, v); }
bool ParseValue(absl::string_view text, std::vector<int64_t>* v) {
  v->clear();
  if (text.empty()) return true;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    if (v->size() == kMaxStepStatsListSize || !absl::SimpleAtoi(item, &v->emplace_back())) {
      return false;
    }
  }
  return true;
}
const char* Kind(int64_t) { return "an integer"; }
const char* Kind(double) { return "a number"; }
const char* Kind(const std::vector<int64_t>&) {
  return "a comma-separated list of at most 1024 integers";
}

// Every figure but the losses is a count, a duration, a size or a rate: finite and >= 0.
bool IsFiniteNonNegative(double v) { return v >= 0 && !std::isinf(v); }
bool IsFiniteNonNegative(int64_t v) { return v >= 0; }
bool IsFiniteNonNegative(const std::vector<int64_t>& v) {
  for (int64_t x : v) {
    if (x < 0) return false;
  }
  return true;
}

absl::Status Invalid(absl::string_view key, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("step report: ", key, ": ", why));
}

}  // namespace

std::string FormatStepReport(const StepStats& stats) {
  std::string line;
  ForEachStepStatsField([&](absl::string_view key, auto member) {
    if (!line.empty()) line += ' ';
    absl::StrAppend(&line, key, "=", FormatValue(stats.*member));
  });
  return line;
}

absl::StatusOr<StepStats> ParseStepReport(absl::string_view line) {
  StepStats stats;
  std::vector<absl::string_view> seen;
  for (absl::string_view token : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    size_t eq = token.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return Invalid(token, "expected key=value");
    }
    absl::string_view key = token.substr(0, eq);
    absl::string_view value = token.substr(eq + 1);
    absl::Status status;
    ForEachStepStatsField([&](absl::string_view name, auto member) {
      if (name != key || !status.ok()) return;
      for (absl::string_view s : seen) {
        if (s == key) status = Invalid(key, "repeated");
      }
      if (!status.ok()) return;
      seen.push_back(name);
      if (!ParseValue(value, &(stats.*member))) {
        status = Invalid(key, absl::StrCat("not ", Kind(stats.*member), ": '", value, "'"));
      }
    });
    if (!status.ok()) return status;
  }
  absl::Status status;
  ForEachStepStatsField([&](absl::string_view name, auto) {
    bool found = false;
    for (absl::string_view s : seen) found = found || s == name;
    if (!found && status.ok()) status = Invalid(name, "missing");
  });
  if (!status.ok()) return status;
  if (stats.step < 1) return Invalid("step", "must be >= 1");
  if (stats.steps < stats.step) return Invalid("steps", "must be >= step");
  ForEachStepStatsField([&](absl::string_view name, auto member) {
    if (status.ok() && name != "loss" && name != "aux_loss" &&
        !IsFiniteNonNegative(stats.*member)) {
      status = Invalid(name, "must be a finite number >= 0");
    }
  });
  if (!status.ok()) return status;
  return stats;
}

}  // namespace dropless
