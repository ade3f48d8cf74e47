// DROPLESS_RETURN_IF_ERROR(expr): returns the absl::Status of `expr` from the enclosing function
// when it is not OK (errors are values across module boundaries, STYLE.md).
#ifndef DROPLESS_COMMON_STATUS_MACROS_H_
#define DROPLESS_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"

#define DROPLESS_RETURN_IF_ERROR(expr)                              \
  do {                                                              \
    if (::absl::Status dropless_status_ = (expr); !dropless_status_.ok()) { \
      return dropless_status_;                                      \
    }                                                               \
  } while (0)

#endif  // DROPLESS_COMMON_STATUS_MACROS_H_
