// EP exchange kernels (contracts: exchange_kernels.h).
#include "worker/engine/cuda/ep/exchange_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "worker/engine/cuda/ep/exchange_device.cuh"

namespace dropless::cuda_engine {
namespace {

using kernels::cuda::GridStrideBlocks;
using kernels::cuda::LaunchStatus;

constexpr int kPlanThreads = 256;
constexpr int kMaxExperts = exchange_device::kMaxExperts;
constexpr int kRowThreads = 256;

// One block per rank p: the count matrix in shared memory, then p's plan.
__global__ void PlanGroupKernel(GroupPlans plans, int ranks, int experts) {
  __shared__ int32_t counts[kMaxLocalRanks * kMaxExperts];
  __shared__ int32_t job[kMaxExperts];
  __shared__ int32_t owner_prefix[kMaxExperts];
  const int p = blockIdx.x;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    for (int s = 0; s < ranks; ++s) {
      const int32_t c = plans.send_offsets[s][e + 1] - plans.send_offsets[s][e];
      counts[s * experts + e] = c;
      plans.count_matrix[p][s * experts + e] = c;
    }
  }
  __syncthreads();
  exchange_device::PlanOfRank(counts, ranks, experts, p, job, owner_prefix, plans.job_counts[p],
                              plans.recv_offsets[p], plans.dest_rows[p]);
}

// blockIdx.y: the sending rank; one warp per row.
template <typename V>
__global__ void ExchangeGroupRowsKernel(GroupRows rows, int experts, int local_experts, int first,
                                        int count, int64_t row_vectors, bool to_owner) {
  __shared__ int32_t offsets[kMaxExperts + 1];
  const int s = blockIdx.y;
  for (int e = threadIdx.x; e <= experts; e += blockDim.x) offsets[e] = rows.send_offsets[s][e];
  __syncthreads();
  const int64_t warps_per_block = blockDim.x / 32;
  exchange_device::ExchangeRowsOfSender<V>(offsets, rows.dest_rows[s], experts, local_experts,
                                           first, count, rows.send[s], rows.recv, row_vectors,
                                           to_owner,
                                        blockIdx.x * warps_per_block + threadIdx.x / 32,
                                        gridDim.x * warps_per_block);
}

template <typename T>
struct RankPointers {
  T* data[kMaxLocalRanks];
};

template <typename T>
__global__ void SumAcrossRanksKernel(RankPointers<T> p, int ranks, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    T sum = p.data[0][i];
    for (int r = 1; r < ranks; ++r) sum += p.data[r][i];
    for (int r = 0; r < ranks; ++r) p.data[r][i] = sum;
  }
}

template <typename T>
absl::Status SumAcrossRanksImpl(T* const* data, int ranks, size_t count, cudaStream_t stream) {
  if (ranks < 1 || ranks > kMaxLocalRanks) {
    return absl::InvalidArgumentError(absl::StrFormat("SumAcrossRanks: %d ranks", ranks));
  }
  if (ranks == 1 || count == 0) return absl::OkStatus();
  RankPointers<T> p{};
  for (int r = 0; r < ranks; ++r) p.data[r] = data[r];
  SumAcrossRanksKernel<T><<<GridStrideBlocks(static_cast<int64_t>(count), 256), 256, 0, stream>>>(
      p, ranks, count);
  return LaunchStatus("SumAcrossRanksKernel");
}

}  // namespace

absl::Status ValidateEpShape(const EpShape& shape) {
  if (shape.ep < 1 || shape.ep > kMaxLocalRanks) {
    return absl::InvalidArgumentError(
        absl::StrFormat("EP size %d: must be 1 to %d", shape.ep, kMaxLocalRanks));
  }
  if (shape.experts < 1 || shape.experts > kMaxExperts || shape.experts % shape.ep != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "EP exchange: %d experts must be 1 to %d and split evenly over %d ranks", shape.experts,
        kMaxExperts, shape.ep));
  }
  if (shape.rows < 0 || shape.max_recv_rows() > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrFormat("EP exchange: %d rows per rank x %d ranks exceed int32 row indices",
                        shape.rows, shape.ep));
  }
  return absl::OkStatus();
}

absl::Status ValidateLocalExperts(const EpShape& shape, LocalExperts run) {
  const int El = shape.local_experts();
  if (run.count == 0 && run.first == 0) return absl::OkStatus();
  if (run.first < 0 || run.count < 1 || run.first + run.count > El) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "EP exchange: local experts [%d, %d) are not a run of the %d local experts", run.first,
        run.first + run.count, El));
  }
  return absl::OkStatus();
}

