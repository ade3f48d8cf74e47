// ExpertExchange: how a MoE layer reaches the experts of other ranks. Rows leave a rank in expert
// order (experts e / (E / ep) == p go to EP peer p) and arrive grouped by local expert, each group
// ordered by source rank; Combine is the exact reverse. Two implementations: one rank holding every
// expert (fp64 unit tests), and the job's Communicators (the engine).
#ifndef DROPLESS_WORKER_ENGINE_CPU_EXPERT_EXCHANGE_H_
#define DROPLESS_WORKER_ENGINE_CPU_EXPERT_EXCHANGE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/transport/communicator.h"

namespace dropless::cpu {

// Row counts of one layer's all-to-all between the ranks of the EP group, agreed by all of them;
// reused by its backward. (Where each token's rows go within a rank is the kernels' DispatchPlan,
// dropless/kernels/dispatch_plan.h.)
struct ExchangePlan {
  int peers = 1;
  int64_t local_experts = 0;
  std::vector<int64_t> send_rows;              // [peer]: rows this rank sends to each EP peer
  std::vector<int64_t> recv_rows;              // [source * local_experts + expert]
  std::vector<int64_t> rows_per_local_expert;  // [expert]: summed over sources
  int64_t total_send_rows = 0;
  int64_t total_recv_rows = 0;

  // Bytes this rank sends in one Dispatch (its rows to the experts) and in one Combine (the
  // expert rows it holds back to their ranks), rows staying on this rank included.
  int64_t DispatchSendBytes(size_t row_bytes) const {
    return total_send_rows * static_cast<int64_t>(row_bytes);
  }
  int64_t CombineSendBytes(size_t row_bytes) const {
    return total_recv_rows * static_cast<int64_t>(row_bytes);
  }
};

class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;

  virtual int ep_rank() const = 0;
  virtual int ep_size() const = 0;

  // In-place sum over every rank of the job (router statistics of the auxiliary loss).
  virtual absl::Status SumOverJob(absl::Span<double> values) = 0;

  // Exchanges the per-expert row counts: rows_per_expert has one entry per global expert.
  virtual absl::StatusOr<ExchangePlan> Plan(absl::Span<const int64_t> rows_per_expert) = 0;

  // send_rows: plan.total_send_rows rows of row_bytes in expert order; expert_rows:
  // plan.total_recv_rows rows grouped by local expert.
  virtual absl::Status Dispatch(const ExchangePlan& plan, const void* send_rows, size_t row_bytes,
                                void* expert_rows) = 0;
  // Reverse of Dispatch: each row goes back to the rank and position it came from.
  virtual absl::Status Combine(const ExchangePlan& plan, const void* expert_rows, size_t row_bytes,
                               void* send_rows) = 0;
};

// Every expert on this one rank; the job is this rank's tokens.
std::unique_ptr<ExpertExchange> NewSingleRankExpertExchange();

// Dispatch/combine over `ep` (AllToAll of counts, AllToAllV of rows); SumOverJob over `world`.
// Both communicators must outlive the exchange.
std::unique_ptr<ExpertExchange> NewCommunicatorExpertExchange(Communicator* ep,
                                                              Communicator* world);

}  // namespace dropless::cpu

#endif  // DROPLESS_WORKER_ENGINE_CPU_EXPERT_EXCHANGE_H_
