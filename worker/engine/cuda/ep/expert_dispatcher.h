// ExpertDispatcher: how the CUDA engine's MoE layers reach the experts of other EP ranks, on
// device buffers with device-side counts, enqueued on CUDA streams, never synchronizing with the
// host (capturable in the step's CUDA graph).
//
// Layout (the CPU engine's ExpertExchange, worker/engine/cpu/expert_exchange.h): EP rank p owns the
// global experts [p * El, (p + 1) * El) (El = E / ep). A rank's rows leave in global expert order
// (the layer's dispatch plan: send_offsets[e] .. send_offsets[e + 1] are expert e's rows) and
// arrive grouped by local expert, each group ordered by source rank, so the received rows of one
// expert are in the same order as in an EP=1 run over the job's tokens. Combine is the exact
// reverse. The backward passes are the same two copies on gradients: the dispatch's backward is a
// Combine, the combine's backward a Dispatch.
//
// Calls are collective over the EP group. A dispatcher drives the EP ranks that live in this
// process (local_ranks(): every rank for `local`, one for the NCCL backends); each call takes one
// RankCall per such rank, in rank order, and returns once the work is queued on their streams.
#ifndef DROPLESS_WORKER_ENGINE_CUDA_EP_EXPERT_DISPATCHER_H_
#define DROPLESS_WORKER_ENGINE_CUDA_EP_EXPERT_DISPATCHER_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/engine/cuda/device_memory.h"

namespace dropless::cuda_engine {

struct EpShape {
  int ep = 1;          // EP group size
  int experts = 0;     // E, global
  int64_t rows = 0;    // T * k: the most rows one rank sends (and gets back)
  int local_experts() const { return experts / ep; }
  // The most rows one rank can receive: every source's rows all routed to this rank.
  int64_t max_recv_rows() const { return rows * ep; }
};

absl::Status ValidateEpShape(const EpShape& shape);

// One rank's plan of one layer's exchange (device memory), made by Plan and used by every later
// call of that layer's step, forward and backward.
struct ExchangePlan {
  const int32_t* send_offsets = nullptr;  // [E + 1] this rank's rows per global expert (input)
  int32_t* count_matrix = nullptr;        // [ep][E] rows of every source rank per global expert
  int32_t* job_counts = nullptr;          // [E] rows per expert over the EP group (column sums)
  int32_t* dest_rows = nullptr;           // [E] where this rank's first row of expert e lands
                                          //     in the receive buffer of e's owner
  int32_t* recv_offsets = nullptr;        // [El + 1] this rank's received rows per local expert
};

class ExpertDispatcher;
// Allocates the device arrays of one plan (send_offsets stays the caller's): the count matrix
// from the dispatcher's shared memory (peers write it), the rest from the arena.
absl::Status AllocateExchangePlan(ExpertDispatcher* dispatcher, DeviceArena* arena,
                                  ExchangePlan* plan);

// A run of every owner's local experts, [first, first + count): an exchange restricted to it moves
// only the rows of those experts (overlap's chunks: the rows of the first experts travel while the
// GEMMs of the previous run compute). count 0 means every local expert.
struct LocalExperts {
  int first = 0;
  int count = 0;
};
// InvalidArgument naming the run when it is not inside [0, local_experts).
absl::Status ValidateLocalExperts(const EpShape& shape, LocalExperts run);

// One local rank's arguments to a collective call.
struct RankCall {
  const ExchangePlan* plan = nullptr;
  void* send_rows = nullptr;  // [rows] in global expert order (Dispatch reads, Combine writes)
  void* recv_rows = nullptr;  // [max_recv_rows] by local expert (Dispatch writes, Combine reads)
  cudaStream_t stream = nullptr;
};

class ExpertDispatcher {
 public:
  virtual ~ExpertDispatcher() = default;

  virtual std::string_view name() const = 0;
  virtual const EpShape& shape() const = 0;
  // The EP ranks this process drives and the first of them.
  virtual int local_ranks() const = 0;
  virtual int first_local_rank() const = 0;

  // Device memory the group's peers read or write during the exchanges: every buffer that is a
  // RankCall's recv_rows, and the plans' count matrices. Plain device memory for `local`, NCCL
  // symmetric-memory windows for nccl-lsa. Every rank must make the same allocations in the same
  // order (the windows are registered collectively). Owned by the dispatcher.
  virtual absl::Status AllocateShared(size_t bytes, const char* what, void** out) = 0;
  template <typename T>
  absl::Status AllocateShared(int64_t count, const char* what, T** out) {
    void* p = nullptr;
    absl::Status s = AllocateShared(static_cast<size_t>(count) * sizeof(T), what, &p);
    *out = static_cast<T*>(p);
    return s;
  }

