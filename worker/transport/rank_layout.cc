#include "worker/transport/rank_layout.h"

#include "absl/strings/str_format.h"

namespace dropless {

absl::Status ValidateGroupLayout(const GroupLayout& layout) {
  if (layout.ep < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("layout.ep must be >= 1, got %d", layout.ep));
  }
  if (layout.dp < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("layout.dp must be >= 1, got %d", layout.dp));
  }
  if (layout.world_size != layout.ep * layout.dp) {
    return absl::InvalidArgumentError(
        absl::StrFormat("layout.world_size (%d) must equal ep * dp (%d * %d)", layout.world_size,
                        layout.ep, layout.dp));
  }
  if (layout.rank < 0 || layout.rank >= layout.world_size) {
    return absl::InvalidArgumentError(absl::StrFormat("layout.rank %d is outside [0, %d)",
                                                      layout.rank, layout.world_size));
  }
  return absl::OkStatus();
}

std::vector<int> EpGroupRanks(int rank, int ep) {
  std::vector<int> ranks;
  const int first = DpRankOf(rank, ep) * ep;
  for (int i = 0; i < ep; ++i) ranks.push_back(first + i);
  return ranks;
}

std::vector<int> DpGroupRanks(int rank, int ep, int dp) {
  std::vector<int> ranks;
  const int ep_rank = EpRankOf(rank, ep);
  for (int j = 0; j < dp; ++j) ranks.push_back(ep_rank + j * ep);
  return ranks;
}

}  // namespace dropless
