#include "worker/transport/gloo_communicator.h"

#include <cstring>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/alltoallv.h"
#include "gloo/barrier.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "worker/transport/gloo_store_bridge.h"

namespace dropless {
namespace {

// Gloo wants a real pointer even for empty buffers.
uint8_t empty_buffer_byte;

absl::Status CheckPerPeer(absl::Span<const int64_t> sizes, absl::Span<const int64_t> offsets,
                          const void* buffer, int group_size, const char* what) {
  if (static_cast<int>(sizes.size()) != group_size || static_cast<int>(offsets.size()) != group_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s_bytes and %s_offsets must have one entry per peer (%d), got %d and %d", what, what,
        group_size, sizes.size(), offsets.size()));
  }
  for (int p = 0; p < group_size; ++p) {
    if (sizes[p] < 0 || offsets[p] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s_bytes[%d] = %d and %s_offsets[%d] = %d must not be negative", what, p, sizes[p],
          what, p, offsets[p]));
    }
    if (sizes[p] > 0 && buffer == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s is null but %s_bytes[%d] = %d", what, what, p, sizes[p]));
    }
  }
  return absl::OkStatus();
}

// True when slice p starts where slice p-1 ends, for every p.
bool IsPacked(absl::Span<const int64_t> sizes, absl::Span<const int64_t> offsets) {
  for (size_t p = 1; p < sizes.size(); ++p) {
    if (offsets[p] != offsets[p - 1] + sizes[p - 1]) return false;
  }
  return true;
}

int64_t Total(absl::Span<const int64_t> sizes) {
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  return total;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Connect(
    std::string group_name, int rank, int size, gloo::rendezvous::Store& store,
    std::shared_ptr<gloo::transport::Device> device, absl::Duration connect_timeout,
    absl::Duration collective_timeout) {
  try {
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(absl::ToChronoMilliseconds(connect_timeout));
    context->connectFullMesh(store, device);
    // Every collective passes its own timeout (the options' setTimeout below): the context's
    // bounded only the connection.
    return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(
        std::move(group_name), std::move(context), absl::ToChronoMilliseconds(collective_timeout)));
  } catch (const std::exception& e) {
    return StatusFromGlooException(
        e, absl::StrFormat("connecting gloo group %s as rank %d of %d", group_name, rank, size));
  }
}

GlooCommunicator::GlooCommunicator(std::string group_name, std::shared_ptr<gloo::Context> context,
                                   std::chrono::milliseconds timeout)
    : group_name_(std::move(group_name)),
      context_(std::move(context)),
      rank_(context_->rank),
      size_(context_->size),
      timeout_(timeout) {}

template <typename Body>
absl::Status GlooCommunicator::Run(absl::string_view what, Body&& body) {
  if (!failure_.ok()) {
    return absl::Status(failure_.code(),
                        absl::StrCat(what, ": gloo group ", group_name_,
                                     " failed earlier: ", failure_.message()));
  }
  try {
    body(next_tag_++);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    failure_ = StatusFromGlooException(
        e, absl::StrFormat("%s in gloo group %s (rank %d of %d)", what, group_name_, rank_, size_));
    return failure_;
  }
}

