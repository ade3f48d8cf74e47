// CPU reference of permute / unpermute (permute.h). Fused multiply-adds in choice order, in fp32
// for bf16 as the CUDA kernels (so the bf16 outputs agree bit for bit), in T for float and double.
#include "dropless/kernels/permute.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/status/status.h"

namespace dropless::kernels::cpu {
namespace {

template <typename T>
absl::Status Check(const PermuteShape& shape, bool mxfp8, std::initializer_list<const void*> ptrs) {
  if (absl::Status s = ValidatePermuteShape(shape, mxfp8, kIsCudaStorage<T>); !s.ok()) return s;
  if (shape.num_tokens == 0) return absl::OkStatus();
  for (const void* p : ptrs) {
    if (p == nullptr) return absl::InvalidArgumentError("permute: a required buffer is null");
  }
  return absl::OkStatus();
}

}  // namespace

template <typename T>
absl::Status Permute(const PermuteShape& shape, const T* x, const int32_t* slot_of_choice,
                     T* rows) {
  if (absl::Status s = Check<T>(shape, false, {x, slot_of_choice, rows}); !s.ok()) return s;
  const int64_t hidden = shape.hidden;
  for (int64_t t = 0; t < shape.num_tokens; ++t) {
    for (int j = 0; j < shape.top_k; ++j) {
      const int32_t slot = slot_of_choice[t * shape.top_k + j];
      if (slot < 0) continue;
      std::copy(x + t * hidden, x + (t + 1) * hidden, rows + static_cast<int64_t>(slot) * hidden);
    }
  }
  return absl::OkStatus();
}

absl::Status PermuteMxfp8(const PermuteShape& shape, const Bf16* x, const int32_t* slot_of_choice,
                          const MxRowwise& rows) {
  if (absl::Status s = Check<Bf16>(shape, true, {x, slot_of_choice, rows.data, rows.scales});
      !s.ok()) {
    return s;
  }
  const int64_t hidden = shape.hidden;
  const int64_t blocks = hidden / kMxBlock;
  std::vector<uint8_t> data(hidden);
  std::vector<uint8_t> scales(blocks);
  for (int64_t t = 0; t < shape.num_tokens; ++t) {
    for (int64_t b = 0; b < blocks; ++b) {
      QuantizeMxBlock(x + t * hidden + b * kMxBlock, 1, data.data() + b * kMxBlock, 1,
                      scales.data() + b);
    }
    for (int j = 0; j < shape.top_k; ++j) {
      const int64_t slot = slot_of_choice[t * shape.top_k + j];
      if (slot < 0) continue;
      std::copy(data.begin(), data.end(), rows.data + slot * hidden);
      std::copy(scales.begin(), scales.end(), rows.scales + slot * blocks);
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status PermuteBackward(const PermuteShape& shape, const T* d_rows,
                             const int32_t* slot_of_choice, T* d_x) {
  return UnpermuteCombine<T>(shape, d_rows, slot_of_choice, nullptr, d_x);
}

// weights == nullptr means weight 1 (PermuteBackward): fma(1, v, acc) == acc + v exactly.
template <typename T>
absl::Status UnpermuteCombine(const PermuteShape& shape, const T* rows,
                              const int32_t* slot_of_choice, const MathOf<T>* weights, T* y) {
  using M = MathOf<T>;
  if (absl::Status s = Check<T>(shape, false, {rows, slot_of_choice, y}); !s.ok()) return s;
  const int64_t hidden = shape.hidden;
  std::vector<M> acc(hidden);
  for (int64_t t = 0; t < shape.num_tokens; ++t) {
    std::fill(acc.begin(), acc.end(), M(0));
    for (int j = 0; j < shape.top_k; ++j) {
      const int64_t slot = slot_of_choice[t * shape.top_k + j];
      if (slot < 0) continue;
      const M w = weights == nullptr ? M(1) : weights[t * shape.top_k + j];
      const T* row = rows + slot * hidden;
      for (int64_t h = 0; h < hidden; ++h) acc[h] = std::fma(w, ToMath(row[h]), acc[h]);
    }
    for (int64_t h = 0; h < hidden; ++h) y[t * hidden + h] = FromMath<T>(acc[h]);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status UnpermuteCombineBackward(const PermuteShape& shape, const T* d_y, const T* rows,
                                      const int32_t* slot_of_choice, const MathOf<T>* weights,
                                      T* d_rows, MathOf<T>* d_weights) {
  using M = MathOf<T>;
  if (absl::Status s =
          Check<T>(shape, false, {d_y, rows, slot_of_choice, weights, d_rows, d_weights});
      !s.ok()) {
    return s;
  }
  const int64_t hidden = shape.hidden;
  for (int64_t t = 0; t < shape.num_tokens; ++t) {
    const T* dy = d_y + t * hidden;
    for (int j = 0; j < shape.top_k; ++j) {
      const int64_t choice = t * shape.top_k + j;
      const int64_t slot = slot_of_choice[choice];
      if (slot < 0) {
        d_weights[choice] = M(0);
        continue;
      }
      const M w = weights[choice];
      const T* row = rows + slot * hidden;
      T* d_row = d_rows + slot * hidden;
      double dot = 0;
      for (int64_t h = 0; h < hidden; ++h) {
        const M g = ToMath(dy[h]);
        d_row[h] = FromMath<T>(w * g);
        dot += static_cast<double>(g) * ToMath(row[h]);
      }
      d_weights[choice] = static_cast<M>(dot);
    }
  }
  return absl::OkStatus();
}

#define DROPLESS_INSTANTIATE_PERMUTE(T)                                                        \
  template absl::Status Permute<T>(const PermuteShape&, const T*, const int32_t*, T*);         \
  template absl::Status PermuteBackward<T>(const PermuteShape&, const T*, const int32_t*, T*); \
  template absl::Status UnpermuteCombine<T>(const PermuteShape&, const T*, const int32_t*,     \
                                            const MathOf<T>*, T*);                             \
  template absl::Status UnpermuteCombineBackward<T>(                                           \
      const PermuteShape&, const T*, const T*, const int32_t*, const MathOf<T>*, T*, MathOf<T>*);
DROPLESS_INSTANTIATE_PERMUTE(Bf16)
DROPLESS_INSTANTIATE_PERMUTE(float)
DROPLESS_INSTANTIATE_PERMUTE(double)
#undef DROPLESS_INSTANTIATE_PERMUTE

}  // namespace dropless::kernels::cpu
