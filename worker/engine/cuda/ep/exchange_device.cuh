// Device code shared by the EP exchange kernels of every backend (exchange_kernels.cu for
// `local`, nccl_lsa_dispatcher.cu): one rank's plan from the group's count matrix, and the rows
// one sender exchanges with the owners' receive buffers. Layout: expert_dispatcher.h.
#ifndef DROPLESS_WORKER_ENGINE_CUDA_EP_EXCHANGE_DEVICE_CUH_
#define DROPLESS_WORKER_ENGINE_CUDA_EP_EXCHANGE_DEVICE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace dropless::cuda_engine::exchange_device {

inline constexpr int kMaxExperts = 512;

// The vector a row is copied in: 16 bytes when the row allows, else 4.
inline bool WideRows(size_t row_bytes) { return row_bytes % 16 == 0; }
inline int64_t RowVectors(size_t row_bytes) {
  return static_cast<int64_t>(row_bytes / (WideRows(row_bytes) ? 16 : 4));
}

// Rank p's plan from counts[s * experts + e] (shared memory, the whole group's), by one block:
// job_counts, recv_offsets (p's local experts) and dest_rows (p's rows in their owners' buffers).
// `job` and `owner_prefix` are shared scratch of `experts` entries.
__device__ inline void PlanOfRank(const int32_t* counts, int ranks, int experts, int p,
                                  int32_t* job, int32_t* owner_prefix, int32_t* job_counts,
                                  int32_t* recv_offsets, int32_t* dest_rows) {
  const int local_experts = experts / ranks;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int32_t sum = 0;
    for (int s = 0; s < ranks; ++s) sum += counts[s * experts + e];
    job[e] = sum;
    job_counts[e] = sum;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t running = 0;
    for (int e = 0; e < experts; ++e) {
      if (e % local_experts == 0) running = 0;
      owner_prefix[e] = running;
      running += job[e];
    }
    const int first = p * local_experts;
    for (int l = 0; l < local_experts; ++l) recv_offsets[l] = owner_prefix[first + l];
    recv_offsets[local_experts] =
        owner_prefix[first + local_experts - 1] + job[first + local_experts - 1];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int32_t before = owner_prefix[e];
    for (int s = 0; s < p; ++s) before += counts[s * experts + e];
    dest_rows[e] = before;
  }
}

// Rank p's plan from the group's count matrix in global memory ([ranks][experts], ranks <=
// kMaxRanks), by one block: PlanOfRank on a shared-memory copy.
template <int kMaxRanks>
__device__ inline void PlanFromCountMatrix(const int32_t* count_matrix, int ranks, int experts,
                                           int p, int32_t* job_counts, int32_t* recv_offsets,
                                           int32_t* dest_rows) {
  __shared__ int32_t counts[kMaxRanks * kMaxExperts];
  __shared__ int32_t job[kMaxExperts];
  __shared__ int32_t owner_prefix[kMaxExperts];
  for (int i = threadIdx.x; i < ranks * experts; i += blockDim.x) counts[i] = count_matrix[i];
  __syncthreads();
  PlanOfRank(counts, ranks, experts, p, job, owner_prefix, job_counts, recv_offsets, dest_rows);
}

// The rows one sender exchanges, one warp per row of row_vectors V (uint4 for rows of a multiple
// of 16 bytes, uint32_t for scale rows of a multiple of 4): row i of global expert e (offsets in
// shared memory, experts + 1 entries) <-> row dest_rows[e] + i - offsets[e] of the receive buffer
// recv[e / local_experts]. Only the experts of the run [first, first + count) of every owner's
// local experts take part (count = local_experts: every row); the run's rows, owner by owner, are
// numbered 0, 1, ... and warp w takes numbers warp_first + w * warp_stride. to_owner: send ->
// recv, else back.
template <typename V>
__device__ inline void ExchangeRowsOfSender(const int32_t* offsets, const int32_t* dest_rows,
                                            int experts, int local_experts, int first, int count,
                                            uint8_t* send, uint8_t* const* recv,
                                            int64_t row_vectors, bool to_owner,
                                            int64_t warp_first, int64_t warp_stride) {
  const int owners = experts / local_experts;
  const int lane = threadIdx.x % 32;
  // Numbers [before[p], before[p + 1]) are owner p's run, rows [start[p], ...) of the sender.
  int64_t total = 0;
  for (int p = 0; p < owners; ++p) {
    total += offsets[p * local_experts + first + count] - offsets[p * local_experts + first];
  }
  for (int64_t v = warp_first; v < total; v += warp_stride) {
    int p = 0;
    int64_t before = 0;
    for (;; ++p) {
      const int64_t run = offsets[p * local_experts + first + count] - offsets[p * local_experts + first];
      if (v < before + run || p + 1 == owners) break;
      before += run;
    }
    const int e0 = p * local_experts + first;
    const int64_t i = offsets[e0] + (v - before);
    int lo = e0, hi = e0 + count;  // offsets[lo] <= i < offsets[hi]
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (offsets[mid] <= i) lo = mid; else hi = mid;
    }
    const int64_t dst = dest_rows[lo] + (i - offsets[lo]);
    V* mine = reinterpret_cast<V*>(send) + i * row_vectors;
    V* theirs = reinterpret_cast<V*>(recv[p]) + dst * row_vectors;
    const V* from = to_owner ? mine : theirs;
    V* to = to_owner ? theirs : mine;
    for (int64_t k = lane; k < row_vectors; k += 32) to[k] = from[k];
  }
}

}  // namespace dropless::cuda_engine::exchange_device

#endif  // DROPLESS_WORKER_ENGINE_CUDA_EP_EXCHANGE_DEVICE_CUH_
