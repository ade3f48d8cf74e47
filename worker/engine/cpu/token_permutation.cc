#include "worker/engine/cpu/token_permutation.h"

#include <algorithm>
#include <vector>

namespace dropless::cpu {

void BuildExpertOrder(int64_t tokens, int64_t topk, int64_t experts, const int32_t* expert_ids,
                      int64_t* rows_per_expert, int64_t* row_of_slot) {
  const int64_t slots = tokens * topk;
  std::fill(rows_per_expert, rows_per_expert + experts, 0);
  for (int64_t s = 0; s < slots; ++s) ++rows_per_expert[expert_ids[s]];
  std::vector<int64_t> next_row(experts, 0);
  for (int64_t e = 1; e < experts; ++e) next_row[e] = next_row[e - 1] + rows_per_expert[e - 1];
  // Slots are visited in (token, slot) order, so each expert's rows keep that order.
  for (int64_t s = 0; s < slots; ++s) row_of_slot[s] = next_row[expert_ids[s]]++;
}

template <typename T>
void GatherTokenRows(int64_t tokens, int64_t topk, int64_t hidden, const int64_t* row_of_slot,
                     const T* x, T* rows) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < topk; ++j) {
      std::copy(x + t * hidden, x + (t + 1) * hidden, rows + row_of_slot[t * topk + j] * hidden);
    }
  }
}

template <typename T>
void CombineExpertRows(int64_t tokens, int64_t topk, int64_t hidden, const int64_t* row_of_slot,
                       const T* gates, const T* rows, T* out) {
  for (int64_t t = 0; t < tokens; ++t) {
    T* o = out + t * hidden;
    for (int64_t j = 0; j < topk; ++j) {
      const T g = gates[t * topk + j];
      const T* r = rows + row_of_slot[t * topk + j] * hidden;
      for (int64_t d = 0; d < hidden; ++d) o[d] += g * r[d];
    }
  }
}

template <typename T>
void CombineExpertRowsBackward(int64_t tokens, int64_t topk, int64_t hidden,
                               const int64_t* row_of_slot, const T* gates, const T* rows,
                               const T* out_grad, T* gate_grads, T* row_grads) {
  for (int64_t t = 0; t < tokens; ++t) {
    const T* go = out_grad + t * hidden;
    for (int64_t j = 0; j < topk; ++j) {
      const int64_t row = row_of_slot[t * topk + j];
      const T g = gates[t * topk + j];
      const T* r = rows + row * hidden;
      T* gr = row_grads + row * hidden;
      T dot = 0;
      for (int64_t d = 0; d < hidden; ++d) {
        dot += go[d] * r[d];
        gr[d] = g * go[d];
      }
      gate_grads[t * topk + j] = dot;
    }
  }
}

template <typename T>
void ScatterAddTokenRows(int64_t tokens, int64_t topk, int64_t hidden, const int64_t* row_of_slot,
                         const T* row_grads, T* x_grad) {
  for (int64_t t = 0; t < tokens; ++t) {
    T* gx = x_grad + t * hidden;
    for (int64_t j = 0; j < topk; ++j) {
      const T* gr = row_grads + row_of_slot[t * topk + j] * hidden;
      for (int64_t d = 0; d < hidden; ++d) gx[d] += gr[d];
    }
  }
}

#define DROPLESS_INSTANTIATE_PERMUTATION(T)                                                    \
  template void GatherTokenRows<T>(int64_t, int64_t, int64_t, const int64_t*, const T*, T*);   \
  template void CombineExpertRows<T>(int64_t, int64_t, int64_t, const int64_t*, const T*,      \
                                     const T*, T*);                                            \
  template void CombineExpertRowsBackward<T>(int64_t, int64_t, int64_t, const int64_t*,        \
                                             const T*, const T*, const T*, T*, T*);            \
  template void ScatterAddTokenRows<T>(int64_t, int64_t, int64_t, const int64_t*, const T*, T*);
DROPLESS_INSTANTIATE_PERMUTATION(float)
DROPLESS_INSTANTIATE_PERMUTATION(double)
#undef DROPLESS_INSTANTIATE_PERMUTATION

}  // namespace dropless::cpu
