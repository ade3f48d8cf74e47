// The nccl-lsa ExpertDispatcher (expert_dispatcher.h): one EP rank per process, every rank of the
// group load/store reachable (NVLink, one LSA team). The received-side buffers and the count
// matrices live in NCCL symmetric-memory windows; the plan kernel writes this rank's counts
// straight into every peer's count matrix, dispatch stores this rank's rows into their owners'
// receive buffers and combine loads them back, each between two LSA barriers of the group
// (NCCL's device API, 2.28+). Sums over the group are ncclAllReduce. Nothing waits on the host.
#include <cuda/atomic>
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include <algorithm>
#include <cstring>
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

// Every rank of the group reaches this point; this block's writes before it (fenced to system
// scope) are visible to every peer after it.
__device__ void GroupBarrier(const ncclDevComm& comm) {
  __threadfence_system();
  ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), comm, ncclTeamTagLsa(), 0);
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

__global__ void LsaBarrierKernel(ncclDevComm comm) { GroupBarrier(comm); }

__global__ void LsaPlanKernel(ncclDevComm comm, ncclWindow_t matrix_window, size_t matrix_offset,
                              const int32_t* send_offsets, int32_t* count_matrix,
                              int32_t* job_counts, int32_t* recv_offsets, int32_t* dest_rows,
                              int ranks, int experts, int me) {
  GroupBarrier(comm);  // every peer is done with its matrix's previous contents
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    const int32_t c = send_offsets[e + 1] - send_offsets[e];
    for (int q = 0; q < ranks; ++q) {
      static_cast<int32_t*>(ncclGetLsaPointer(matrix_window, matrix_offset, q))[me * experts + e] = c;
    }
  }
  GroupBarrier(comm);  // every peer's counts are in this rank's matrix
  xd::PlanFromCountMatrix<kMaxLocalRanks>(count_matrix, ranks, experts, me, job_counts,
                                          recv_offsets, dest_rows);
}

template <typename V>
__global__ void LsaRowsKernel(ncclWindow_t recv_window, size_t recv_offset,
                              const int32_t* send_offsets, const int32_t* dest_rows,
                              uint8_t* send, int ranks, int experts, int first, int count,
                              int64_t row_vectors, bool to_owner) {
  __shared__ int32_t offsets[xd::kMaxExperts + 1];
  __shared__ uint8_t* recv[kMaxLocalRanks];
  for (int e = threadIdx.x; e <= experts; e += blockDim.x) offsets[e] = send_offsets[e];
  if (threadIdx.x < ranks) {
    recv[threadIdx.x] = static_cast<uint8_t*>(ncclGetLsaPointer(recv_window, recv_offset, threadIdx.x));
  }
  __syncthreads();
  const int64_t warps_per_block = blockDim.x / 32;
  xd::ExchangeRowsOfSender<V>(offsets, dest_rows, experts, experts / ranks, first, count, send,
                              recv, row_vectors, to_owner,
                              blockIdx.x * warps_per_block + threadIdx.x / 32,
                              gridDim.x * warps_per_block);
}

class NcclLsaDispatcher final : public ExpertDispatcher {
 public:
  NcclLsaDispatcher(const EpShape& shape, std::unique_ptr<NcclGroup> group, DeviceArena* arena)
      : shape_(shape), group_(std::move(group)), arena_(arena) {}

  ~NcclLsaDispatcher() override {
    // An aborted communicator (a failed set-up) has released its windows and device
    // communicator itself: only the memory is left to free.
    const bool live = group_->comm() != nullptr;
    for (const Window& w : windows_) {
      if (live) {
        group_->Await(ncclCommWindowDeregister(group_->comm(), w.window),
                      "ncclCommWindowDeregister")
            .IgnoreError();  // teardown: nothing left to report to
      }
      (void)ncclMemFree(w.base);  // teardown, as above
      arena_->CountHeldElsewhere(-static_cast<int64_t>(w.bytes));
    }
    if (dev_comm_created_ && live) {
      group_->Await(ncclDevCommDestroy(group_->comm(), &dev_comm_), "ncclDevCommDestroy").IgnoreError();
    }
  }