absl::Status ValidateRankCalls(const ExpertDispatcher& dispatcher,
                               absl::Span<const RankCall> calls, bool rows, size_t row_bytes) {
  const std::string name(dispatcher.name());
  if (static_cast<int>(calls.size()) != dispatcher.local_ranks()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s dispatcher: %d rank calls for the %d ranks it drives", name, calls.size(),
        dispatcher.local_ranks()));
  }
  for (const RankCall& c : calls) {
    if (c.plan == nullptr || c.plan->send_offsets == nullptr || c.stream == nullptr ||
        (rows && (c.send_rows == nullptr || c.recv_rows == nullptr))) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s dispatcher: a rank call lacks a plan, buffer or stream", name));
    }
  }
  if (rows && (row_bytes == 0 || row_bytes % 4 != 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s dispatcher: row of %d bytes is not a positive multiple of 4", name, row_bytes));
  }
  return absl::OkStatus();
}

absl::Status AllocateExchangePlan(ExpertDispatcher* dispatcher, DeviceArena* arena,
                                  ExchangePlan* plan) {
  const EpShape& shape = dispatcher->shape();
  DROPLESS_RETURN_IF_ERROR(ValidateEpShape(shape));
  const int64_t E = shape.experts;
  DROPLESS_RETURN_IF_ERROR(
      dispatcher->AllocateShared(shape.ep * E, "EP count matrix", &plan->count_matrix));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(E, "EP job counts", &plan->job_counts));
  DROPLESS_RETURN_IF_ERROR(arena->Allocate(E, "EP destination rows", &plan->dest_rows));
  return arena->Allocate(shape.local_experts() + 1, "EP receive offsets", &plan->recv_offsets);
}

absl::Status PlanGroupExchange(const GroupPlans& plans, const EpShape& shape, cudaStream_t stream) {
  DROPLESS_RETURN_IF_ERROR(ValidateEpShape(shape));
  PlanGroupKernel<<<shape.ep, kPlanThreads, 0, stream>>>(plans, shape.ep, shape.experts);
  return LaunchStatus("PlanGroupKernel");
}

absl::Status ExchangeGroupRows(const GroupRows& rows, const EpShape& shape, size_t row_bytes,
                               bool to_owner, LocalExperts experts, int sms, cudaStream_t stream) {
  DROPLESS_RETURN_IF_ERROR(ValidateEpShape(shape));
  DROPLESS_RETURN_IF_ERROR(ValidateLocalExperts(shape, experts));
  const int first = experts.count == 0 ? 0 : experts.first;
  const int count = experts.count == 0 ? shape.local_experts() : experts.count;
  if (row_bytes == 0 || row_bytes % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("EP exchange: row of %d bytes is not a positive multiple of 4", row_bytes));
  }
  if (shape.rows == 0) return absl::OkStatus();
  // Enough warps per sender to cover the GPU about four times over with all senders together.
  const int warps_per_block = kRowThreads / 32;
  const int64_t wanted = std::max<int64_t>(1, 4 * sms / shape.ep);
  const int64_t needed = (shape.rows + warps_per_block - 1) / warps_per_block;
  const dim3 grid(static_cast<unsigned>(std::min(wanted, needed)), static_cast<unsigned>(shape.ep));
  const int64_t vectors = exchange_device::RowVectors(row_bytes);
  if (exchange_device::WideRows(row_bytes)) {
    ExchangeGroupRowsKernel<uint4><<<grid, kRowThreads, 0, stream>>>(
        rows, shape.experts, shape.local_experts(), first, count, vectors, to_owner);
  } else {
    ExchangeGroupRowsKernel<uint32_t><<<grid, kRowThreads, 0, stream>>>(
        rows, shape.experts, shape.local_experts(), first, count, vectors, to_owner);
  }
  return LaunchStatus("ExchangeGroupRowsKernel");
}

absl::Status SumAcrossRanks(float* const* data, int ranks, size_t count, cudaStream_t stream) {
  return SumAcrossRanksImpl(data, ranks, count, stream);
}
absl::Status SumAcrossRanks(double* const* data, int ranks, size_t count, cudaStream_t stream) {
  return SumAcrossRanksImpl(data, ranks, count, stream);
}

}  // namespace dropless::cuda_engine
