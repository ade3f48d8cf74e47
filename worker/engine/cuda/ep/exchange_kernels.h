// Device kernels of the EP exchange (expert_dispatcher.h): the plan from every rank's per-expert
// counts, the row copies between ranks' buffers, and element-wise sums across ranks' buffers.
// The `local` dispatcher runs each over all ranks of the group at once (their buffers are in one
// process); every kernel is capturable and never synchronizes with the host.
#ifndef DROPLESS_WORKER_ENGINE_CUDA_EP_EXCHANGE_KERNELS_H_
#define DROPLESS_WORKER_ENGINE_CUDA_EP_EXCHANGE_KERNELS_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "worker/engine/cuda/ep/expert_dispatcher.h"

namespace dropless::cuda_engine {

// The plans of `ranks` EP ranks (pointers per rank). Every rank's count_matrix, job_counts,
// dest_rows and recv_offsets are written from all ranks' send_offsets.
struct GroupPlans {
  const int32_t* send_offsets[kMaxLocalRanks];
  int32_t* count_matrix[kMaxLocalRanks];
  int32_t* job_counts[kMaxLocalRanks];
  int32_t* dest_rows[kMaxLocalRanks];
  int32_t* recv_offsets[kMaxLocalRanks];
};
absl::Status PlanGroupExchange(const GroupPlans& plans, const EpShape& shape, cudaStream_t stream);

// Row copies of every rank of the group: rank s's row i (expert e, send_offsets_s[e] <= i <
// send_offsets_s[e + 1]) and row dest_rows_s[e] + i - send_offsets_s[e] of the receive buffer of
// e's owner. to_owner: send -> recv (dispatch); otherwise recv -> send (combine).
struct GroupRows {
  const int32_t* send_offsets[kMaxLocalRanks];
  const int32_t* dest_rows[kMaxLocalRanks];
  uint8_t* send[kMaxLocalRanks];
  uint8_t* recv[kMaxLocalRanks];
};
// Only the rows of the `experts` run of every owner's local experts (count 0: all). sms: the
// device's multiprocessors (the grid covers them about four times over).
absl::Status ExchangeGroupRows(const GroupRows& rows, const EpShape& shape, size_t row_bytes,
                               bool to_owner, LocalExperts experts, int sms, cudaStream_t stream);

// data[r][i] = sum over ranks (in rank order) of data[r][i], for every rank r.
absl::Status SumAcrossRanks(float* const* data, int ranks, size_t count, cudaStream_t stream);
absl::Status SumAcrossRanks(double* const* data, int ranks, size_t count, cudaStream_t stream);

}  // namespace dropless::cuda_engine

#endif  // DROPLESS_WORKER_ENGINE_CUDA_EP_EXCHANGE_KERNELS_H_
