#include "worker/engine/cpu/expert_exchange.h"

#include <cstring>
#include <numeric>

#include "absl/strings/str_format.h"

namespace dropless::cpu {
namespace {

ExchangePlan SingleSourcePlan(absl::Span<const int64_t> rows_per_expert) {
  ExchangePlan plan;
  plan.peers = 1;
  plan.local_experts = static_cast<int64_t>(rows_per_expert.size());
  plan.recv_rows.assign(rows_per_expert.begin(), rows_per_expert.end());
  plan.rows_per_local_expert = plan.recv_rows;
  plan.total_send_rows = std::accumulate(rows_per_expert.begin(), rows_per_expert.end(), int64_t{0});
  plan.total_recv_rows = plan.total_send_rows;
  plan.send_rows = {plan.total_send_rows};
  return plan;
}

class SingleRankExpertExchange final : public ExpertExchange {
 public:
  int ep_rank() const override { return 0; }
  int ep_size() const override { return 1; }
  absl::Status SumOverJob(absl::Span<double>) override { return absl::OkStatus(); }
  absl::StatusOr<ExchangePlan> Plan(absl::Span<const int64_t> rows_per_expert) override {
    return SingleSourcePlan(rows_per_expert);
  }
  absl::Status Dispatch(const ExchangePlan& plan, const void* send_rows, size_t row_bytes,
                        void* expert_rows) override {
    if (plan.total_send_rows > 0) {
      std::memcpy(expert_rows, send_rows, static_cast<size_t>(plan.total_send_rows) * row_bytes);
    }
    return absl::OkStatus();
  }
  absl::Status Combine(const ExchangePlan& plan, const void* expert_rows, size_t row_bytes,
                       void* send_rows) override {
    return Dispatch(plan, expert_rows, row_bytes, send_rows);
  }
};

class CommunicatorExpertExchange final : public ExpertExchange {
 public:
  CommunicatorExpertExchange(Communicator* ep, Communicator* world) : ep_(ep), world_(world) {}

  int ep_rank() const override { return ep_->rank(); }
  int ep_size() const override { return ep_->size(); }

  absl::Status SumOverJob(absl::Span<double> values) override {
    if (world_->size() == 1 || values.empty()) return absl::OkStatus();
    return world_->AllReduceSum(values.data(), values.size());
  }

  absl::StatusOr<ExchangePlan> Plan(absl::Span<const int64_t> rows_per_expert) override {
    const int peers = ep_->size();
    if (rows_per_expert.size() % static_cast<size_t>(peers) != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "expert exchange: %d experts do not split over %d EP ranks", rows_per_expert.size(),
          peers));
    }
    if (peers == 1) return SingleSourcePlan(rows_per_expert);
    ExchangePlan plan;
    plan.peers = peers;
    plan.local_experts = static_cast<int64_t>(rows_per_expert.size()) / peers;
    // Counts for peer p's experts are the contiguous slice p of rows_per_expert.
    plan.recv_rows.resize(rows_per_expert.size());
    absl::Status status = ep_->AllToAll(rows_per_expert.data(), plan.recv_rows.data(),
                                        static_cast<size_t>(plan.local_experts) * sizeof(int64_t));
    if (!status.ok()) return status;
    plan.send_rows.assign(peers, 0);
    plan.rows_per_local_expert.assign(plan.local_experts, 0);
    for (int p = 0; p < peers; ++p) {
      for (int64_t e = 0; e < plan.local_experts; ++e) {
        const int64_t sent = rows_per_expert[p * plan.local_experts + e];
        const int64_t received = plan.recv_rows[p * plan.local_experts + e];
        if (received < 0) {
          return absl::InternalError("expert exchange: negative row count from EP peer");
        }
        plan.send_rows[p] += sent;
        plan.rows_per_local_expert[e] += received;
        plan.total_send_rows += sent;
        plan.total_recv_rows += received;
      }
    }
    return plan;
  }

