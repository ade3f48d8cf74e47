// Group offsets as the quantizers take them (mxfp8.h, fp8_block.h): int32 [num_groups + 1],
// offsets[0] = 0, non-decreasing, offsets[num_groups] <= rows; null means one group of every row.
#ifndef DROPLESS_KERNELS_GROUP_OFFSETS_H_
#define DROPLESS_KERNELS_GROUP_OFFSETS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dropless::kernels {

// Host offsets (the CPU references): one error naming the field.
absl::Status ValidateHostGroupOffsets(const int32_t* offsets, int num_groups, int64_t rows);
// The same check, then the offsets as a vector of num_groups + 1 entries ({0, rows} for null).
absl::StatusOr<std::vector<int32_t>> HostGroupOffsets(const int32_t* offsets, int num_groups,
                                                      int64_t rows);

}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_GROUP_OFFSETS_H_
