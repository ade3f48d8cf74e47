// Permute / unpermute + combine and their backward passes (contracts: dropless/kernels/permute.h).
// One block per token (PermuteMxfp8: several tokens when rows are short): the token row is read
// once (permute: stored to its k slots with evict-first stores; combine: the k slot rows are
// gathered and reduced in choice order with fp32 FMAs).
#include <cuda_runtime.h>

#include <algorithm>

#include "absl/status/status.h"
#include "dropless/kernels/permute.h"
#include "dropless/kernels/routing.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.cuh"

namespace dropless::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kUnroll = 8;  // 16-byte vectors per thread per pass: 8 * 128 * 8 = 8192 columns

// The token's slots (and weights) in shared memory; -1 marks a dropped choice.
struct TokenRoute {
  int32_t slot[kMaxRoutingTopK];
  float weight[kMaxRoutingTopK];
};

__device__ __forceinline__ void LoadRoute(const int32_t* __restrict__ slot_of_choice,
                                          const float* __restrict__ weights, int64_t token,
                                          int top_k, TokenRoute* route) {
  if (threadIdx.x < top_k) {
    route->slot[threadIdx.x] = slot_of_choice[token * top_k + threadIdx.x];
    route->weight[threadIdx.x] = weights == nullptr ? 1.0f : weights[token * top_k + threadIdx.x];
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    PermuteKernel(const uint4* __restrict__ x, int64_t vecs_per_row,
                  const int32_t* __restrict__ slot_of_choice, int top_k, uint4* __restrict__ rows) {
  __shared__ TokenRoute route;
  const int64_t token = blockIdx.x;
  LoadRoute(slot_of_choice, nullptr, token, top_k, &route);
  for (int64_t v0 = threadIdx.x; v0 < vecs_per_row; v0 += kThreads * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = v0 + u * kThreads;
      if (c < vecs_per_row) v[u] = detail::LoadVecStreaming(x + token * vecs_per_row + c);
    }
    for (int j = 0; j < top_k; ++j) {
      const int64_t slot = route.slot[j];
      if (slot < 0) continue;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = v0 + u * kThreads;
        if (c < vecs_per_row) __stcs(rows + slot * vecs_per_row + c, v[u]);
      }
    }
  }
}

// Each thread owns pairs of vectors (16 elements): an MX block is 2 lanes, stores are 16 bytes.
constexpr int kPairUnroll = 4;
constexpr int kPassPairs = kThreads * kPairUnroll;  // pairs one pass covers
constexpr int kPassScales = kPassPairs / 2;         // scale bytes one pass produces
constexpr int kMaxTokensPerBlock = 8;

// Tokens one block takes: rows of at most a pass's pairs that divide it share one pass (qwen3's
// 2048 columns: four tokens per block), so short rows do not leave most lanes idle and each block
// pays its route load and barriers once for several tokens.
inline int TokensPerBlock(int64_t pairs_per_row) {
  if (pairs_per_row > kPassPairs || kPassPairs % pairs_per_row != 0) return 1;
  return static_cast<int>(std::min<int64_t>(kMaxTokensPerBlock, kPassPairs / pairs_per_row));
}