  // Exchanges the per-expert counts (calls[r].plan->send_offsets) and fills every other field of
  // each rank's plan.
  virtual absl::Status Plan(absl::Span<const RankCall> calls) = 0;
  // Rows of row_bytes (a multiple of 4; 16 copies fastest) from each rank's send_rows to the
  // owners' recv_rows: the rows of the `experts` run of every owner (all by default).
  absl::Status Dispatch(absl::Span<const RankCall> calls, size_t row_bytes,
                        LocalExperts experts = {}) {
    return Exchange(calls, row_bytes, /*to_owner=*/true, experts);
  }
  // The reverse: each received row back to the position in its source's send_rows.
  absl::Status Combine(absl::Span<const RankCall> calls, size_t row_bytes,
                       LocalExperts experts = {}) {
    return Exchange(calls, row_bytes, /*to_owner=*/false, experts);
  }
  // Whether Dispatch and Combine move a run of the local experts for about its share of the
  // bytes (what overlap's chunks need); a dispatcher that cannot refuses runs.
  virtual bool exchanges_expert_runs() const { return true; }
  // In-place sums over the EP group: data[r] is local rank r's buffer, streams[r] its stream.
  virtual absl::Status AllReduceSum(absl::Span<float* const> data, size_t count,
                                    absl::Span<const cudaStream_t> streams) = 0;
  virtual absl::Status AllReduceSum(absl::Span<double* const> data, size_t count,
                                    absl::Span<const cudaStream_t> streams) = 0;

 protected:
  // Dispatch (to_owner) or Combine of the rows of the `experts` run (count 0: every expert).
  virtual absl::Status Exchange(absl::Span<const RankCall> calls, size_t row_bytes, bool to_owner,
                                LocalExperts experts) = 0;
};

// One clear error when `calls` are not one complete call per local rank (with buffers when
// `rows`), or a row of row_bytes cannot be copied (row_bytes 0 skips that check).
absl::Status ValidateRankCalls(const ExpertDispatcher& dispatcher,
                               absl::Span<const RankCall> calls, bool rows, size_t row_bytes);

// `local`: every rank of the EP group inside this process on one GPU, each with its own buffers
// and streams; tokens move with device copies. For tests and benchmarks of EP on one GPU.
// `links` orders the ranks' streams around each collective; shared memory comes from `arena`
// (both must outlive the dispatcher).
absl::StatusOr<std::unique_ptr<ExpertDispatcher>> NewLocalDispatcher(const EpShape& shape,
                                                                     StreamLinks* links,
                                                                     DeviceArena* arena);

class NcclGroup;
// `nccl-lsa`: one EP rank per process over NCCL's device API (symmetric memory, load/store across
// NVLink); takes the group's communicator (ep/nccl_group.h). FailedPrecondition when the ranks
// are not all load/store reachable. Its symmetric windows are NCCL's allocations, counted in
// `arena` (CountHeldElsewhere; it must outlive the dispatcher).
absl::StatusOr<std::unique_ptr<ExpertDispatcher>> NewNcclLsaDispatcher(
    const EpShape& shape, std::unique_ptr<NcclGroup> group, DeviceArena* arena);
// Whether nccl-lsa can run on `group` (collective: every rank calls it): OK when every rank is
// load/store reachable and the loaded NCCL runtime has the device API of the headers; otherwise
// FailedPrecondition saying why (what `auto` reports when it picks nccl-a2a instead); any other
// error means the probe itself failed, and the communicator may be unusable.
absl::Status NcclLsaReachable(NcclGroup& group);
// Whether this process's NCCL runtime has the device API nccl-lsa was built against (needs no
// group): OK, or FailedPrecondition naming both versions when the loaded NCCL is older.
absl::Status NcclLsaRuntimeSupported();

// `nccl-a2a`: one EP rank per process over NCCL's host API (ncclAllGather of the counts, grouped
// ncclSend/ncclRecv of the rows), for ranks that load/store cannot reach. Sizes stay on the device,
// so every exchange moves whole slots of shape.rows rows per peer (ep x an exact exchange's
// bytes); max_row_bytes: the largest row any call moves (staging: 2 x ep x rows x max_row_bytes,
// allocated from `arena`, which must outlive the dispatcher).
// Its slots do not shrink with the rows that count, so it refuses runs of the local experts
// (exchanges_expert_runs() is false: overlap would multiply its bytes by the chunks).
absl::StatusOr<std::unique_ptr<ExpertDispatcher>> NewNcclA2aDispatcher(
    const EpShape& shape, size_t max_row_bytes, std::unique_ptr<NcclGroup> group,
    DeviceArena* arena);

// The most EP ranks one process drives (`local`) or one LSA team holds (`nccl-lsa`).
inline constexpr int kMaxLocalRanks = 8;

}  // namespace dropless::cuda_engine

#endif  // DROPLESS_WORKER_ENGINE_CUDA_EP_EXPERT_DISPATCHER_H_
