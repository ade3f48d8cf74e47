// libFuzzer target: what the worker daemon does with bytes a rank process wrote (common/utf8,
// common/step_phase). Output text must come out valid UTF-8 (or proto3 refuses the message),
// unchanged when it was valid, and cut only between characters; a phase line that parses must
// format back to a line that parses to the same report.
#include <cstddef>
#include <cstdint>
#include <string>
#include <algorithm>

#include "absl/strings/string_view.h"

#include "common/step_phase.h"
#include "common/utf8.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);

  const std::string valid = dropless::ToValidUtf8(text);
  Check(dropless::IsValidUtf8(valid));
  Check(dropless::ToValidUtf8(valid) == valid);
  if (dropless::IsValidUtf8(text)) Check(valid == text);
  for (size_t max : {size_t{0}, size_t{1}, size_t{7}, size / 2, size}) {
    const size_t cut = dropless::Utf8PrefixLength(valid, max);
    Check(cut <= max || cut == valid.size());
    Check(cut + 3 >= std::min(max, valid.size()));  // at most one character is dropped
    Check(dropless::IsValidUtf8(valid.substr(0, cut)));
  }

  absl::StatusOr<dropless::PhaseReport> report = dropless::ParsePhaseLine(text);
  if (report.ok()) {
    absl::StatusOr<dropless::PhaseReport> again =
        dropless::ParsePhaseLine(dropless::FormatPhaseLine(*report));
    Check(again.ok() && again->phase == report->phase && again->step == report->step &&
          again->since_ms == report->since_ms);
  } else {
    Check(!report.status().message().empty());
  }
  return 0;
}