// The scale bytes of a pass are gathered in shared memory and leave as whole 16-byte (or 4-byte)
// stores per slot: one byte store per MX block per slot, from half the lanes, cost ~6% of the
// copy bandwidth at dsv3 (docs/kernels.md). `scale_unit` (16, 4 or 1) divides scales_per_row and
// the alignment of `scales`. With several tokens per block (one pass), pair q of the pass belongs
// to token q / pairs_per_row.
__global__ void __launch_bounds__(kThreads)
    PermuteMxfp8Kernel(const uint4* __restrict__ x, int64_t num_tokens, int64_t vecs_per_row,
                       const int32_t* __restrict__ slot_of_choice, int top_k,
                       uint4* __restrict__ data, uint8_t* __restrict__ scales, int scale_unit,
                       int tokens_per_block) {
  __shared__ int32_t route[kMaxTokensPerBlock][kMaxRoutingTopK];
  __shared__ __align__(16) uint8_t pass_scales[kPassScales];
  const int64_t token0 = static_cast<int64_t>(blockIdx.x) * tokens_per_block;
  const int64_t pairs_per_row = vecs_per_row / 2;
  const int64_t scales_per_row = vecs_per_row / 4;
  const int64_t block_pairs = pairs_per_row * tokens_per_block;  // one row, or one pass
  uint4 a[kPairUnroll], b[kPairUnroll];
  int tok[kPairUnroll];       // token of the block (0..tokens_per_block-1) of pair u
  int32_t pair[kPairUnroll];  // pair within its token's row; -1 when past the row or the tokens
  auto locate = [&](int64_t base) {
#pragma unroll
    for (int u = 0; u < kPairUnroll; ++u) {
      const int64_t q = base + u * kThreads + threadIdx.x;
      const int t = tokens_per_block == 1 ? 0 : static_cast<int>(q / pairs_per_row);
      const int64_t p = q - t * pairs_per_row;
      tok[u] = t;
      pair[u] = q < block_pairs && token0 + t < num_tokens ? static_cast<int32_t>(p) : -1;
    }
  };
  auto load = [&] {
#pragma unroll
    for (int u = 0; u < kPairUnroll; ++u) {
      const uint4* v = x + (token0 + tok[u]) * vecs_per_row + 2 * pair[u];
      a[u] = pair[u] >= 0 ? detail::LoadVecStreaming(v) : make_uint4(0, 0, 0, 0);
      b[u] = pair[u] >= 0 ? detail::LoadVecStreaming(v + 1) : make_uint4(0, 0, 0, 0);
    }
  };
  // The first pass's row loads go out before the route's (they do not depend on it), so the block
  // waits for one memory latency instead of two in a row.
  locate(0);
  load();
  if (threadIdx.x < tokens_per_block * top_k) {
    const int t = threadIdx.x / top_k, j = threadIdx.x - t * top_k;
    route[t][j] = token0 + t < num_tokens ? slot_of_choice[(token0 + t) * top_k + j] : -1;
  }
  // Uniform trip count per block: every lane reaches the pair shuffles and the barriers.
  for (int64_t base = 0; base < block_pairs; base += kPassPairs) {
    if (base > 0) {
      locate(base);
      load();
    }
    detail::MxPair q[kPairUnroll];
#pragma unroll
    for (int u = 0; u < kPairUnroll; ++u) {
      // Skip passes no lane of the block needs (uniform across the block).
      if (base + u * kThreads < block_pairs) {
        q[u] = detail::QuantizeMxPair(a[u], b[u]);
        if ((threadIdx.x & 1) == 0) {
          pass_scales[(u * kThreads + threadIdx.x) / 2] = static_cast<uint8_t>(q[u].scale);
        }
      }
    }
    __syncthreads();  // pass_scales (and, first time, the route) complete
    // This pass's scale bytes first, per token of the pass its run of scales from first_scale, then
    // the E4M3 rows: the small scattered scale stores leave at the start of the block's store
    // burst instead of queueing behind its 56 KB (dsv3) or 64 KB (qwen3) of row stores: 0.6-1%
    // faster, also with the scale buffers rotated (docs/kernels.md).
    const int64_t first_scale = base / 2;  // within the row (base is 0 with several tokens)
    const int token_bytes =
        static_cast<int>(min(static_cast<int64_t>(kPassScales), scales_per_row - first_scale));
    const int units = token_bytes / scale_unit;  // scale_unit divides token_bytes (see launcher)
    for (int idx = threadIdx.x; idx < tokens_per_block * top_k * units; idx += kThreads) {
      const int tj = idx / units, n = idx - tj * units;
      const int t = tj / top_k, j = tj - t * top_k;
      const int64_t slot = route[t][j];
      if (slot < 0) continue;
      uint8_t* dst = scales + slot * scales_per_row + first_scale + n * scale_unit;
      const uint8_t* src = pass_scales + t * scales_per_row + n * scale_unit;
      if (scale_unit == 16) {
        __stcs(reinterpret_cast<uint4*>(dst), *reinterpret_cast<const uint4*>(src));
      } else if (scale_unit == 4) {
        *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(src);
      } else {
        *dst = *src;
      }
    }
    for (int j = 0; j < top_k; ++j) {
#pragma unroll
      for (int u = 0; u < kPairUnroll; ++u) {
        if (pair[u] < 0) continue;
        const int64_t slot = route[tok[u]][j];
        if (slot >= 0) __stcs(data + slot * pairs_per_row + pair[u], q[u].data);
      }
    }
    __syncthreads();  // pass_scales is rewritten by the next pass
  }
}

