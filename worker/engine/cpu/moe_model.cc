#include "worker/engine/cpu/moe_model.h"

#include <cmath>

#include "worker/engine/cpu/synthetic_task.h"

namespace dropless::cpu {
namespace {

enum TensorTag : uint64_t { kRouter = 1, kExpertW1 = 2, kExpertW2 = 3, kSharedW1 = 4, kSharedW2 = 5 };

}  // namespace

MoeParameterLayout::MoeParameterLayout(const ModelSpec& model, int64_t ep, int64_t ep_rank,
                                       int64_t tokens) {
  shape_.tokens = tokens;
  shape_.hidden = model.hidden;
  shape_.ffn = model.ffn;
  shape_.experts = model.experts;
  shape_.topk = model.topk;
  shape_.shared_experts = model.shared_experts;
  shape_.router = model.router;
  shape_.renormalize = model.renormalize;
  layers_ = model.layers;
  local_experts_ = ep > 0 ? model.experts / ep : 0;
  first_expert_ = ep_rank * local_experts_;
  w1_size_ = model.hidden * 2 * model.ffn;
  w2_size_ = model.ffn * model.hidden;
  replicated_per_layer_ =
      model.hidden * model.experts + model.shared_experts * (w1_size_ + w2_size_);
  experts_per_layer_ = local_experts_ * (w1_size_ + w2_size_);
}

std::vector<MoeParameterLayout::ExpertRun> MoeParameterLayout::ExpertRuns() const {
  std::vector<ExpertRun> runs;
  const int64_t global_per_layer = shape_.experts * (w1_size_ + w2_size_);
  for (int64_t l = 0; l < layers_; ++l) {
    const int64_t offset = l * experts_per_layer_, global = l * global_per_layer;
    runs.push_back(ExpertRun{offset, local_experts_ * w1_size_, global + first_expert_ * w1_size_});
    runs.push_back(ExpertRun{offset + local_experts_ * w1_size_, local_experts_ * w2_size_,
                             global + shape_.experts * w1_size_ + first_expert_ * w2_size_});
  }
  return runs;
}

template <typename T>
MoeLayerWeights<T> MoeParameterLayout::Weights(const T* replicated, const T* experts,
                                               int64_t layer, const T* router_bias) const {
  const T* rep = replicated + layer * replicated_per_layer_;
  const T* exp = experts + layer * experts_per_layer_;
  MoeLayerWeights<T> w;
  w.router = rep;
  w.router_bias = router_bias;
  w.shared_w1 = rep + shape_.hidden * shape_.experts;
  w.shared_w2 = w.shared_w1 + shape_.shared_experts * w1_size_;
  w.expert_w1 = exp;
  w.expert_w2 = exp + local_experts_ * w1_size_;
  return w;
}

template <typename T>
MoeLayerGrads<T> MoeParameterLayout::Grads(T* replicated, T* experts, int64_t layer) const {
  T* rep = replicated + layer * replicated_per_layer_;
  T* exp = experts + layer * experts_per_layer_;
  MoeLayerGrads<T> g;
  g.router = rep;
  g.shared_w1 = rep + shape_.hidden * shape_.experts;
  g.shared_w2 = g.shared_w1 + shape_.shared_experts * w1_size_;
  g.expert_w1 = exp;
  g.expert_w2 = exp + local_experts_ * w1_size_;
  return g;
}

std::vector<MoeParameterLayout::NormalFill> MoeParameterLayout::InitialFills(uint64_t seed) const {
  const double hidden_scale = 1.0 / std::sqrt(static_cast<double>(shape_.hidden));
  // Each layer adds its routed and shared experts' outputs to the residual stream: scaling w2
  // by 1/sqrt(layers * (1 + shared)) keeps the stream's variance of order one at any depth.
  const double ffn_scale =
      1.0 / std::sqrt(static_cast<double>(shape_.ffn * layers_ * (1 + shape_.shared_experts)));
  std::vector<NormalFill> fills;
  auto add = [&](int buffer, int64_t offset, int64_t layer, uint64_t tag, int64_t index,
                 int64_t count, double scale) {
    const uint64_t stream = MixSeed(MixSeed(MixSeed(seed, static_cast<uint64_t>(layer)), tag),
                                    static_cast<uint64_t>(index));
    fills.push_back(NormalFill{buffer, offset, stream, count, scale});
  };
  const int64_t shared_w1 = shape_.hidden * shape_.experts;
  const int64_t shared_w2 = shared_w1 + shape_.shared_experts * w1_size_;
  for (int64_t layer = 0; layer < layers_; ++layer) {
    const int64_t rep = layer * replicated_per_layer_, exp = layer * experts_per_layer_;
    add(0, rep, layer, kRouter, 0, shape_.hidden * shape_.experts, hidden_scale);
    for (int64_t s = 0; s < shape_.shared_experts; ++s) {
      add(0, rep + shared_w1 + s * w1_size_, layer, kSharedW1, s, w1_size_, hidden_scale);
      add(0, rep + shared_w2 + s * w2_size_, layer, kSharedW2, s, w2_size_, ffn_scale);
    }
    for (int64_t e = 0; e < local_experts_; ++e) {
      const int64_t expert_id = first_expert_ + e;
      add(1, exp + e * w1_size_, layer, kExpertW1, expert_id, w1_size_, hidden_scale);
      add(1, exp + local_experts_ * w1_size_ + e * w2_size_, layer, kExpertW2, expert_id, w2_size_,
          ffn_scale);
    }
  }
  return fills;
}

template <typename T>
void MoeParameterLayout::Initialize(uint64_t seed, T* replicated, T* experts) const {
  for (const NormalFill& fill : InitialFills(seed)) {
    T* out = (fill.buffer == 0 ? replicated : experts) + fill.offset;
    for (int64_t i = 0; i < fill.count; ++i) {
      out[i] = static_cast<T>(fill.scale * NormalAt(fill.stream, static_cast<uint64_t>(i)));
    }
  }
}

#define DROPLESS_INSTANTIATE_MODEL(T)                                                         \
  template MoeLayerWeights<T> MoeParameterLayout::Weights<T>(const T*, const T*, int64_t,     \
                                                             const T*) const;                 \
  template MoeLayerGrads<T> MoeParameterLayout::Grads<T>(T*, T*, int64_t) const;              \
  template void MoeParameterLayout::Initialize<T>(uint64_t, T*, T*) const;
DROPLESS_INSTANTIATE_MODEL(float)
DROPLESS_INSTANTIATE_MODEL(double)
#undef DROPLESS_INSTANTIATE_MODEL

}  // namespace dropless::cpu
