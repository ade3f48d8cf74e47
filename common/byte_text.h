// Byte counts as messages and tables show them.
#ifndef DROPLESS_COMMON_BYTE_TEXT_H_
#define DROPLESS_COMMON_BYTE_TEXT_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"

namespace dropless {

// "79.6 GiB": binary gigabytes with one decimal (GPU memory sizes).
inline std::string GibText(int64_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (int64_t{1} << 30));
}

}  // namespace dropless

#endif  // DROPLESS_COMMON_BYTE_TEXT_H_