// y[t] = sum_j w_j * rows[slot_j] (w = 1 when weights is null), fp32 FMAs in choice order.
template <int kMaxK>
__global__ void __launch_bounds__(kThreads)
    CombineKernel(const uint4* __restrict__ rows, int64_t vecs_per_row,
                  const int32_t* __restrict__ slot_of_choice, const float* __restrict__ weights,
                  int top_k, uint4* __restrict__ y) {
  __shared__ TokenRoute route;
  const int64_t token = blockIdx.x;
  LoadRoute(slot_of_choice, weights, token, top_k, &route);
  for (int64_t c = threadIdx.x; c < vecs_per_row; c += kThreads) {
    uint4 v[kMaxK];
#pragma unroll
    for (int j = 0; j < kMaxK; ++j) {
      if (j < top_k && route.slot[j] >= 0) {
        v[j] =
            detail::LoadVecStreaming(rows + static_cast<int64_t>(route.slot[j]) * vecs_per_row + c);
      }
    }
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < kMaxK; ++j) {
      if (j < top_k && route.slot[j] >= 0) {
        float f[8];
        detail::Unpack8(v[j], f);
        const float w = route.weight[j];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = __fmaf_rn(w, f[e], acc[e]);
      }
    }
    y[token * vecs_per_row + c] = detail::Pack8(acc);
  }
}

// d_rows[slot_j] = w_j * d_y[t];  d_w[t][j] = <d_y[t], rows[slot_j]>.
template <int kMaxK>
__global__ void __launch_bounds__(kThreads)
    CombineBackwardKernel(const uint4* __restrict__ d_y, const uint4* __restrict__ rows,
                          int64_t vecs_per_row, const int32_t* __restrict__ slot_of_choice,
                          const float* __restrict__ weights, int top_k, uint4* __restrict__ d_rows,
                          float* __restrict__ d_weights) {
  __shared__ TokenRoute route;
  __shared__ float partial[kThreads / 32][kMaxK];
  const int64_t token = blockIdx.x;
  LoadRoute(slot_of_choice, weights, token, top_k, &route);
  float dot[kMaxK];
#pragma unroll
  for (int j = 0; j < kMaxK; ++j) dot[j] = 0.0f;
  for (int64_t c = threadIdx.x; c < vecs_per_row; c += kThreads) {
    const uint4 g = detail::LoadVecStreaming(d_y + token * vecs_per_row + c);
    uint4 v[kMaxK];
#pragma unroll
    for (int j = 0; j < kMaxK; ++j) {
      if (j < top_k && route.slot[j] >= 0) {
        v[j] =
            detail::LoadVecStreaming(rows + static_cast<int64_t>(route.slot[j]) * vecs_per_row + c);
      }
    }
    float gf[8];
    detail::Unpack8(g, gf);
#pragma unroll
    for (int j = 0; j < kMaxK; ++j) {
      if (j < top_k && route.slot[j] >= 0) {
        const float w = route.weight[j];
        float scaled[8], f[8];
        detail::Unpack8(v[j], f);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          scaled[e] = __fmul_rn(w, gf[e]);
          dot[j] = __fmaf_rn(gf[e], f[e], dot[j]);
        }
        if (d_rows != nullptr) {
          d_rows[static_cast<int64_t>(route.slot[j]) * vecs_per_row + c] = detail::Pack8(scaled);
        }
      }
    }
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kMaxK; ++j) {
    const float s = detail::WarpSum(dot[j]);
    if (lane == 0) partial[warp][j] = s;
  }
  __syncthreads();
  if (threadIdx.x < top_k) {
    float s = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) s += partial[w][threadIdx.x];
    d_weights[token * top_k + threadIdx.x] = route.slot[threadIdx.x] >= 0 ? s : 0.0f;
  }
}

absl::Status CheckBuffers(const PermuteShape& shape, bool mxfp8,
                          std::initializer_list<const void*> buffers) {
  if (absl::Status s = ValidatePermuteShape(shape, mxfp8); !s.ok()) return s;
  if (shape.num_tokens == 0) return absl::OkStatus();
  if (shape.num_tokens > 0x7fffffff) return absl::InvalidArgumentError("num_tokens: too many");
  for (const void* p : buffers) {
    if (p == nullptr) return absl::InvalidArgumentError("permute: a required buffer is null");
  }
  return absl::OkStatus();
}

template <template <int> class Launch, typename... Args>
absl::Status DispatchTopK(int top_k, Args&&... args) {
  if (top_k <= 2) return Launch<2>::Run(args...);
  if (top_k <= 4) return Launch<4>::Run(args...);
  if (top_k <= 8) return Launch<8>::Run(args...);
  return Launch<16>::Run(args...);
}

template <int kMaxK>
struct LaunchCombine {
  static absl::Status Run(const PermuteShape& shape, const Bf16* rows, const int32_t* slots,
                          const float* weights, Bf16* y, Stream stream) {
    CombineKernel<kMaxK><<<static_cast<unsigned>(shape.num_tokens), kThreads, 0, stream>>>(
        reinterpret_cast<const uint4*>(rows), shape.hidden / 8, slots, weights, shape.top_k,
        reinterpret_cast<uint4*>(y));
    return LaunchStatus("CombineKernel");
  }
};

