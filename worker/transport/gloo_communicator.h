// GlooCommunicator: one group's collectives over Gloo's TCP transport (CPU buffers). Gloo reports
// failures by throwing; every call here catches at this boundary and returns a status instead, and
// a group that failed once refuses later calls (its connections are in an unknown state).
#ifndef DROPLESS_WORKER_TRANSPORT_GLOO_COMMUNICATOR_H_
#define DROPLESS_WORKER_TRANSPORT_GLOO_COMMUNICATOR_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gloo/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/device.h"
#include "worker/transport/communicator.h"

namespace dropless {

class GlooCommunicator : public Communicator {
 public:
  // Joins the group `group_name` (used in messages) as `rank` of `size`: publishes this rank's
  // address in `store` (already prefixed for the group), connects to every peer through `device`.
  // DeadlineExceeded when a peer does not show up within `connect_timeout`; every later
  // collective waits up to `collective_timeout` for its peers.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Connect(
      std::string group_name, int rank, int size, gloo::rendezvous::Store& store,
      std::shared_ptr<gloo::transport::Device> device, absl::Duration connect_timeout,
      absl::Duration collective_timeout);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view name() const override { return "gloo"; }

  // Slices laid out back to back in peer order go to Gloo as they are; other layouts are packed
  // into a staging buffer first (Gloo's alltoallv takes counts, not offsets). The sizes are first
  // checked pairwise with a small all-to-all, because Gloo kills the process (an enforce on its
  // event-loop thread) when a peer sends more than the receiver posted.
  absl::Status AllToAllV(const void* send, absl::Span<const int64_t> send_bytes,
                         absl::Span<const int64_t> send_offsets, void* recv,
                         absl::Span<const int64_t> recv_bytes,
                         absl::Span<const int64_t> recv_offsets) override;
  // bytes_per_peer must be the same on every rank (unchecked: Gloo aborts the process otherwise).
  absl::Status AllToAll(const void* send, void* recv, size_t bytes_per_peer) override;
  // The size must be the same on every rank (unchecked: Gloo aborts the process otherwise).
  // Gloo's ring all-reduce: every element is summed on one rank and then broadcast, so all ranks
  // hold bit-identical results.
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status AllReduceSum(double* data, size_t count) override;
  absl::Status Barrier() override;

 private:
  GlooCommunicator(std::string group_name, std::shared_ptr<gloo::Context> context,
                   std::chrono::milliseconds timeout);

  // Runs one Gloo collective, turning exceptions into a status that also poisons the group.
  template <typename Body>
  absl::Status Run(absl::string_view what, Body&& body);
  template <typename T>
  absl::Status AllReduce(T* data, size_t count);
  // InvalidArgument (and a failed group) on both ranks of any pair whose sizes disagree.
  absl::Status CheckPairwiseSizes(absl::Span<const int64_t> send_bytes,
                                  absl::Span<const int64_t> recv_bytes);

  const std::string group_name_;
  const std::shared_ptr<gloo::Context> context_;
  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  // Every rank makes the same sequence of calls, so counting them gives matching Gloo tags.
  uint32_t next_tag_ = 0;
  absl::Status failure_;
};

}  // namespace dropless

#endif  // DROPLESS_WORKER_TRANSPORT_GLOO_COMMUNICATOR_H_
