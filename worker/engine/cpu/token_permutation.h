// Moving token rows between token order and expert-contiguous order. A (token, slot) pair is one
// routed copy of a token: slot j of token t goes to expert_ids[t * k + j]. Rows are ordered by
// expert, then by token, then by slot, so the order is the same whatever the thread or rank count.
#ifndef DROPLESS_WORKER_ENGINE_CPU_TOKEN_PERMUTATION_H_
#define DROPLESS_WORKER_ENGINE_CPU_TOKEN_PERMUTATION_H_

#include <cstdint>

namespace dropless::cpu {

// Counting sort by expert: rows_per_expert[e] (experts entries) and row_of_slot[t * k + j], the
// position of that pair in expert order.
void BuildExpertOrder(int64_t tokens, int64_t topk, int64_t experts, const int32_t* expert_ids,
                      int64_t* rows_per_expert, int64_t* row_of_slot);

// rows[row_of_slot[t * k + j]] = x[t], rows of `hidden` values.
template <typename T>
void GatherTokenRows(int64_t tokens, int64_t topk, int64_t hidden, const int64_t* row_of_slot,
                     const T* x, T* rows);

// out[t] += sum_j gates[t, j] * rows[row_of_slot[t * k + j]].
template <typename T>
void CombineExpertRows(int64_t tokens, int64_t topk, int64_t hidden, const int64_t* row_of_slot,
                       const T* gates, const T* rows, T* out);

// Backward of CombineExpertRows: gate_grads[t, j] = <out_grad[t], rows[r]> and
// row_grads[r] = gates[t, j] * out_grad[t], for r = row_of_slot[t * k + j] (both overwritten).
template <typename T>
void CombineExpertRowsBackward(int64_t tokens, int64_t topk, int64_t hidden,
                               const int64_t* row_of_slot, const T* gates, const T* rows,
                               const T* out_grad, T* gate_grads, T* row_grads);

// Backward of GatherTokenRows: x_grad[t] += sum_j row_grads[row_of_slot[t * k + j]].
template <typename T>
void ScatterAddTokenRows(int64_t tokens, int64_t topk, int64_t hidden, const int64_t* row_of_slot,
                         const T* row_grads, T* x_grad);

}  // namespace dropless::cpu

#endif  // DROPLESS_WORKER_ENGINE_CPU_TOKEN_PERMUTATION_H_
