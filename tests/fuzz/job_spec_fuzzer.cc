// libFuzzer target: the job-spec parser and validator (common/job_spec). Any input either fails
// with a status or yields a spec whose canonical YAML parses back to the same canonical YAML.
// A crash, a sanitizer report or a broken round trip is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "common/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view yaml(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<dropless::JobSpec> spec = dropless::ParseJobSpec(yaml);
  if (!spec.ok()) {
    if (spec.status().message().empty()) __builtin_trap();  // every refusal says why
    return 0;
  }
  const std::string canonical = dropless::JobSpecToYaml(*spec);
  absl::StatusOr<dropless::JobSpec> again = dropless::ParseJobSpec(canonical);
  if (!again.ok()) {
    std::fprintf(stderr, "canonical YAML refused: %s\n%s\n",
                 std::string(again.status().message()).c_str(), canonical.c_str());
    __builtin_trap();
  }
  if (dropless::JobSpecToYaml(*again) != canonical) {
    std::fprintf(stderr, "canonical YAML is not a fixed point:\n%s\n", canonical.c_str());
    __builtin_trap();
  }
  return 0;
}
