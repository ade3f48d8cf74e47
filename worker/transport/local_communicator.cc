// CreateLocalGroups: Communicators for ranks that are threads of one process. Each collective is a
// rendezvous on the group's shared state: every rank publishes a description of its call (pointers
// and sizes), waits for the others, reads its peers' buffers directly, and waits again so that no
// buffer is released while a peer may still read it.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "worker/transport/rank_layout.h"
#include "worker/transport/transport_factory.h"

namespace dropless {
namespace {

enum class Op { kAllToAllV, kAllToAll, kAllReduceFloat, kAllReduceDouble, kBarrier };

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllToAllV: return "AllToAllV";
    case Op::kAllToAll: return "AllToAll";
    case Op::kAllReduceFloat: return "AllReduceSum(float)";
    case Op::kAllReduceDouble: return "AllReduceSum(double)";
    case Op::kBarrier: return "Barrier";
  }
  return "?";
}

// One rank's side of a collective. Lives on that rank's stack until the rank's last Sync of the call.
struct Contribution {
  Op op = Op::kBarrier;
  absl::Status args;  // the rank's own argument check, shared so that every rank fails alike
  const void* send = nullptr;
  void* recv = nullptr;
  absl::Span<const int64_t> send_bytes, send_offsets, recv_bytes, recv_offsets;
  size_t count = 0;               // AllToAll: bytes per peer; AllReduceSum: elements
  const void* reduced = nullptr;  // AllReduceSum: this rank's finished slice of the sum
};

// The shared state of one group: a reusable barrier with a timeout, and one published
// Contribution per rank.
class LocalGroup {
 public:
  LocalGroup(int size, absl::Duration timeout)
      : size_(size), timeout_(timeout), slots_(size, nullptr) {}

  int size() const { return size_; }

  // Publishes `mine` for `rank` and waits until every rank of the group has published.
  absl::Status Exchange(int rank, const Contribution* mine) {
    {
      absl::MutexLock lock(&mu_);
      slots_[rank] = mine;
    }
    return Sync(rank);
  }

  // Valid between a successful Exchange and the Sync that ends the call.
  const Contribution& contribution(int rank) const {
    absl::MutexLock lock(&mu_);
    return *slots_[rank];
  }

  absl::Status Sync(int rank) {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      return absl::OkStatus();
    }
    auto released = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return generation_ != generation || !failure_.ok();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&released), timeout_)) {
      failure_ = absl::DeadlineExceededError(absl::StrFormat(
          "local group of %d ranks: rank %d waited %s and only %d ranks arrived; the group is "
          "unusable from now on",
          size_, rank, absl::FormatDuration(timeout_), arrived_));
    }
    if (generation_ != generation) return absl::OkStatus();
    return failure_;
  }

 private:
  const int size_;
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::vector<const Contribution*> slots_ ABSL_GUARDED_BY(mu_);
};

absl::Status CheckPerPeerSizes(absl::Span<const int64_t> sizes, absl::Span<const int64_t> offsets,
                               const void* buffer, int group_size, const char* sizes_name,
                               const char* offsets_name, const char* buffer_name) {
  if (static_cast<int>(sizes.size()) != group_size || static_cast<int>(offsets.size()) != group_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s and %s must have one entry per peer (%d), got %d and %d", sizes_name, offsets_name,
        group_size, sizes.size(), offsets.size()));
  }
  for (int p = 0; p < group_size; ++p) {
    if (sizes[p] < 0 || offsets[p] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s[%d] = %d and %s[%d] = %d must not be negative", sizes_name, p, sizes[p], offsets_name,
          p, offsets[p]));
    }
    if (sizes[p] > 0 && buffer == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s is null but %s[%d] = %d", buffer_name, sizes_name, p, sizes[p]));
    }
  }
  return absl::OkStatus();
}