template <int kMaxK>
struct LaunchCombineBackward {
  static absl::Status Run(const PermuteShape& shape, const Bf16* d_y, const Bf16* rows,
                          const int32_t* slots, const float* weights, Bf16* d_rows,
                          float* d_weights, Stream stream) {
    CombineBackwardKernel<kMaxK><<<static_cast<unsigned>(shape.num_tokens), kThreads, 0, stream>>>(
        reinterpret_cast<const uint4*>(d_y), reinterpret_cast<const uint4*>(rows), shape.hidden / 8,
        slots, weights, shape.top_k, reinterpret_cast<uint4*>(d_rows), d_weights);
    return LaunchStatus("CombineBackwardKernel");
  }
};

}  // namespace

absl::Status Permute(const PermuteShape& shape, const Bf16* x, const int32_t* slot_of_choice,
                     Bf16* rows, Stream stream) {
  if (absl::Status s = CheckBuffers(shape, false, {x, slot_of_choice, rows}); !s.ok()) return s;
  if (shape.num_tokens == 0) return absl::OkStatus();
  PermuteKernel<<<static_cast<unsigned>(shape.num_tokens), kThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(x), shape.hidden / 8, slot_of_choice, shape.top_k,
      reinterpret_cast<uint4*>(rows));
  return LaunchStatus("PermuteKernel");
}

absl::Status PermuteMxfp8(const PermuteShape& shape, const Bf16* x, const int32_t* slot_of_choice,
                          const MxRowwise& rows, Stream stream) {
  if (absl::Status s = CheckBuffers(shape, true, {x, slot_of_choice, rows.data, rows.scales});
      !s.ok()) {
    return s;
  }
  if (shape.num_tokens == 0) return absl::OkStatus();
  // Widest scale store that every slot's scale row and every pass (kPassScales bytes, a multiple
  // of 16) start aligned to.
  const int64_t scales_per_row = shape.hidden / kMxBlock;
  const uintptr_t scales_at = reinterpret_cast<uintptr_t>(rows.scales);
  const int scale_unit = scales_per_row % 16 == 0 && scales_at % 16 == 0 ? 16
                         : scales_per_row % 4 == 0 && scales_at % 4 == 0 ? 4
                                                                         : 1;
  const int tpb = TokensPerBlock(shape.hidden / 16);
  const int64_t blocks = (shape.num_tokens + tpb - 1) / tpb;
  PermuteMxfp8Kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(x), shape.num_tokens, shape.hidden / 8, slot_of_choice,
      shape.top_k, reinterpret_cast<uint4*>(rows.data), rows.scales, scale_unit, tpb);
  return LaunchStatus("PermuteMxfp8Kernel");
}

absl::Status PermuteBackward(const PermuteShape& shape, const Bf16* d_rows,
                             const int32_t* slot_of_choice, Bf16* d_x, Stream stream) {
  if (absl::Status s = CheckBuffers(shape, false, {d_rows, slot_of_choice, d_x}); !s.ok()) return s;
  if (shape.num_tokens == 0) return absl::OkStatus();
  return DispatchTopK<LaunchCombine>(shape.top_k, shape, d_rows, slot_of_choice,
                                     static_cast<const float*>(nullptr), d_x, stream);
}

absl::Status UnpermuteCombine(const PermuteShape& shape, const Bf16* rows,
                              const int32_t* slot_of_choice, const float* weights, Bf16* y,
                              Stream stream) {
  if (absl::Status s = CheckBuffers(shape, false, {rows, slot_of_choice, weights, y}); !s.ok()) {
    return s;
  }
  if (shape.num_tokens == 0) return absl::OkStatus();
  return DispatchTopK<LaunchCombine>(shape.top_k, shape, rows, slot_of_choice, weights, y, stream);
}

absl::Status UnpermuteCombineBackward(const PermuteShape& shape, const Bf16* d_y, const Bf16* rows,
                                      const int32_t* slot_of_choice, const float* weights,
                                      Bf16* d_rows, float* d_weights, Stream stream) {
  // d_rows may be null: the weight gradients only (UnpermuteCombineBackwardFp8Block writes the
  // row gradients' quantized forms).
  if (absl::Status s = CheckBuffers(shape, false, {d_y, rows, slot_of_choice, weights, d_weights});
      !s.ok()) {
    return s;
  }
  if (shape.num_tokens == 0) return absl::OkStatus();
  return DispatchTopK<LaunchCombineBackward>(shape.top_k, shape, d_y, rows, slot_of_choice, weights,
                                             d_rows, d_weights, stream);
}

}  // namespace dropless::kernels::cuda
