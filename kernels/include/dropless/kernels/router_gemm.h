// Router logits: logits[T][E] = x[T][H] . w[E][H]^T, bf16 operands, fp32 accumulation and output;
// and its backward, the two products that send d_logits back to the hidden states and the router
// weight.
//
//   Forward         logits = x . w^T                       fp32 [T][E]
//   Backward data   d_x    = d_logits . w   (+ d_x)        bf16 [T][H]; accumulate adds into d_x
//   Backward weight d_w    = d_logits^T . x                fp32 [E][H]
// The backward products take d_logits rounded to bf16 (the tensor cores need one operand type);
// the CPU reference rounds the same way, so the two differ only by accumulation order.
// All buffers are dense row-major.
#ifndef DROPLESS_KERNELS_ROUTER_GEMM_H_
#define DROPLESS_KERNELS_ROUTER_GEMM_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dropless/kernels/types.h"

namespace dropless::kernels {

struct RouterGemmShape {
  int64_t max_tokens = 0;  // T the buffers hold; a call may use fewer
  int64_t hidden = 0;      // H, multiple of 8
  int num_experts = 0;     // E, multiple of 8
};

absl::Status ValidateRouterGemmShape(const RouterGemmShape& shape, int64_t num_tokens);

namespace cpu {

absl::Status RouterLogits(const RouterGemmShape& shape, int64_t num_tokens, const Bf16* x,
                          const Bf16* w, float* logits);

absl::Status RouterLogitsBackward(const RouterGemmShape& shape, int64_t num_tokens, const Bf16* x,
                                  const Bf16* w, const float* d_logits, Bf16* d_x,
                                  bool accumulate_d_x, float* d_w);

}  // namespace cpu

namespace cuda {

// Holds the cuBLASLt handle, the chosen algorithms, a workspace and the bf16 copy of d_logits, so
// calls allocate nothing and can be captured in a CUDA graph. Calls on one object must be ordered
// on one stream.
class RouterGemm {
 public:
  static absl::StatusOr<std::unique_ptr<RouterGemm>> Create(const RouterGemmShape& shape);
  virtual ~RouterGemm() = default;

  virtual absl::Status Logits(int64_t num_tokens, const Bf16* x, const Bf16* w, float* logits,
                              Stream stream) = 0;
  virtual absl::Status LogitsBackward(int64_t num_tokens, const Bf16* x, const Bf16* w,
                                      const float* d_logits, Bf16* d_x, bool accumulate_d_x,
                                      float* d_w, Stream stream) = 0;
};

}  // namespace cuda
}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_ROUTER_GEMM_H_