class LocalCommunicator : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string_view name() const override { return "local"; }

  absl::Status AllToAllV(const void* send, absl::Span<const int64_t> send_bytes,
                         absl::Span<const int64_t> send_offsets, void* recv,
                         absl::Span<const int64_t> recv_bytes,
                         absl::Span<const int64_t> recv_offsets) override {
    Contribution mine;
    mine.op = Op::kAllToAllV;
    mine.send = send;
    mine.recv = recv;
    mine.send_bytes = send_bytes;
    mine.send_offsets = send_offsets;
    mine.recv_bytes = recv_bytes;
    mine.recv_offsets = recv_offsets;
    mine.args = CheckPerPeerSizes(send_bytes, send_offsets, send, size(), "send_bytes",
                                  "send_offsets", "send");
    if (mine.args.ok()) {
      mine.args = CheckPerPeerSizes(recv_bytes, recv_offsets, recv, size(), "recv_bytes",
                                    "recv_offsets", "recv");
    }
    if (absl::Status s = group_->Exchange(rank_, &mine); !s.ok()) return s;
    absl::Status agreed = CheckAgreement(mine.op);
    if (agreed.ok()) {
      for (int p = 0; p < size(); ++p) {
        if (recv_bytes[p] == 0) continue;
        const Contribution& peer = group_->contribution(p);
        std::memcpy(static_cast<char*>(recv) + recv_offsets[p],
                    static_cast<const char*>(peer.send) + peer.send_offsets[rank_], recv_bytes[p]);
      }
    }
    return Finish(agreed);
  }

  absl::Status AllToAll(const void* send, void* recv, size_t bytes_per_peer) override {
    Contribution mine;
    mine.op = Op::kAllToAll;
    mine.send = send;
    mine.recv = recv;
    mine.count = bytes_per_peer;
    if (bytes_per_peer > 0 && (send == nullptr || recv == nullptr)) {
      mine.args = absl::InvalidArgumentError(absl::StrFormat(
          "send and recv must not be null with bytes_per_peer = %d", bytes_per_peer));
    }
    if (absl::Status s = group_->Exchange(rank_, &mine); !s.ok()) return s;
    absl::Status agreed = CheckAgreement(mine.op);
    if (agreed.ok() && bytes_per_peer > 0) {
      for (int p = 0; p < size(); ++p) {
        const Contribution& peer = group_->contribution(p);
        std::memcpy(static_cast<char*>(recv) + p * bytes_per_peer,
                    static_cast<const char*>(peer.send) + rank_ * bytes_per_peer, bytes_per_peer);
      }
    }
    return Finish(agreed);
  }

  absl::Status AllReduceSum(float* data, size_t count) override {
    return AllReduce(Op::kAllReduceFloat, data, count);
  }
  absl::Status AllReduceSum(double* data, size_t count) override {
    return AllReduce(Op::kAllReduceDouble, data, count);
  }

  absl::Status Barrier() override {
    Contribution mine;
    mine.op = Op::kBarrier;
    if (absl::Status s = group_->Exchange(rank_, &mine); !s.ok()) return s;
    return Finish(CheckAgreement(mine.op));
  }

 private:
  // Each rank sums one slice of the elements over ranks 0..n-1 in that order, so the result does
  // not depend on thread timing and is bit-identical on every rank.
  template <typename T>
  absl::Status AllReduce(Op op, T* data, size_t count) {
    Contribution mine;
    mine.op = op;
    mine.recv = data;
    mine.count = count;
    if (count > 0 && data == nullptr) {
      mine.args = absl::InvalidArgumentError(
          absl::StrFormat("data must not be null with count = %d", count));
    }
    if (absl::Status s = group_->Exchange(rank_, &mine); !s.ok()) return s;
    absl::Status agreed = CheckAgreement(op);
    if (!agreed.ok()) return Finish(agreed);

    const int n = size();
    auto slice_begin = [count, n](int r) { return count * r / n; };
    const size_t begin = slice_begin(rank_);
    const size_t end = slice_begin(rank_ + 1);
    std::vector<T> reduced(end - begin);
    for (size_t i = begin; i < end; ++i) {
      T sum = static_cast<const T*>(group_->contribution(0).recv)[i];
      for (int p = 1; p < n; ++p) sum += static_cast<const T*>(group_->contribution(p).recv)[i];
      reduced[i - begin] = sum;
    }
    mine.reduced = reduced.data();
    // Every slice is finished before anyone overwrites its input.
    if (absl::Status s = group_->Sync(rank_); !s.ok()) return s;
    for (int p = 0; p < n; ++p) {
      const size_t b = slice_begin(p), e = slice_begin(p + 1);
      if (e > b) {
        std::memcpy(data + b, group_->contribution(p).reduced, (e - b) * sizeof(T));
      }
    }
    return Finish(absl::OkStatus());
  }

  // Every rank evaluates the same checks on the same published data, so all fail alike.
  absl::Status CheckAgreement(Op op) const {
    const int n = size();
    for (int p = 0; p < n; ++p) {
      const Contribution& c = group_->contribution(p);
      if (c.op != op) {
        return absl::FailedPreconditionError(
            absl::StrFormat("collective mismatch in local group: rank %d called %s, rank %d %s",
                            rank_, OpName(op), p, OpName(c.op)));
      }
      if (!c.args.ok()) {
        return absl::Status(c.args.code(),
                            absl::StrFormat("%s on rank %d: %s", OpName(op), p, c.args.message()));
      }
    }
    if (op == Op::kAllToAllV) {
      for (int p = 0; p < n; ++p) {
        for (int q = 0; q < n; ++q) {
          const int64_t sent = group_->contribution(p).send_bytes[q];
          const int64_t expected = group_->contribution(q).recv_bytes[p];
          if (sent != expected) {
            return absl::InvalidArgumentError(absl::StrFormat(
                "AllToAllV size mismatch: rank %d sends %d bytes to rank %d, which expects %d",
                p, sent, q, expected));
          }
        }
      }
    }
    if (op == Op::kAllToAll || op == Op::kAllReduceFloat || op == Op::kAllReduceDouble) {
      const size_t count0 = group_->contribution(0).count;
      for (int p = 1; p < n; ++p) {
        if (group_->contribution(p).count != count0) {
          return absl::InvalidArgumentError(
              absl::StrFormat("%s size mismatch: rank 0 passed %d, rank %d passed %d", OpName(op),
                              count0, p, group_->contribution(p).count));
        }
      }
    }
    return absl::OkStatus();
  }

  // The closing barrier: after it no peer reads this rank's buffers or Contribution.
  absl::Status Finish(absl::Status result) {
    absl::Status synced = group_->Sync(rank_);
    return result.ok() ? synced : result;
  }

  std::shared_ptr<LocalGroup> group_;
  const int rank_;
};

}  // namespace

