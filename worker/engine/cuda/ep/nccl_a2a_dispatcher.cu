// The nccl-a2a ExpertDispatcher (expert_dispatcher.h): one EP rank per process over NCCL's
// classic host API (ncclAllGather, grouped ncclSend/ncclRecv), so it works wherever NCCL does,
// across nodes included, where nccl-lsa's load/store cannot reach.
//
// NCCL's point-to-point calls take their byte counts from the host, and the step never waits on
// the host for the device-side counts. So every exchange moves fixed-size slots: each rank sends
// each peer a whole buffer of shape.rows rows (the most rows a rank can send, dropless), and the
// device sorts out which rows count from the plan:
//   Plan      this rank's per-expert counts, ncclAllGather into the count matrix, the plan kernel.
//   Dispatch  every rank sends its whole send buffer (rows in global expert order) to every peer;
//             each owner copies out the rows of its own experts, source by source, into its
//             receive buffer (the layout of expert_dispatcher.h).
//   Combine   each owner writes the rows of source s back into slot s at the positions they had
//             in s's send buffer and sends slot s to s; each source takes row i from the slot of
//             the owner of row i's expert.
// The price of host-free sizes is ep x the bytes of an exact exchange (the rows of other owners
// travel too, and padding), reported by the benchmark as such; staging is 2 x ep x rows x the
// largest row per rank, from the engine's arena. Sums over the group are ncclAllReduce. Nothing
// waits on the host; every call is capturable in a CUDA graph.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "worker/engine/cuda/ep/exchange_device.cuh"
#include "worker/engine/cuda/ep/expert_dispatcher.h"
#include "worker/engine/cuda/ep/nccl_group.h"

namespace dropless::cuda_engine {
namespace {

using kernels::cuda::LaunchStatus;
namespace xd = exchange_device;

constexpr int kRowThreads = 256;

__global__ void CountsKernel(const int32_t* send_offsets, int experts, int32_t* counts) {
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    counts[e] = send_offsets[e + 1] - send_offsets[e];
  }
}

__global__ void PlanKernel(const int32_t* count_matrix, int32_t* job_counts, int32_t* recv_offsets,
                           int32_t* dest_rows, int ranks, int experts, int me) {
  xd::PlanFromCountMatrix<kMaxLocalRanks>(count_matrix, ranks, experts, me, job_counts,
                                          recv_offsets, dest_rows);
}

// Owner `me`'s side, for source blockIdx.y's slot (rows in that source's send order): the rows of
// me's experts between the slot and the receive buffer. to_owner: slot -> recv (dispatch), else
// recv -> slot (combine).
template <typename V>
__global__ void OwnerRowsKernel(const int32_t* count_matrix, const int32_t* recv_offsets,
                                uint8_t* slots, size_t slot_bytes, uint8_t* recv, int ranks,
                                int experts, int me, int64_t row_vectors, bool to_owner) {
  __shared__ int32_t offsets[xd::kMaxExperts + 1];  // the source's send offsets
  __shared__ int32_t dest[xd::kMaxExperts];         // where its rows of my experts land
  const int source = blockIdx.y, local = experts / ranks, first = me * local;
  const int32_t* counts = count_matrix + static_cast<int64_t>(source) * experts;
  if (threadIdx.x == 0) {
    int32_t running = 0;
    for (int e = 0; e < experts; ++e) {
      offsets[e] = running;
      running += counts[e];
    }
    offsets[experts] = running;
  }
  for (int l = threadIdx.x; l < local; l += blockDim.x) {
    int32_t before = recv_offsets[l];
    for (int s = 0; s < source; ++s) before += count_matrix[static_cast<int64_t>(s) * experts + first + l];
    dest[l] = before;
  }
  __syncthreads();
  uint8_t* const owner[1] = {recv};
  const int64_t warps_per_block = blockDim.x / 32;
  xd::ExchangeRowsOfSender<V>(offsets + first, dest, local, local, 0, local,
                              slots + static_cast<size_t>(source) * slot_bytes, owner, row_vectors,
                              to_owner, blockIdx.x * warps_per_block + threadIdx.x / 32,
                              gridDim.x * warps_per_block);
}

// Source side of a combine: row i of the send buffer from the slot of the owner of its expert
// (blockIdx.y), at the same position.
template <typename V>
__global__ void SourceRowsKernel(const int32_t* send_offsets, const uint8_t* slots,
                                 size_t slot_bytes, uint8_t* send, int ranks, int experts,
                                 int64_t row_vectors) {
  const int owner = blockIdx.y, local = experts / ranks;
  const int64_t begin = send_offsets[owner * local], end = send_offsets[(owner + 1) * local];
  const V* from = reinterpret_cast<const V*>(slots + static_cast<size_t>(owner) * slot_bytes);
  V* to = reinterpret_cast<V*>(send);
  const int64_t warps_per_block = blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t i = begin + blockIdx.x * warps_per_block + threadIdx.x / 32; i < end;
       i += gridDim.x * warps_per_block) {
    for (int64_t v = lane; v < row_vectors; v += 32) to[i * row_vectors + v] = from[i * row_vectors + v];
  }
}

