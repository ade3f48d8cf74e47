// ForwardLayerGroup / BackwardLayerGroup (moe_layer_group.h).
#include "worker/engine/cuda/moe_layer_group.h"

#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace dropless::cuda_engine {
namespace {

using Rows = MoeLayerGpu::Rows;

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
  for (const RankLayer& r : ranks) calls.push_back(r.layer->ExchangeCall(rows, r.streams.main));
  return calls;
}

// A collective call, timed as `phase` on rank 0's main stream (the group's timer).
template <typename Call>
absl::Status Timed(absl::Span<const RankLayer> ranks, PhaseTimer::Phase phase, Call call) {
  PhaseTimer* timer = ranks[0].streams.timer;
  cudaStream_t stream = ranks[0].streams.main;
  if (timer != nullptr) DROPLESS_RETURN_IF_ERROR(timer->Begin(phase, stream));
  DROPLESS_RETURN_IF_ERROR(call());
  return timer == nullptr ? absl::OkStatus() : timer->End(phase, stream);
}

}  // namespace

absl::Status ForwardLayerGroup(ExpertDispatcher* dispatcher, absl::Span<const RankLayer> ranks) {
  DROPLESS_RETURN_IF_ERROR(CheckGroup(dispatcher, ranks));
  if (dispatcher == nullptr) {
    const RankLayer& r = ranks[0];
    return r.layer->Forward(r.weights, r.x, r.x_next, r.aux_loss, r.streams);
  }
  for (const RankLayer& r : ranks) DROPLESS_RETURN_IF_ERROR(r.layer->ForwardRoute(r.weights, r.x, r.streams));
  DROPLESS_RETURN_IF_ERROR(Timed(ranks, PhaseTimer::kDispatch, [&] {
    return dispatcher->Plan(Calls(ranks, Rows::kTokens));
  }));
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
  const size_t bytes = layer->RowBytes(Rows::kExpertOutputs);
  DROPLESS_RETURN_IF_ERROR(Timed(ranks, PhaseTimer::kDispatch, [&]() -> absl::Status {
    DROPLESS_RETURN_IF_ERROR(
        dispatcher->Dispatch(Calls(ranks, Rows::kTokens), layer->RowBytes(Rows::kTokens)));
    if (!layer->quantized_tokens()) return absl::OkStatus();
    return dispatcher->Dispatch(Calls(ranks, Rows::kTokenScales), layer->RowBytes(Rows::kTokenScales));
  }));
  for (const RankLayer& r : ranks) DROPLESS_RETURN_IF_ERROR(r.layer->ForwardExperts(r.weights, r.streams));
  DROPLESS_RETURN_IF_ERROR(Timed(ranks, PhaseTimer::kCombine, [&] {
    return dispatcher->Combine(Calls(ranks, Rows::kExpertOutputs), bytes);
  }));
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
  // The combine's backward moves the output gradients to the experts (a dispatch) ...
  DROPLESS_RETURN_IF_ERROR(Timed(ranks, PhaseTimer::kCombine, [&] {
    return dispatcher->Dispatch(Calls(ranks, Rows::kOutputGradients), bytes);
  }));
  for (const RankLayer& r : ranks) {
    DROPLESS_RETURN_IF_ERROR(r.layer->BackwardExperts(r.weights, r.grads, r.streams, r.hooks));
  }
  // ... and the dispatch's backward brings the input gradients home (a combine).
  DROPLESS_RETURN_IF_ERROR(Timed(ranks, PhaseTimer::kDispatch, [&] {
    return dispatcher->Combine(Calls(ranks, Rows::kInputGradients), bytes);
  }));
  for (const RankLayer& r : ranks) {
    DROPLESS_RETURN_IF_ERROR(r.layer->BackwardRoute(r.d_x_next, r.d_x, r.streams));
  }
  return absl::OkStatus();
}

}  // namespace dropless::cuda_engine