  absl::Status Initialize() {
    DROPLESS_RETURN_IF_ERROR(NcclLsaRuntimeSupported());
    ncclDevCommRequirements reqs;
    std::memset(&reqs, 0, sizeof(reqs));
    reqs.lsaBarrierCount = 1;
    DROPLESS_RETURN_IF_ERROR(group_->Await(ncclDevCommCreate(group_->comm(), &reqs, &dev_comm_),
                                           "nccl-lsa: ncclDevCommCreate (symmetric memory support)"));
    dev_comm_created_ = true;
    if (dev_comm_.lsaSize != group_->size()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "dispatcher: nccl-lsa needs every EP rank load/store reachable (one NVLink domain); "
          "%d of the %d ranks are", dev_comm_.lsaSize, group_->size()));
    }
    int device = 0;
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
    return absl::OkStatus();
  }

  std::string_view name() const override { return "nccl-lsa"; }
  const EpShape& shape() const override { return shape_; }
  int local_ranks() const override { return 1; }
  int first_local_rank() const override { return group_->rank(); }

  absl::Status AllocateShared(size_t bytes, const char* what, void** out) override {
    Window w;
    w.bytes = std::max<size_t>(bytes, 1);
    if (const ncclResult_t r = ncclMemAlloc(&w.base, w.bytes); r != ncclSuccess) {
      // A window larger than what the device has left, after the arena's share, is the job
      // being too large for this GPU, as for the arena's own allocations.
      return arena_->AllocationFailure(
          w.bytes, absl::StrCat("nccl-lsa symmetric window for ", what).c_str(),
          NcclStatus(r, "ncclMemAlloc").message(), /*out_of_memory=*/true);
    }
    absl::Status s = group_->Await(
        ncclCommWindowRegister(group_->comm(), w.base, w.bytes, &w.window, NCCL_WIN_COLL_SYMMETRIC),
        absl::StrCat("nccl-lsa: ncclCommWindowRegister for ", what).c_str());
    if (!s.ok()) {
      // The registration is collective and non-blocking: after a timeout (a peer that never
      // joined it) NCCL's background may still hold the buffer. Abort the communicator first (the
      // engine fails with this error anyway), then free; the free's result has no caller.
      group_->Abort();
      (void)ncclMemFree(w.base);
      return s;
    }
    windows_.push_back(w);
    arena_->CountHeldElsewhere(static_cast<int64_t>(w.bytes));
    *out = w.base;
    return absl::OkStatus();
  }

  absl::Status Plan(absl::Span<const RankCall> calls) override {
    DROPLESS_RETURN_IF_ERROR(ValidateRankCalls(*this, calls, /*rows=*/false, 0));
    const ExchangePlan& p = *calls[0].plan;
    absl::StatusOr<std::pair<ncclWindow_t, size_t>> matrix = Resolve(p.count_matrix);
    if (!matrix.ok()) return matrix.status();
    LsaPlanKernel<<<1, 256, 0, calls[0].stream>>>(dev_comm_, matrix->first, matrix->second,
                                                   p.send_offsets, p.count_matrix, p.job_counts,
                                                   p.recv_offsets, p.dest_rows, shape_.ep,
                                                   shape_.experts, group_->rank());
    return LaunchStatus("LsaPlanKernel");
  }

  absl::Status AllReduceSum(absl::Span<float* const> data, size_t count,
                            absl::Span<const cudaStream_t> streams) override {
    DROPLESS_RETURN_IF_ERROR(CheckOne(data.size(), streams.size()));
    return group_->Await(ncclAllReduce(data[0], data[0], count, ncclFloat32, ncclSum,
                                       group_->comm(), streams[0]), "nccl-lsa: ncclAllReduce");
  }
  absl::Status AllReduceSum(absl::Span<double* const> data, size_t count,
                            absl::Span<const cudaStream_t> streams) override {
    DROPLESS_RETURN_IF_ERROR(CheckOne(data.size(), streams.size()));
    return group_->Await(ncclAllReduce(data[0], data[0], count, ncclFloat64, ncclSum,
                                       group_->comm(), streams[0]), "nccl-lsa: ncclAllReduce");
  }

 private:
  struct Window {
    void* base = nullptr;
    size_t bytes = 0;
    ncclWindow_t window = nullptr;
  };

  absl::StatusOr<std::pair<ncclWindow_t, size_t>> Resolve(const void* p) const {
    for (const Window& w : windows_) {
      const uint8_t* base = static_cast<const uint8_t*>(w.base);
      const uint8_t* q = static_cast<const uint8_t*>(p);
      if (q >= base && q < base + w.bytes) return std::make_pair(w.window, static_cast<size_t>(q - base));
    }
    return absl::InvalidArgumentError(
        "nccl-lsa: a receive buffer or count matrix not allocated by the dispatcher (AllocateShared)");
  }

  absl::Status CheckOne(size_t buffers, size_t streams) const {
    if (buffers != 1 || streams != 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "nccl-lsa: %d buffers and %d streams for the one rank of this process", buffers, streams));
    }
    return absl::OkStatus();
  }

  absl::Status Exchange(absl::Span<const RankCall> calls, size_t row_bytes, bool to_owner,
                        LocalExperts experts) override {
    DROPLESS_RETURN_IF_ERROR(ValidateRankCalls(*this, calls, /*rows=*/true, row_bytes));
    DROPLESS_RETURN_IF_ERROR(ValidateLocalExperts(shape_, experts));
    const int first = experts.count == 0 ? 0 : experts.first;
    const int count = experts.count == 0 ? shape_.local_experts() : experts.count;
    const RankCall& c = calls[0];
    absl::StatusOr<std::pair<ncclWindow_t, size_t>> recv = Resolve(c.recv_rows);
    if (!recv.ok()) return recv.status();
    // Before: every owner's receive buffer is free (dispatch) or filled (combine). After: every
    // row has landed (dispatch) or been read back (combine, so the owner may reuse the buffer).
    LsaBarrierKernel<<<1, 32, 0, c.stream>>>(dev_comm_);
    DROPLESS_RETURN_IF_ERROR(LaunchStatus("LsaBarrierKernel"));
    const int64_t warps_per_block = kRowThreads / 32;
    const int64_t blocks = std::min<int64_t>(4 * sms_, (shape_.rows + warps_per_block - 1) / warps_per_block);
    if (blocks > 0) {
      auto* kernel = xd::WideRows(row_bytes) ? LsaRowsKernel<uint4> : LsaRowsKernel<uint32_t>;
      kernel<<<static_cast<unsigned>(blocks), kRowThreads, 0, c.stream>>>(
          recv->first, recv->second, c.plan->send_offsets, c.plan->dest_rows,
          static_cast<uint8_t*>(c.send_rows), shape_.ep, shape_.experts, first, count,
          xd::RowVectors(row_bytes), to_owner);
      DROPLESS_RETURN_IF_ERROR(LaunchStatus("LsaRowsKernel"));
    }
    LsaBarrierKernel<<<1, 32, 0, c.stream>>>(dev_comm_);
    return LaunchStatus("LsaBarrierKernel");
  }

  const EpShape shape_;
  std::unique_ptr<NcclGroup> group_;
  DeviceArena* const arena_;  // counts the windows' bytes (outlives the dispatcher)
  ncclDevComm dev_comm_{};
  bool dev_comm_created_ = false;
  int sms_ = 132;
  std::vector<Window> windows_;
};

}  // namespace