class NcclA2aDispatcher final : public ExpertDispatcher {
 public:
  NcclA2aDispatcher(const EpShape& shape, size_t max_row_bytes, std::unique_ptr<NcclGroup> group,
                    DeviceArena* arena)
      : shape_(shape), max_row_bytes_(max_row_bytes), group_(std::move(group)), arena_(arena) {}

  absl::Status Initialize() {
    int device = 0;
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
    const int64_t slots = shape_.ep * static_cast<int64_t>(SlotBytes(max_row_bytes_));
    DROPLESS_RETURN_IF_ERROR(arena_->Allocate(slots, "nccl-a2a receive slots", &recv_slots_));
    DROPLESS_RETURN_IF_ERROR(arena_->Allocate(slots, "nccl-a2a send slots", &send_slots_));
    return arena_->Allocate(shape_.experts, "nccl-a2a counts", &counts_);
  }

  std::string_view name() const override { return "nccl-a2a"; }
  const EpShape& shape() const override { return shape_; }
  int local_ranks() const override { return 1; }
  int first_local_rank() const override { return group_->rank(); }

  absl::Status AllocateShared(size_t bytes, const char* what, void** out) override {
    uint8_t* p = nullptr;
    DROPLESS_RETURN_IF_ERROR(arena_->Allocate(static_cast<int64_t>(bytes), what, &p));
    *out = p;
    return absl::OkStatus();
  }

  absl::Status Plan(absl::Span<const RankCall> calls) override {
    DROPLESS_RETURN_IF_ERROR(ValidateRankCalls(*this, calls, /*rows=*/false, 0));
    const ExchangePlan& p = *calls[0].plan;
    const cudaStream_t stream = calls[0].stream;
    CountsKernel<<<1, 256, 0, stream>>>(p.send_offsets, shape_.experts, counts_);
    DROPLESS_RETURN_IF_ERROR(LaunchStatus("nccl-a2a CountsKernel"));
    DROPLESS_RETURN_IF_ERROR(group_->Await(
        ncclAllGather(counts_, p.count_matrix, shape_.experts, ncclInt32, group_->comm(), stream),
        "nccl-a2a: ncclAllGather of the expert counts"));
    PlanKernel<<<1, 256, 0, stream>>>(p.count_matrix, p.job_counts, p.recv_offsets, p.dest_rows,
                                      shape_.ep, shape_.experts, group_->rank());
    return LaunchStatus("nccl-a2a PlanKernel");
  }

