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

// Sender rows [offsets[0] + warp_first, offsets[experts]) stepping by warp_stride, one warp per row of row_vectors V
// (uint4 for rows of a multiple of 16 bytes, uint32_t for MXFP8 scale rows of a multiple of 4):
// row i of expert e (offsets in shared memory, experts + 1 entries) <-> row dest_rows[e] + i -
// offsets[e] of the receive buffer recv[e / local_experts]. to_owner: send -> recv, else back.
template <typename V>
__device__ inline void ExchangeRowsOfSender(const int32_t* offsets, const int32_t* dest_rows,
                                            int experts, int local_experts, uint8_t* send,
                                            uint8_t* const* recv, int64_t row_vectors,
                                            bool to_owner, int64_t warp_first,
                                            int64_t warp_stride) {
  const int64_t total = offsets[experts];
  const int lane = threadIdx.x % 32;
  for (int64_t i = offsets[0] + warp_first; i < total; i += warp_stride) {
    int lo = 0, hi = experts;  // offsets[lo] <= i < offsets[hi]
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (offsets[mid] <= i) lo = mid; else hi = mid;
    }
    const int64_t dst = dest_rows[lo] + (i - offsets[lo]);
    V* mine = reinterpret_cast<V*>(send) + i * row_vectors;
    V* theirs = reinterpret_cast<V*>(recv[lo / local_experts]) + dst * row_vectors;
    const V* from = to_owner ? mine : theirs;
    V* to = to_owner ? theirs : mine;
    for (int64_t v = lane; v < row_vectors; v += 32) to[v] = from[v];
  }
}

}  // namespace dropless::cuda_engine::exchange_device

#endif  // DROPLESS_WORKER_ENGINE_CUDA_EP_EXCHANGE_DEVICE_CUH_