absl::Status GlooCommunicator::AllToAllV(const void* send, absl::Span<const int64_t> send_bytes,
                                         absl::Span<const int64_t> send_offsets, void* recv,
                                         absl::Span<const int64_t> recv_bytes,
                                         absl::Span<const int64_t> recv_offsets) {
  if (absl::Status s = CheckPerPeer(send_bytes, send_offsets, send, size_, "send"); !s.ok()) return s;
  if (absl::Status s = CheckPerPeer(recv_bytes, recv_offsets, recv, size_, "recv"); !s.ok()) return s;
  if (send_bytes[rank_] != recv_bytes[rank_]) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AllToAllV: rank %d sends itself %d bytes but expects %d", rank_, send_bytes[rank_],
        recv_bytes[rank_]));
  }
  if (absl::Status s = CheckPairwiseSizes(send_bytes, recv_bytes); !s.ok()) return s;
  const int64_t send_total = Total(send_bytes);
  const int64_t recv_total = Total(recv_bytes);

  // Gloo reads only from `in`; the const_cast is for its one pointer type for both directions.
  uint8_t* in = &empty_buffer_byte;
  std::vector<uint8_t> send_staging;
  if (send_total > 0 && IsPacked(send_bytes, send_offsets)) {
    in = const_cast<uint8_t*>(static_cast<const uint8_t*>(send)) + send_offsets[0];
  } else if (send_total > 0) {
    send_staging.resize(send_total);
    int64_t at = 0;
    for (int p = 0; p < size_; ++p) {
      if (send_bytes[p] == 0) continue;
      std::memcpy(send_staging.data() + at, static_cast<const uint8_t*>(send) + send_offsets[p],
                  send_bytes[p]);
      at += send_bytes[p];
    }
    in = send_staging.data();
  }
  uint8_t* out = &empty_buffer_byte;
  std::vector<uint8_t> recv_staging;
  const bool recv_packed = IsPacked(recv_bytes, recv_offsets);
  if (recv_total > 0 && recv_packed) {
    out = static_cast<uint8_t*>(recv) + recv_offsets[0];
  } else if (recv_total > 0) {
    recv_staging.resize(recv_total);
    out = recv_staging.data();
  }

  std::vector<int64_t> send_counts(send_bytes.begin(), send_bytes.end());
  std::vector<int64_t> recv_counts(recv_bytes.begin(), recv_bytes.end());
  absl::Status status = Run("AllToAllV", [&](uint32_t tag) {
    gloo::AlltoallvOptions opts(context_);
    opts.setInput(in, send_counts);
    opts.setOutput(out, recv_counts);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::alltoallv(opts);
  });
  if (!status.ok() || recv_staging.empty()) return status;
  int64_t at = 0;
  for (int p = 0; p < size_; ++p) {
    if (recv_bytes[p] == 0) continue;
    std::memcpy(static_cast<uint8_t*>(recv) + recv_offsets[p], recv_staging.data() + at,
                recv_bytes[p]);
    at += recv_bytes[p];
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::CheckPairwiseSizes(absl::Span<const int64_t> send_bytes,
                                                  absl::Span<const int64_t> recv_bytes) {
  // Peer p gets {what I send to p, what I expect from p} and checks both against its own view.
  std::vector<int64_t> mine(2 * size_), theirs(2 * size_, -1);
  for (int p = 0; p < size_; ++p) {
    mine[2 * p] = send_bytes[p];
    mine[2 * p + 1] = recv_bytes[p];
  }
  absl::Status status = Run("AllToAllV size exchange", [&](uint32_t tag) {
    gloo::AlltoallOptions opts(context_);
    opts.setInput(mine.data(), mine.size());
    opts.setOutput(theirs.data(), theirs.size());
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::alltoall(opts);
  });
  if (!status.ok()) return status;
  for (int p = 0; p < size_; ++p) {
    const int64_t p_sends = theirs[2 * p], p_expects = theirs[2 * p + 1];
    if (p_sends != recv_bytes[p] || p_expects != send_bytes[p]) {
      // Peers not involved may already be inside the exchange, so the group cannot go on.
      failure_ = absl::InvalidArgumentError(absl::StrFormat(
          "AllToAllV size mismatch in gloo group %s: rank %d sends %d bytes to rank %d, which "
          "expects %d; rank %d sends %d bytes to rank %d, which expects %d",
          group_name_, p, p_sends, rank_, recv_bytes[p], rank_, send_bytes[p], p, p_expects));
      return failure_;
    }
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllToAll(const void* send, void* recv, size_t bytes_per_peer) {
  if (bytes_per_peer == 0) return absl::OkStatus();
  if (send == nullptr || recv == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AllToAll: send and recv must not be null with bytes_per_peer = %d", bytes_per_peer));
  }
  const size_t total = bytes_per_peer * size_;
  return Run("AllToAll", [&](uint32_t tag) {
    gloo::AlltoallOptions opts(context_);
    opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(send)), total);
    opts.setOutput(static_cast<uint8_t*>(recv), total);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::alltoall(opts);
  });
}

template <typename T>
absl::Status GlooCommunicator::AllReduce(T* data, size_t count) {
  if (count == 0) return absl::OkStatus();
  if (data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("AllReduceSum: data must not be null with count = %d", count));
  }
  return Run("AllReduceSum", [&](uint32_t tag) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, count);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
  });
}

absl::Status GlooCommunicator::AllReduceSum(float* data, size_t count) {
  return AllReduce(data, count);
}

absl::Status GlooCommunicator::AllReduceSum(double* data, size_t count) {
  return AllReduce(data, count);
}

absl::Status GlooCommunicator::Barrier() {
  return Run("Barrier", [&](uint32_t tag) {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  });
}

}  // namespace dropless