// The device API's structures are those of the headers built against: an older library would
// misread them.
absl::Status NcclLsaRuntimeSupported() {
  int version = 0;
  DROPLESS_RETURN_IF_ERROR(NcclStatus(ncclGetVersion(&version), "ncclGetVersion"));
  if (version < NCCL_VERSION_CODE) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "dispatcher: nccl-lsa was built against NCCL %d.%d.%d and needs at least that at run "
        "time; this process loaded NCCL version code %d (set LD_LIBRARY_PATH to a newer "
        "libnccl.so.2)",
        NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, version));
  }
  return absl::OkStatus();
}

absl::Status NcclLsaReachable(NcclGroup& group) {
  DROPLESS_RETURN_IF_ERROR(NcclLsaRuntimeSupported());
  ncclDevCommRequirements reqs;
  std::memset(&reqs, 0, sizeof(reqs));
  ncclDevComm probe{};
  const ncclResult_t created = ncclDevCommCreate(group.comm(), &reqs, &probe);
  if (created == ncclInvalidUsage) {
    // Refused before any work was handed to NCCL's background (no symmetric-memory support for
    // these ranks): the communicator is untouched, and nccl-a2a can still run on it.
    return absl::FailedPreconditionError(absl::StrCat(
        "ncclDevCommCreate refused the group (", ncclGetErrorString(created),
        "): no symmetric-memory support"));
  }
  DROPLESS_RETURN_IF_ERROR(group.Await(created, "nccl-lsa probe: ncclDevCommCreate"));
  const int reachable = probe.lsaSize;
  DROPLESS_RETURN_IF_ERROR(group.Await(ncclDevCommDestroy(group.comm(), &probe),
                                       "nccl-lsa probe: ncclDevCommDestroy"));
  if (reachable != group.size()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%d of the %d ranks are load/store reachable (one NVLink domain needed)", reachable,
        group.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ExpertDispatcher>> NewNcclLsaDispatcher(
    const EpShape& shape, std::unique_ptr<NcclGroup> group, DeviceArena* arena) {
  DROPLESS_RETURN_IF_ERROR(ValidateEpShape(shape));
  if (arena == nullptr) return absl::InvalidArgumentError("nccl-lsa: no device arena");
  if (group == nullptr || group->size() != shape.ep) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "nccl-lsa: an NCCL group of %d ranks for EP %d", group == nullptr ? 0 : group->size(), shape.ep));
  }
  auto d = std::make_unique<NcclLsaDispatcher>(shape, std::move(group), arena);
  DROPLESS_RETURN_IF_ERROR(d->Initialize());
  return std::unique_ptr<ExpertDispatcher>(std::move(d));
}

}  // namespace dropless::cuda_engine
