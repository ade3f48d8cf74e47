// The `local` ExpertDispatcher (expert_dispatcher.h): all EP ranks in this process on one GPU.
// Each collective joins the ranks' streams into rank 0's, runs one kernel over the whole group
// (exchange_kernels.h) and forks the result back to every rank's stream.
#include <memory>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "worker/engine/cuda/ep/exchange_kernels.h"
#include "worker/engine/cuda/ep/expert_dispatcher.h"

namespace dropless::cuda_engine {
namespace {

class LocalDispatcher final : public ExpertDispatcher {
 public:
  LocalDispatcher(const EpShape& shape, StreamLinks* links, DeviceArena* arena, int sms)
      : shape_(shape), links_(links), arena_(arena), sms_(sms) {}

  std::string_view name() const override { return "local"; }
  const EpShape& shape() const override { return shape_; }
  int local_ranks() const override { return shape_.ep; }
  int first_local_rank() const override { return 0; }

  absl::Status AllocateShared(size_t bytes, const char* what, void** out) override {
    uint8_t* p = nullptr;
    DROPLESS_RETURN_IF_ERROR(arena_->Allocate(static_cast<int64_t>(bytes), what, &p));
    *out = p;
    return absl::OkStatus();
  }

  absl::Status Plan(absl::Span<const RankCall> calls) override {
    DROPLESS_RETURN_IF_ERROR(ValidateRankCalls(*this, calls, /*rows=*/false, 0));
    GroupPlans plans{};
    for (int r = 0; r < shape_.ep; ++r) {
      const ExchangePlan& p = *calls[r].plan;
      plans.send_offsets[r] = p.send_offsets;
      plans.count_matrix[r] = p.count_matrix;
      plans.job_counts[r] = p.job_counts;
      plans.dest_rows[r] = p.dest_rows;
      plans.recv_offsets[r] = p.recv_offsets;
    }
    return Collective(Streams(calls), [&](cudaStream_t s) {
      return PlanGroupExchange(plans, shape_, s);
    });
  }

  absl::Status AllReduceSum(absl::Span<float* const> data, size_t count,
                            absl::Span<const cudaStream_t> streams) override {
    return Sum(data, count, streams);
  }
  absl::Status AllReduceSum(absl::Span<double* const> data, size_t count,
                            absl::Span<const cudaStream_t> streams) override {
    return Sum(data, count, streams);
  }

 private:
  static std::vector<cudaStream_t> Streams(absl::Span<const RankCall> calls) {
    std::vector<cudaStream_t> s;
    for (const RankCall& c : calls) s.push_back(c.stream);
    return s;
  }

  // Runs `work` on streams[0] after every rank's queued work; every stream waits for it.
  template <typename Work>
  absl::Status Collective(absl::Span<const cudaStream_t> streams, Work work) {
    for (size_t r = 1; r < streams.size(); ++r) {
      DROPLESS_RETURN_IF_ERROR(links_->Link(streams[r], streams[0]));
    }
    DROPLESS_RETURN_IF_ERROR(work(streams[0]));
    for (size_t r = 1; r < streams.size(); ++r) {
      DROPLESS_RETURN_IF_ERROR(links_->Link(streams[0], streams[r]));
    }
    return absl::OkStatus();
  }

  absl::Status Exchange(absl::Span<const RankCall> calls, size_t row_bytes, bool to_owner,
                        LocalExperts experts) override {
    DROPLESS_RETURN_IF_ERROR(ValidateRankCalls(*this, calls, /*rows=*/true, row_bytes));
    GroupRows rows{};
    for (int r = 0; r < shape_.ep; ++r) {
      rows.send_offsets[r] = calls[r].plan->send_offsets;
      rows.dest_rows[r] = calls[r].plan->dest_rows;
      rows.send[r] = static_cast<uint8_t*>(calls[r].send_rows);
      rows.recv[r] = static_cast<uint8_t*>(calls[r].recv_rows);
    }
    return Collective(Streams(calls), [&](cudaStream_t s) {
      return ExchangeGroupRows(rows, shape_, row_bytes, to_owner, experts, sms_, s);
    });
  }

  template <typename T>
  absl::Status Sum(absl::Span<T* const> data, size_t count, absl::Span<const cudaStream_t> streams) {
    if (static_cast<int>(data.size()) != shape_.ep || streams.size() != data.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "local dispatcher: all-reduce over %d buffers and %d streams for an EP group of %d",
          data.size(), streams.size(), shape_.ep));
    }
    return Collective(streams, [&](cudaStream_t s) {
      return SumAcrossRanks(data.data(), shape_.ep, count, s);
    });
  }

  const EpShape shape_;
  StreamLinks* const links_;
  DeviceArena* const arena_;
  const int sms_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ExpertDispatcher>> NewLocalDispatcher(const EpShape& shape,
                                                                     StreamLinks* links,
                                                                     DeviceArena* arena) {
  DROPLESS_RETURN_IF_ERROR(ValidateEpShape(shape));
  if (links == nullptr || arena == nullptr) {
    return absl::InvalidArgumentError("local dispatcher: no stream links or arena");
  }
  int device = 0, sms = 0;
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return std::unique_ptr<ExpertDispatcher>(new LocalDispatcher(shape, links, arena, sms));
}

}  // namespace dropless::cuda_engine
