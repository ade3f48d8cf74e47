// ForwardLayerGroup / BackwardLayerGroup (moe_layer_group.h).
#include "worker/engine/cuda/moe_layer_group.h"

#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace dropless::cuda_engine {
namespace {

using Rows = MoeLayerGpu::Rows;

// Where a rank's exchanges run: the comm stream with overlap, else main.
cudaStream_t ExchangeStream(const LayerStreams& s) {
  return s.comm != nullptr ? s.comm : s.main;
}

std::vector<LocalExperts> ChunksOf(absl::Span<const RankLayer> ranks) {
  return ExpertRuns(ranks[0].layer->dims(), ranks[0].streams);
}

absl::Status CheckGroup(ExpertDispatcher* dispatcher, absl::Span<const RankLayer> ranks) {
  const int expected = dispatcher == nullptr ? 1 : dispatcher->local_ranks();
  if (static_cast<int>(ranks.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layer group: %d ranks for a dispatcher that drives %d", ranks.size(), expected));
  }
  return absl::OkStatus();
}

std::vector<RankCall> Calls(absl::Span<const RankLayer> ranks, Rows rows) {
  std::vector<RankCall> calls;
  for (const RankLayer& r : ranks) {
    calls.push_back(r.layer->ExchangeCall(rows, ExchangeStream(r.streams)));
  }
  return calls;
}

// A collective call, timed as `phase` on rank 0's exchange stream, or main (the group's timer).
template <typename Call>
absl::Status Timed(absl::Span<const RankLayer> ranks, PhaseTimer::Phase phase, Call call,
                   bool on_main = false) {
  PhaseTimer* timer = ranks[0].streams.timer;
  cudaStream_t stream = on_main ? ranks[0].streams.main : ExchangeStream(ranks[0].streams);
  if (timer != nullptr) DROPLESS_RETURN_IF_ERROR(timer->Begin(phase, stream));
  DROPLESS_RETURN_IF_ERROR(call());
  return timer == nullptr ? absl::OkStatus() : timer->End(phase, stream);
}

// Every rank's work queued on `from` so far comes before what is queued on `to` next (nothing
// when the exchanges run on main).
absl::Status LinkAll(absl::Span<const RankLayer> ranks, bool to_exchange) {
  for (const RankLayer& r : ranks) {
    const cudaStream_t x = ExchangeStream(r.streams);
    if (x == r.streams.main) continue;
    DROPLESS_RETURN_IF_ERROR(to_exchange ? r.streams.links->Link(r.streams.main, x)
                                         : r.streams.links->Link(x, r.streams.main));
  }
  return absl::OkStatus();
}

// Each rank's stage of one run of the local experts.
template <typename Stage>
absl::Status EachRank(absl::Span<const RankLayer> ranks, Stage stage) {
  for (const RankLayer& r : ranks) DROPLESS_RETURN_IF_ERROR(stage(r));
  return absl::OkStatus();
}

}  // namespace

// The exchanges of one run go on the exchange stream (main without overlap) while main computes
// the GEMMs of the run before (dispatch) or after it (combine):
//   forward   dispatch run c+1 | w1 of run c; SwiGLU; w2 of run c+1 | combine run c
//   backward  output gradients to the experts, run c+1 | w2's data gradient of run c; the weight
//             gradients and SwiGLU's backward; w1's data gradient of run c+1 | input gradients
//             home, run c
absl::Status ForwardLayerGroup(ExpertDispatcher* dispatcher, absl::Span<const RankLayer> ranks) {
  DROPLESS_RETURN_IF_ERROR(CheckGroup(dispatcher, ranks));
  if (dispatcher == nullptr) {
    const RankLayer& r = ranks[0];
    return r.layer->Forward(r.weights, r.x, r.x_next, r.aux_loss, r.streams);
  }
  for (const RankLayer& r : ranks) DROPLESS_RETURN_IF_ERROR(r.layer->ForwardRoute(r.weights, r.x, r.streams));
  // The plan on main: the routing that precedes it is there.
  DROPLESS_RETURN_IF_ERROR(Timed(ranks, PhaseTimer::kDispatch, [&] {
    std::vector<RankCall> plan;
    for (const RankLayer& r : ranks) plan.push_back(r.layer->ExchangeCall(Rows::kTokens, r.streams.main));
    return dispatcher->Plan(plan);
  }, /*on_main=*/true));
  if (ranks[0].aux_loss != nullptr) {
    std::vector<float*> sums;
    std::vector<cudaStream_t> streams;
    for (const RankLayer& r : ranks) {
      sums.push_back(r.layer->prob_sums());
      streams.push_back(r.streams.main);
    }
    DROPLESS_RETURN_IF_ERROR(dispatcher->AllReduceSum(absl::MakeSpan(sums),
                                                      static_cast<size_t>(dispatcher->shape().experts),
                                                      streams));
  }
  MoeLayerGpu* layer = ranks[0].layer;
  const std::vector<LocalExperts> runs = ChunksOf(ranks);
  DROPLESS_RETURN_IF_ERROR(LinkAll(ranks, /*to_exchange=*/true));
  for (const LocalExperts& run : runs) {
    DROPLESS_RETURN_IF_ERROR(Timed(ranks, PhaseTimer::kDispatch, [&]() -> absl::Status {
      DROPLESS_RETURN_IF_ERROR(dispatcher->Dispatch(Calls(ranks, Rows::kTokens),
                                                    layer->RowBytes(Rows::kTokens), run));
      if (!layer->quantized_tokens()) return absl::OkStatus();
      return dispatcher->Dispatch(Calls(ranks, Rows::kTokenScales),
                                  layer->RowBytes(Rows::kTokenScales), run);
    }));
    DROPLESS_RETURN_IF_ERROR(LinkAll(ranks, /*to_exchange=*/false));
    DROPLESS_RETURN_IF_ERROR(EachRank(ranks, [&](const RankLayer& r) {
      return r.layer->ForwardW1(r.weights, run, r.streams);
    }));
  }
  DROPLESS_RETURN_IF_ERROR(EachRank(ranks, [&](const RankLayer& r) {
    return r.layer->ForwardSwiglu(r.streams);
  }));
  const size_t bytes = layer->RowBytes(Rows::kExpertOutputs);
  for (const LocalExperts& run : runs) {
    DROPLESS_RETURN_IF_ERROR(EachRank(ranks, [&](const RankLayer& r) {
      return r.layer->ForwardW2(r.weights, run, r.streams);
    }));
    DROPLESS_RETURN_IF_ERROR(LinkAll(ranks, /*to_exchange=*/true));
    DROPLESS_RETURN_IF_ERROR(Timed(ranks, PhaseTimer::kCombine, [&] {
      return dispatcher->Combine(Calls(ranks, Rows::kExpertOutputs), bytes, run);
    }));
  }
  DROPLESS_RETURN_IF_ERROR(LinkAll(ranks, /*to_exchange=*/false));
  for (const RankLayer& r : ranks) {
    DROPLESS_RETURN_IF_ERROR(r.layer->ForwardCombine(r.x, r.x_next, r.aux_loss, r.streams));
  }
  return absl::OkStatus();
}

absl::Status BackwardLayerGroup(ExpertDispatcher* dispatcher, absl::Span<const RankLayer> ranks,
                                float aux_coef) {
  DROPLESS_RETURN_IF_ERROR(CheckGroup(dispatcher, ranks));
  if (dispatcher == nullptr) {
    const RankLayer& r = ranks[0];
    return r.layer->Backward(r.weights, r.x, r.d_x_next, aux_coef, r.grads, r.d_x, r.streams,
                             r.hooks);
  }
  for (const RankLayer& r : ranks) {
    DROPLESS_RETURN_IF_ERROR(r.layer->BackwardCombine(r.weights, r.x, r.d_x_next, aux_coef,
                                                      r.grads, r.streams, r.hooks));
  }
  const size_t bytes = ranks[0].layer->RowBytes(Rows::kOutputGradients);
  const std::vector<LocalExperts> runs = ChunksOf(ranks);
  // The combine's backward moves the output gradients to the experts (a dispatch) ...
  DROPLESS_RETURN_IF_ERROR(LinkAll(ranks, /*to_exchange=*/true));
  for (const LocalExperts& run : runs) {
    DROPLESS_RETURN_IF_ERROR(Timed(ranks, PhaseTimer::kCombine, [&] {
      return dispatcher->Dispatch(Calls(ranks, Rows::kOutputGradients), bytes, run);
    }));
    DROPLESS_RETURN_IF_ERROR(LinkAll(ranks, /*to_exchange=*/false));
    DROPLESS_RETURN_IF_ERROR(EachRank(ranks, [&](const RankLayer& r) {
      return r.layer->BackwardW2Data(r.weights, r.grads, run, r.streams);
    }));
  }
  DROPLESS_RETURN_IF_ERROR(EachRank(ranks, [&](const RankLayer& r) {
    return r.layer->BackwardExpertsMiddle(r.weights, r.grads, r.streams, r.hooks);
  }));
  // ... and the dispatch's backward brings the input gradients home (a combine).
  for (const LocalExperts& run : runs) {
    DROPLESS_RETURN_IF_ERROR(EachRank(ranks, [&](const RankLayer& r) -> absl::Status {
      DROPLESS_RETURN_IF_ERROR(r.layer->BackwardW1Data(r.weights, r.grads, run, r.streams));
      // After the last run's data gradient, w1's update may start (before the last combine).
      if (&run != &runs.back()) return absl::OkStatus();
      return r.layer->BackwardExpertsEnd(r.weights, r.grads, r.streams, r.hooks);
    }));
    DROPLESS_RETURN_IF_ERROR(LinkAll(ranks, /*to_exchange=*/true));
    DROPLESS_RETURN_IF_ERROR(Timed(ranks, PhaseTimer::kDispatch, [&] {
      return dispatcher->Combine(Calls(ranks, Rows::kInputGradients), bytes, run);
    }));
  }
  DROPLESS_RETURN_IF_ERROR(LinkAll(ranks, /*to_exchange=*/false));
  for (const RankLayer& r : ranks) {
    DROPLESS_RETURN_IF_ERROR(r.layer->BackwardRoute(r.d_x_next, r.d_x, r.streams));
  }
  return absl::OkStatus();
}

}  // namespace dropless::cuda_engine