  absl::Status AllReduceSum(absl::Span<float* const> data, size_t count,
                            absl::Span<const cudaStream_t> streams) override {
    DROPLESS_RETURN_IF_ERROR(CheckOne(data.size(), streams.size()));
    return group_->Await(ncclAllReduce(data[0], data[0], count, ncclFloat32, ncclSum,
                                       group_->comm(), streams[0]), "nccl-a2a: ncclAllReduce");
  }
  absl::Status AllReduceSum(absl::Span<double* const> data, size_t count,
                            absl::Span<const cudaStream_t> streams) override {
    DROPLESS_RETURN_IF_ERROR(CheckOne(data.size(), streams.size()));
    return group_->Await(ncclAllReduce(data[0], data[0], count, ncclFloat64, ncclSum,
                                       group_->comm(), streams[0]), "nccl-a2a: ncclAllReduce");
  }

 private:
  size_t SlotBytes(size_t row_bytes) const { return static_cast<size_t>(shape_.rows) * row_bytes; }

  absl::Status CheckOne(size_t buffers, size_t streams) const {
    if (buffers != 1 || streams != 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "nccl-a2a: %d buffers and %d streams for the one rank of this process", buffers, streams));
    }
    return absl::OkStatus();
  }

  // Every rank sends `send[q]` (slot_bytes) to each peer q and receives peer q's into recv slot q.
  absl::Status SendToEveryPeer(const uint8_t* send, size_t send_stride, size_t slot_bytes,
                               cudaStream_t stream) {
    ncclComm_t comm = group_->comm();
    DROPLESS_RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "nccl-a2a: ncclGroupStart"));
    for (int q = 0; q < shape_.ep; ++q) {
      ncclResult_t r = ncclSend(send + q * send_stride, slot_bytes, ncclUint8, q, comm, stream);
      if (r == ncclSuccess || r == ncclInProgress) {
        r = ncclRecv(recv_slots_ + q * slot_bytes, slot_bytes, ncclUint8, q, comm, stream);
      }
      if (r != ncclSuccess && r != ncclInProgress) {
        // Close the group (waiting it out on a non-blocking communicator, so that the next call
        // does not meet an unsettled one); the send/recv failure is the error to report.
        group_->Await(ncclGroupEnd(), "nccl-a2a: ncclGroupEnd after a failed send/recv")
            .IgnoreError();
        return NcclStatus(r, "nccl-a2a: ncclSend/ncclRecv");
      }
    }
    return group_->Await(ncclGroupEnd(), "nccl-a2a: ncclGroupEnd of the row exchange");
  }

  unsigned RowBlocks() const {
    const int64_t warps_per_block = kRowThreads / 32;
    const int64_t per_source = std::min<int64_t>(
        std::max<int64_t>(1, 4 * sms_ / std::max(1, shape_.ep)),
        (shape_.rows + warps_per_block - 1) / warps_per_block);
    return static_cast<unsigned>(std::max<int64_t>(1, per_source));
  }

  bool exchanges_expert_runs() const override { return false; }

  absl::Status Exchange(absl::Span<const RankCall> calls, size_t row_bytes, bool to_owner,
                        LocalExperts experts) override {
    DROPLESS_RETURN_IF_ERROR(ValidateRankCalls(*this, calls, /*rows=*/true, row_bytes));
    DROPLESS_RETURN_IF_ERROR(ValidateLocalExperts(shape_, experts));
    if (experts.count != 0 && experts.count != shape_.local_experts()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "nccl-a2a: exchanges of a run of the local experts ([%d, %d) of %d) are not supported: "
          "its fixed-size slots would move every row for each run",
          experts.first, experts.first + experts.count, shape_.local_experts()));
    }
    if (row_bytes > max_row_bytes_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "nccl-a2a: rows of %d bytes, above the %d this dispatcher was built for", row_bytes,
          max_row_bytes_));
    }
    const RankCall& c = calls[0];
    const ExchangePlan& p = *c.plan;
    const size_t slot = SlotBytes(row_bytes);
    const int64_t vectors = xd::RowVectors(row_bytes);
    const bool wide = xd::WideRows(row_bytes);
    const dim3 grid(RowBlocks(), static_cast<unsigned>(shape_.ep));
    uint8_t* const recv_slots = recv_slots_;
    if (to_owner) {
      // The whole send buffer to every owner; each owner copies out its experts' rows.
      DROPLESS_RETURN_IF_ERROR(
          SendToEveryPeer(static_cast<const uint8_t*>(c.send_rows), 0, slot, c.stream));
      auto* kernel = wide ? OwnerRowsKernel<uint4> : OwnerRowsKernel<uint32_t>;
      kernel<<<grid, kRowThreads, 0, c.stream>>>(p.count_matrix, p.recv_offsets, recv_slots, slot,
                                                  static_cast<uint8_t*>(c.recv_rows), shape_.ep,
                                                  shape_.experts, group_->rank(), vectors, true);
      return LaunchStatus("nccl-a2a OwnerRowsKernel (dispatch)");
    }
    // Combine: slot s gets source s's rows back at their send positions, then goes home.
    uint8_t* const send_slots = send_slots_;
    auto* pack = wide ? OwnerRowsKernel<uint4> : OwnerRowsKernel<uint32_t>;
    pack<<<grid, kRowThreads, 0, c.stream>>>(p.count_matrix, p.recv_offsets, send_slots, slot,
                                              static_cast<uint8_t*>(c.recv_rows), shape_.ep,
                                              shape_.experts, group_->rank(), vectors, false);
    DROPLESS_RETURN_IF_ERROR(LaunchStatus("nccl-a2a OwnerRowsKernel (combine)"));
    DROPLESS_RETURN_IF_ERROR(SendToEveryPeer(send_slots, slot, slot, c.stream));
    auto* merge = wide ? SourceRowsKernel<uint4> : SourceRowsKernel<uint32_t>;
    merge<<<grid, kRowThreads, 0, c.stream>>>(p.send_offsets, recv_slots, slot,
                                               static_cast<uint8_t*>(c.send_rows), shape_.ep,
                                               shape_.experts, vectors);
    return LaunchStatus("nccl-a2a SourceRowsKernel");
  }

  const EpShape shape_;
  const size_t max_row_bytes_;
  std::unique_ptr<NcclGroup> group_;
  DeviceArena* const arena_;  // owns every buffer below (and outlives the dispatcher)
  int sms_ = 132;
  uint8_t* recv_slots_ = nullptr;  // [ep][rows * max_row_bytes]
  uint8_t* send_slots_ = nullptr;  // [ep][rows * max_row_bytes] (combine)
  int32_t* counts_ = nullptr;   // [E] this rank's rows per expert
};

}  // namespace

absl::StatusOr<std::unique_ptr<ExpertDispatcher>> NewNcclA2aDispatcher(
    const EpShape& shape, size_t max_row_bytes, std::unique_ptr<NcclGroup> group,
    DeviceArena* arena) {
  DROPLESS_RETURN_IF_ERROR(ValidateEpShape(shape));
  if (arena == nullptr) return absl::InvalidArgumentError("nccl-a2a: no device arena");
  if (group == nullptr || group->size() != shape.ep) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "nccl-a2a: an NCCL group of %d ranks for EP %d", group == nullptr ? 0 : group->size(),
        shape.ep));
  }
  if (max_row_bytes == 0 || max_row_bytes % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "nccl-a2a: max_row_bytes must be a positive multiple of 4, got %d", max_row_bytes));
  }
  auto d = std::make_unique<NcclA2aDispatcher>(shape, max_row_bytes, std::move(group), arena);
  DROPLESS_RETURN_IF_ERROR(d->Initialize());
  return std::unique_ptr<ExpertDispatcher>(std::move(d));
}

}  // namespace dropless::cuda_engine
