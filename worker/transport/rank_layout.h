// Which world ranks form the EP and DP groups of a rank (layout of communicator.h:
// ep_rank = rank % ep, dp_rank = rank / ep). Shared by every transport so they agree.
#ifndef DROPLESS_WORKER_TRANSPORT_RANK_LAYOUT_H_
#define DROPLESS_WORKER_TRANSPORT_RANK_LAYOUT_H_

#include <vector>

#include "absl/status/status.h"
#include "worker/transport/transport_factory.h"

namespace dropless {

// InvalidArgument naming the field when ep, dp, world_size or rank are inconsistent.
absl::Status ValidateGroupLayout(const GroupLayout& layout);

inline int EpRankOf(int rank, int ep) { return rank % ep; }
inline int DpRankOf(int rank, int ep) { return rank / ep; }

// World ranks of the EP group of `rank`, in EP-rank order (same dp_rank, ep_rank 0..ep-1).
std::vector<int> EpGroupRanks(int rank, int ep);
// World ranks of the DP group of `rank`, in DP-rank order (same ep_rank, dp_rank 0..dp-1).
std::vector<int> DpGroupRanks(int rank, int ep, int dp);

}  // namespace dropless

#endif  // DROPLESS_WORKER_TRANSPORT_RANK_LAYOUT_H_
