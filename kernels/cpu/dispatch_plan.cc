// CPU reference of the dispatch plan (dispatch_plan.h): a stable counting sort of the choices.
#include "dropless/kernels/dispatch_plan.h"

#include <vector>

#include "absl/status/status.h"

namespace dropless::kernels::cpu {

absl::Status BuildDispatchPlan(const DispatchPlanShape& shape, const int32_t* expert_ids,
                               const DispatchPlan& plan, void* /*workspace*/) {
  if (absl::Status s = ValidateDispatchPlanShape(shape, false); !s.ok()) return s;
  const int64_t choices = shape.num_tokens * shape.top_k;
  if (plan.expert_offsets == nullptr) return absl::InvalidArgumentError("expert_offsets is null");
  if (choices > 0 && (expert_ids == nullptr || plan.slot_of_choice == nullptr ||
                      plan.choice_of_slot == nullptr)) {
    return absl::InvalidArgumentError("expert_ids, slot_of_choice and choice_of_slot must be set");
  }
  const int num_experts = shape.num_experts;
  std::vector<int32_t> next(num_experts + 1, 0);
  for (int64_t i = 0; i < choices; ++i) {
    const int32_t e = expert_ids[i];
    if (e >= 0 && e < num_experts) ++next[e + 1];
  }
  for (int e = 0; e < num_experts; ++e) next[e + 1] += next[e];
  for (int e = 0; e <= num_experts; ++e) plan.expert_offsets[e] = next[e];
  for (int64_t i = 0; i < choices; ++i) {
    const int32_t e = expert_ids[i];
    if (e < 0 || e >= num_experts) {
      plan.slot_of_choice[i] = -1;
      continue;
    }
    const int32_t slot = next[e]++;
    plan.slot_of_choice[i] = slot;
    plan.choice_of_slot[slot] = static_cast<int32_t>(i);
  }
  return absl::OkStatus();
}

}  // namespace dropless::kernels::cpu
