// Wall-clock time as the API carries it: Unix epoch milliseconds.
#ifndef DROPLESS_COORDINATOR_UTIL_CLOCK_H_
#define DROPLESS_COORDINATOR_UTIL_CLOCK_H_

#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dropless::coordinator {

inline int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_UTIL_CLOCK_H_