std::vector<RankGroups> CreateLocalGroups(int ep, int dp, absl::Duration timeout) {
  std::vector<RankGroups> groups;
  if (ep < 1 || dp < 1) return groups;
  const int world_size = ep * dp;
  auto world = std::make_shared<LocalGroup>(world_size, timeout);
  std::vector<std::shared_ptr<LocalGroup>> ep_groups, dp_groups;
  for (int d = 0; d < dp; ++d) ep_groups.push_back(std::make_shared<LocalGroup>(ep, timeout));
  for (int e = 0; e < ep; ++e) dp_groups.push_back(std::make_shared<LocalGroup>(dp, timeout));
  for (int rank = 0; rank < world_size; ++rank) {
    const int ep_rank = EpRankOf(rank, ep);
    const int dp_rank = DpRankOf(rank, ep);
    RankGroups g;
    g.world = std::make_unique<LocalCommunicator>(world, rank);
    g.ep = std::make_unique<LocalCommunicator>(ep_groups[dp_rank], ep_rank);
    g.dp = std::make_unique<LocalCommunicator>(dp_groups[ep_rank], dp_rank);
    groups.push_back(std::move(g));
  }
  return groups;
}

std::vector<RankGroups> CreateLocalGroups(int ep, int dp) {
  return CreateLocalGroups(ep, dp, absl::Minutes(10));
}

}  // namespace dropless
