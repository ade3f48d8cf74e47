// The NCCL communicator of one EP group, set up through the job attempt's rendezvous store:
// every rank announces itself (`<prefix>/joined/<rank>`), rank 0 creates the NCCL unique id and
// puts it under `<prefix>/id`, and every rank initializes its communicator non-blocking and polls
// it against one deadline. On any failure or timeout the communicator is aborted (never a hang)
// and the error names the ranks that never announced themselves.
#ifndef DROPLESS_WORKER_ENGINE_CUDA_EP_NCCL_GROUP_H_
#define DROPLESS_WORKER_ENGINE_CUDA_EP_NCCL_GROUP_H_

#include <nccl.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/transport/kv_store.h"

namespace dropless::cuda_engine {

// NCCL result -> absl::Status ("what: <NCCL's message>").
absl::Status NcclStatus(ncclResult_t result, const char* what);

class NcclGroup {
 public:
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  ncclComm_t comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Aborts the communicator (pending NCCL work is cancelled; later calls fail). Idempotent.
  void Abort();

  // The communicator is non-blocking (so that setup and abort never hang): a call may return
  // ncclInProgress and finish in the background, and the next call must wait for it. Await
  // returns once the call that returned `result` has completed (host side: an enqueued
  // collective is complete when it is queued on its stream), or an error naming `what`.
  absl::Status Await(ncclResult_t result, const char* what);

 private:
  friend absl::StatusOr<std::unique_ptr<NcclGroup>> JoinNcclGroup(KeyValueStore*,
                                                                  const std::string&, int, int,
                                                                  absl::Duration);
  NcclGroup(ncclComm_t comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  ncclComm_t comm_;
  int rank_, size_;
};

// Whether `mine` holds on every rank of the group: an all-reduce (min) of one int on a stream of
// its own, waited for on the host (set-up only; never on a step's path). Every rank must call it;
// DeadlineExceeded after 2 minutes (a rank that never calls it), the communicator's error if NCCL
// reports one meanwhile.
absl::StatusOr<bool> AllRanksAgree(NcclGroup& group, bool mine);

// Joins the group `prefix` (unique per attempt and group, e.g. "ep/0") as `rank` of `size` on the
// current CUDA device. DeadlineExceeded after `timeout` naming the ranks that did not join.
absl::StatusOr<std::unique_ptr<NcclGroup>> JoinNcclGroup(KeyValueStore* store,
                                                         const std::string& prefix, int rank,
                                                         int size, absl::Duration timeout);

}  // namespace dropless::cuda_engine

#endif  // DROPLESS_WORKER_ENGINE_CUDA_EP_NCCL_GROUP_H_