  absl::Status Dispatch(const ExchangePlan& plan, const void* send_rows, size_t row_bytes,
                        void* expert_rows) override {
    if (plan.peers == 1) return CopyRows(plan.total_send_rows, send_rows, row_bytes, expert_rows);
    const bool regroup = plan.local_experts > 1;
    char* by_source = regroup ? Staging(plan.total_recv_rows * row_bytes)
                              : static_cast<char*>(expert_rows);
    absl::Status status = ExchangeRows(plan, /*forward=*/true, send_rows, row_bytes, by_source);
    if (!status.ok() || !regroup) return status;
    ForEachBlock(plan, [&](int64_t source_row, int64_t expert_row, int64_t rows) {
      std::memcpy(static_cast<char*>(expert_rows) + expert_row * row_bytes,
                  by_source + source_row * row_bytes, static_cast<size_t>(rows) * row_bytes);
    });
    return absl::OkStatus();
  }

  absl::Status Combine(const ExchangePlan& plan, const void* expert_rows, size_t row_bytes,
                       void* send_rows) override {
    if (plan.peers == 1) return CopyRows(plan.total_send_rows, expert_rows, row_bytes, send_rows);
    const void* by_source = expert_rows;
    if (plan.local_experts > 1) {
      char* staging = Staging(plan.total_recv_rows * row_bytes);
      ForEachBlock(plan, [&](int64_t source_row, int64_t expert_row, int64_t rows) {
        std::memcpy(staging + source_row * row_bytes,
                    static_cast<const char*>(expert_rows) + expert_row * row_bytes,
                    static_cast<size_t>(rows) * row_bytes);
      });
      by_source = staging;
    }
    return ExchangeRows(plan, /*forward=*/false, by_source, row_bytes, send_rows);
  }

 private:
  static absl::Status CopyRows(int64_t rows, const void* from, size_t row_bytes, void* to) {
    if (rows > 0) std::memcpy(to, from, static_cast<size_t>(rows) * row_bytes);
    return absl::OkStatus();
  }

  char* Staging(size_t bytes) {
    if (staging_.size() < bytes) staging_.resize(bytes);
    return staging_.data();
  }

  // Calls fn(row in source-major order, row in expert-major order, rows) for each
  // (source, local expert) block of the plan.
  template <typename Fn>
  static void ForEachBlock(const ExchangePlan& plan, Fn fn) {
    std::vector<int64_t> expert_start(plan.local_experts, 0);
    for (int64_t e = 1; e < plan.local_experts; ++e) {
      expert_start[e] = expert_start[e - 1] + plan.rows_per_local_expert[e - 1];
    }
    int64_t source_row = 0;
    for (int p = 0; p < plan.peers; ++p) {
      for (int64_t e = 0; e < plan.local_experts; ++e) {
        const int64_t rows = plan.recv_rows[p * plan.local_experts + e];
        if (rows > 0) fn(source_row, expert_start[e], rows);
        source_row += rows;
        expert_start[e] += rows;
      }
    }
  }

  // forward: token-order rows (send_rows per peer) -> source-major rows; backward: the reverse.
  absl::Status ExchangeRows(const ExchangePlan& plan, bool forward, const void* from,
                            size_t row_bytes, void* to) {
    const int peers = plan.peers;
    std::vector<int64_t> token_bytes(peers), token_offsets(peers);
    std::vector<int64_t> expert_bytes(peers, 0), expert_offsets(peers);
    int64_t token_offset = 0, expert_offset = 0;
    for (int p = 0; p < peers; ++p) {
      token_bytes[p] = plan.send_rows[p] * static_cast<int64_t>(row_bytes);
      token_offsets[p] = token_offset;
      token_offset += token_bytes[p];
      for (int64_t e = 0; e < plan.local_experts; ++e) {
        expert_bytes[p] += plan.recv_rows[p * plan.local_experts + e] * static_cast<int64_t>(row_bytes);
      }
      expert_offsets[p] = expert_offset;
      expert_offset += expert_bytes[p];
    }
    if (forward) {
      return ep_->AllToAllV(from, token_bytes, token_offsets, to, expert_bytes, expert_offsets);
    }
    return ep_->AllToAllV(from, expert_bytes, expert_offsets, to, token_bytes, token_offsets);
  }

  Communicator* ep_;
  Communicator* world_;
  std::vector<char> staging_;
};

}  // namespace

std::unique_ptr<ExpertExchange> NewSingleRankExpertExchange() {
  return std::make_unique<SingleRankExpertExchange>();
}

std::unique_ptr<ExpertExchange> NewCommunicatorExpertExchange(Communicator* ep,
                                                              Communicator* world) {
  return std::make_unique<CommunicatorExpertExchange>(ep, world);
}

}  // namespace dropless::cpu
