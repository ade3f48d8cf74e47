// Communicator: collectives among the ranks of one group. The engine reaches other ranks only
// through this interface; implementations: local (threads of one process, tests), gloo (CPU, TCP),
// and later NCCL (GPU buffers). Buffers are host memory for local/gloo, device memory for NCCL.
// Calls are collective: every rank of the group makes the same sequence of calls.
#ifndef DROPLESS_WORKER_TRANSPORT_COMMUNICATOR_H_
#define DROPLESS_WORKER_TRANSPORT_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dropless {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "gloo", "local", "nccl-a2a", ...
  virtual std::string_view name() const = 0;

  // All-to-all with variable sizes: send_bytes[p] bytes starting at send + send_offsets[p] go to
  // peer p, recv_bytes[p] bytes from peer p land at recv + recv_offsets[p]. Sizes must agree
  // pairwise (what p sends to q is what q expects from p).
  virtual absl::Status AllToAllV(const void* send, absl::Span<const int64_t> send_bytes,
                                 absl::Span<const int64_t> send_offsets, void* recv,
                                 absl::Span<const int64_t> recv_bytes,
                                 absl::Span<const int64_t> recv_offsets) = 0;

  // Equal-size all-to-all: bytes_per_peer from each peer's slice (e.g. per-expert counts).
  virtual absl::Status AllToAll(const void* send, void* recv, size_t bytes_per_peer) = 0;

  // In-place sum over the group.
  virtual absl::Status AllReduceSum(float* data, size_t count) = 0;
  virtual absl::Status AllReduceSum(double* data, size_t count) = 0;

  virtual absl::Status Barrier() = 0;
};

class KeyValueStore;

// The groups one rank belongs to. Rank layout: ep_rank = rank % ep, dp_rank = rank / ep.
struct RankGroups {
  std::unique_ptr<Communicator> world;  // every rank of the job attempt
  std::unique_ptr<Communicator> ep;     // ranks with the same dp_rank (token dispatch/combine)
  std::unique_ptr<Communicator> dp;     // ranks with the same ep_rank (expert gradient all-reduce)
  // The attempt's rendezvous store (not owned), where GPU engines set up their NCCL groups; null
  // for groups that live in one process.
  KeyValueStore* store = nullptr;
};

}  // namespace dropless

#endif  // DROPLESS_WORKER_TRANSPORT_COMMUNICATOR_H_
