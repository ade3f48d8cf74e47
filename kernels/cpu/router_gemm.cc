// CPU reference of the router logits products (router_gemm.h), accumulated in double.
#include "dropless/kernels/router_gemm.h"

#include <vector>

#include "absl/status/status.h"

namespace dropless::kernels::cpu {

absl::Status RouterLogits(const RouterGemmShape& shape, int64_t num_tokens, const Bf16* x,
                          const Bf16* w, float* logits) {
  if (absl::Status s = ValidateRouterGemmShape(shape, num_tokens); !s.ok()) return s;
  if (num_tokens > 0 && (x == nullptr || w == nullptr || logits == nullptr)) {
    return absl::InvalidArgumentError("x, w and logits must be set");
  }
  const int64_t hidden = shape.hidden;
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int e = 0; e < shape.num_experts; ++e) {
      double acc = 0;
      for (int64_t h = 0; h < hidden; ++h) {
        acc += static_cast<double>(Bf16ToFloat(x[t * hidden + h])) * Bf16ToFloat(w[e * hidden + h]);
      }
      logits[t * shape.num_experts + e] = static_cast<float>(acc);
    }
  }
  return absl::OkStatus();
}

absl::Status RouterLogitsBackward(const RouterGemmShape& shape, int64_t num_tokens, const Bf16* x,
                                  const Bf16* w, const float* d_logits, Bf16* d_x,
                                  bool accumulate_d_x, float* d_w) {
  if (absl::Status s = ValidateRouterGemmShape(shape, num_tokens); !s.ok()) return s;
  if (d_w == nullptr || (num_tokens > 0 && (x == nullptr || w == nullptr ||
                                            d_logits == nullptr || d_x == nullptr))) {
    return absl::InvalidArgumentError("x, w, d_logits, d_x and d_w must be set");
  }
  const int64_t hidden = shape.hidden;
  const int experts = shape.num_experts;
  // The tensor-core path multiplies d_logits rounded to bf16.
  std::vector<float> g(num_tokens * experts);
  for (int64_t i = 0; i < num_tokens * experts; ++i) g[i] = Bf16ToFloat(FloatToBf16(d_logits[i]));
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t h = 0; h < hidden; ++h) {
      double acc = 0;
      for (int e = 0; e < experts; ++e) {
        acc += static_cast<double>(g[t * experts + e]) * Bf16ToFloat(w[e * hidden + h]);
      }
      if (accumulate_d_x) acc += Bf16ToFloat(d_x[t * hidden + h]);
      d_x[t * hidden + h] = FloatToBf16(static_cast<float>(acc));
    }
  }
  for (int e = 0; e < experts; ++e) {
    for (int64_t h = 0; h < hidden; ++h) {
      double acc = 0;
      for (int64_t t = 0; t < num_tokens; ++t) {
        acc += static_cast<double>(g[t * experts + e]) * Bf16ToFloat(x[t * hidden + h]);
      }
      d_w[e * hidden + h] = static_cast<float>(acc);
    }
  }
  return absl::OkStatus();
}

}  // namespace dropless::kernels::cpu
