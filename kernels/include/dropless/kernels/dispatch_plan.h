// Dispatch plan: where each (token, choice) goes in expert-contiguous order.
//
// A choice is the flat index i = t * k + j of expert_ids[t][j]. The plan sorts the T*k choices by
// expert, stably (within an expert, by ascending choice index), and records
//   expert_offsets [E + 1]  exclusive prefix sum of the per-expert counts: expert e owns slots
//                           [expert_offsets[e], expert_offsets[e+1]); expert_offsets[E] = T*k
//   slot_of_choice [T * k]  choice -> slot (row of the permuted buffers)
//   choice_of_slot [T * k]  slot -> choice (its token is choice / k)
// The order is a pure function of expert_ids, so the CPU reference and the CUDA kernels agree bit
// for bit. Expert ids outside [0, E) are a caller bug: such choices get no slot (slot_of_choice =
// -1), expert_offsets[E] is then below T*k, and slots past it are left untouched.
//
// Every value stays on the device: the CUDA version is three launches, no host synchronization,
// capturable in a CUDA graph. It needs a caller-provided workspace of
// DispatchPlanWorkspaceBytes(shape) bytes (device memory, no initialization needed).
#ifndef DROPLESS_KERNELS_DISPATCH_PLAN_H_
#define DROPLESS_KERNELS_DISPATCH_PLAN_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "dropless/kernels/types.h"

namespace dropless::kernels {

struct DispatchPlanShape {
  int64_t num_tokens = 0;  // T
  int num_experts = 0;     // E, 1..512
  int top_k = 0;           // k, 1..16
};

// cuda_limits: also E <= 512 (the CUDA kernels); the CPU reference takes any E >= 1.
absl::Status ValidateDispatchPlanShape(const DispatchPlanShape& shape, bool cuda_limits = true);

struct DispatchPlan {
  int32_t* expert_offsets = nullptr;  // [E + 1]
  int32_t* slot_of_choice = nullptr;  // [T * k]
  int32_t* choice_of_slot = nullptr;  // [T * k]
};

// The CUDA kernels rank the choices in chunks of this many per block; the workspace holds one
// int32 per (chunk, expert).
inline constexpr int64_t kDispatchPlanChunk = 1024;

size_t DispatchPlanWorkspaceBytes(const DispatchPlanShape& shape);

namespace cpu {

// expert_ids [T][k]; workspace may be null (unused). The CPU engine orders its tokens with this
// (worker/engine/cpu/moe_layer.cc).
absl::Status BuildDispatchPlan(const DispatchPlanShape& shape, const int32_t* expert_ids,
                               const DispatchPlan& plan, void* workspace);

}  // namespace cpu

namespace cuda {

absl::Status BuildDispatchPlan(const DispatchPlanShape& shape, const int32_t* expert_ids,
                               const DispatchPlan& plan, void* workspace, Stream stream);

}  // namespace cuda
}  // namespace dropless::kernels

#endif  // DROPLESS_KERNELS_DISPATCH_PLAN_H_
