// JoinNcclGroup (nccl_group.h).
#include "worker/engine/cuda/ep/nccl_group.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"

namespace dropless::cuda_engine {
namespace {

std::string Key(const std::string& prefix, const std::string& name) {
  return absl::StrCat("nccl/", prefix, "/", name);
}

// The ranks whose announcement is missing from the store, e.g. "1, 3". Stops at the first
// answer that is not NotFound (the coordinator unreachable: its client's retry budget is spent
// once, not once a rank).
std::string MissingRanks(KeyValueStore* store, const std::string& prefix, int size) {
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    absl::StatusOr<std::string> joined = store->Get(Key(prefix, absl::StrCat("joined/", r)));
    if (joined.ok()) continue;
    if (!absl::IsNotFound(joined.status())) {
      return absl::StrCat(missing.empty() ? "" : absl::StrCat(absl::StrJoin(missing, ", "), ", "),
                          "unknown from rank ", r,
                          " on (the rendezvous store: ", joined.status().message(), ")");
    }
    missing.push_back(r);
  }
  return missing.empty() ? "none missing from the store (a rank stopped during NCCL's setup)"
                         : absl::StrJoin(missing, ", ");
}

}  // namespace

absl::Status NcclStatus(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(result)));
}

NcclGroup::~NcclGroup() {
  if (comm_ == nullptr) return;
  // Finalize flushes what is in flight (non-blocking: wait for it); on any error, abort. The
  // release's own result has no caller to go to.
  if (Await(ncclCommFinalize(comm_), "ncclCommFinalize").ok()) {
    (void)ncclCommDestroy(comm_);
  } else {
    (void)ncclCommAbort(comm_);
  }
}

absl::Status NcclGroup::Await(ncclResult_t result, const char* what) {
  // A call on a non-blocking communicator may hand its work to NCCL's background (ncclSuccess or
  // ncclInProgress): the communicator's state says when it is done.
  if (result != ncclSuccess && result != ncclInProgress) return NcclStatus(result, what);
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  while (true) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t asked = ncclCommGetAsyncError(comm_, &state);
    if (asked != ncclSuccess) return NcclStatus(asked, what);
    if (state != ncclInProgress) return NcclStatus(state, what);
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": still in progress after 2 minutes"));
    }
    std::this_thread::yield();
  }
}

void NcclGroup::Abort() {
  if (comm_ != nullptr) (void)ncclCommAbort(comm_);  // the error that led here is the one reported
  comm_ = nullptr;
}

absl::StatusOr<bool> AllRanksAgree(NcclGroup& group, bool mine) {
  int32_t* flag = nullptr;
  cudaStream_t stream = nullptr;
  struct Release {
    int32_t*& flag;
    cudaStream_t& stream;
    ~Release() {  // after the stream is idle or the wait gave up; errors have no caller here
      if (stream != nullptr) (void)cudaStreamDestroy(stream);
      if (flag != nullptr) (void)cudaFree(flag);
    }
  } release{flag, stream};
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaMalloc(&flag, sizeof(int32_t)));
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int32_t value = mine ? 1 : 0;
  DROPLESS_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(flag, &value, sizeof(value), cudaMemcpyHostToDevice, stream));
  // Once the all-reduce may be on the stream, every failure aborts the communicator (NCCL's
  // kernel would otherwise spin on, and freeing `flag` would wait for it) and drains the stream.
  auto give_up = [&](absl::Status status) {
    group.Abort();
    (void)cudaStreamSynchronize(stream);
    return status;
  };
  if (absl::Status queued = group.Await(
          ncclAllReduce(flag, flag, 1, ncclInt32, ncclMin, group.comm(), stream), "ncclAllReduce");
      !queued.ok()) {
    return give_up(queued);
  }
  // Polled rather than synchronized: a peer that never joins the all-reduce must not hang us.
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  cudaError_t done = cudaStreamQuery(stream);
  while (done == cudaErrorNotReady) {
    ncclResult_t state = ncclSuccess;
    absl::Status asked =
        NcclStatus(ncclCommGetAsyncError(group.comm(), &state), "ncclCommGetAsyncError");
    if (asked.ok()) asked = NcclStatus(state, "the ranks' agreement (ncclAllReduce)");
    if (!asked.ok()) return give_up(asked);
    if (absl::Now() > deadline) {
      return give_up(absl::DeadlineExceededError(
          "the ranks' agreement (ncclAllReduce): a rank did not take part within 2 minutes"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    done = cudaStreamQuery(stream);
  }
  DROPLESS_CUDA_RETURN_IF_ERROR(done);
  int32_t all = 0;
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemcpy(&all, flag, sizeof(all), cudaMemcpyDeviceToHost));
  return all == 1;
}

absl::StatusOr<std::unique_ptr<NcclGroup>> JoinNcclGroup(KeyValueStore* store,
                                                         const std::string& prefix, int rank,
                                                         int size, absl::Duration timeout) {
  if (store == nullptr || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "NCCL group %s: rank %d of %d (or no rendezvous store)", prefix, rank, size));
  }
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status put = store->Put(Key(prefix, absl::StrCat("joined/", rank)), "1");
  if (!put.ok()) return put;

  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  const std::string id_key = Key(prefix, "id");
  if (rank == 0) {
    absl::Status s = NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId");
    if (s.ok()) s = store->Put(id_key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    if (!s.ok()) return s;
  } else {
    absl::Status waited = store->Wait({id_key}, deadline - absl::Now());
    if (!waited.ok() && !absl::IsDeadlineExceeded(waited)) {
      // The attempt ended, the secret was refused, ...: the store's answer is the error, and
      // asking it which ranks joined would only repeat it.
      return absl::Status(waited.code(),
                          absl::StrFormat("NCCL group %s: rank %d waiting for rank 0's NCCL id: %s",
                                          prefix, rank, waited.message()));
    }
    if (!waited.ok()) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "NCCL group %s: rank %d waited %s for rank 0's NCCL id (%s); ranks that did not join: "
          "%s",
          prefix, rank, absl::FormatDuration(timeout), waited.message(),
          MissingRanks(store, prefix, size)));
    }
    absl::StatusOr<std::string> value = store->Get(id_key);
    if (!value.ok()) return value.status();
    if (value->size() != sizeof(id)) {
      return absl::DataLossError(absl::StrFormat(
          "NCCL group %s: the NCCL id in the store has %d bytes", prefix, value->size()));
    }
    std::memcpy(&id, value->data(), sizeof(id));
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  while (result == ncclInProgress || (result == ncclSuccess && comm != nullptr)) {
    ncclResult_t state = ncclInProgress;
    result = ncclCommGetAsyncError(comm, &state);
    if (result != ncclSuccess) break;
    if (state == ncclSuccess) return std::unique_ptr<NcclGroup>(new NcclGroup(comm, rank, size));
    if (state != ncclInProgress) {
      result = state;
      break;
    }
    if (absl::Now() > deadline) {
      (void)ncclCommAbort(comm);  // the timeout below is the error to report
      return absl::DeadlineExceededError(absl::StrFormat(
          "NCCL group %s: rank %d's communicator not ready after %s (aborted); ranks that did "
          "not join: %s",
          prefix, rank, absl::FormatDuration(timeout), MissingRanks(store, prefix, size)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (comm != nullptr) (void)ncclCommAbort(comm);  // the init's failure is the error to report
  return absl::Status(NcclStatus(result, "ncclCommInitRankConfig").code(),
                      absl::StrFormat("NCCL group %s: rank %d: ncclCommInitRankConfig: %s", prefix,
                                      rank, ncclGetErrorString(result)));
}

}  // namespace dropless::cuda_engine
