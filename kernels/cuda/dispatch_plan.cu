// Dispatch plan: stable counting sort of the T*k choices by expert, all on the device (contract:
// dropless/kernels/dispatch_plan.h). Three launches:
//   1. CountKernel     per chunk of kDispatchPlanChunk choices: per-expert counts -> workspace
//   2. ScanKernel      one block: expert offsets, and each chunk's starting slot per expert
//   3. RankKernel      per chunk: each warp walks its choices in order, ranking equal experts
//                      with __match_any_sync, so slots follow the choice order exactly
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "dropless/kernels/dispatch_plan.h"
#include "dropless/kernels/routing.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.cuh"

namespace dropless::kernels::cuda {
namespace {

using detail::kFullMask;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = static_cast<int>(kDispatchPlanChunk);
constexpr int kPerWarp = kChunk / kWarps;  // 512 consecutive choices per warp
constexpr int kSteps = kPerWarp / 32;      // 16 steps of 32
static_assert(kChunk % (kWarps * 32) == 0, "chunk must split into whole warp steps");

__device__ __forceinline__ bool ValidExpert(int32_t e, int experts) { return e >= 0 && e < experts; }

__global__ void __launch_bounds__(kThreads)
    CountKernel(const int32_t* __restrict__ expert_ids, int64_t choices, int experts,
                int32_t* __restrict__ chunk_counts) {
  __shared__ int32_t counts[kMaxRoutingExperts];
  for (int e = threadIdx.x; e < experts; e += kThreads) counts[e] = 0;
  __syncthreads();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunk;
  for (int i = threadIdx.x; i < kChunk; i += kThreads) {
    const int64_t c = begin + i;
    if (c < choices) {
      const int32_t e = expert_ids[c];
      if (ValidExpert(e, experts)) atomicAdd(&counts[e], 1);
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += kThreads) {
    chunk_counts[static_cast<int64_t>(blockIdx.x) * experts + e] = counts[e];
  }
}

// One thread per expert. chunk_counts[b][e] becomes the first slot of expert e in chunk b.
__global__ void __launch_bounds__(kMaxRoutingExperts)
    ScanKernel(int32_t* __restrict__ chunk_counts, int chunks, int experts,
               int32_t* __restrict__ expert_offsets) {
  __shared__ int32_t warp_totals[kMaxRoutingExperts / 32];
  const int e = threadIdx.x, lane = e & 31, warp = e >> 5;
  constexpr int kBatch = 8;  // independent loads in flight
  int32_t total = 0;
  if (e < experts) {
    for (int b0 = 0; b0 < chunks; b0 += kBatch) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (b0 + u < chunks) total += chunk_counts[static_cast<int64_t>(b0 + u) * experts + e];
      }
    }
  }
  int32_t inclusive = total;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int32_t n = __shfl_up_sync(kFullMask, inclusive, o);
    if (lane >= o) inclusive += n;
  }
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  int32_t before = inclusive - total;
  for (int w = 0; w < warp; ++w) before += warp_totals[w];
  if (e < experts) expert_offsets[e] = before;
  if (e == experts - 1) expert_offsets[experts] = before + total;
  if (e >= experts) return;
  int32_t running = before;
  for (int b0 = 0; b0 < chunks; b0 += kBatch) {
    int32_t v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      v[u] = b0 + u < chunks ? chunk_counts[static_cast<int64_t>(b0 + u) * experts + e] : 0;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (b0 + u < chunks) chunk_counts[static_cast<int64_t>(b0 + u) * experts + e] = running;
      running += v[u];
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    RankKernel(const int32_t* __restrict__ expert_ids, int64_t choices, int experts,
               const int32_t* __restrict__ chunk_starts, int32_t* __restrict__ slot_of_choice,
               int32_t* __restrict__ choice_of_slot) {
  // next[w][e]: the next slot of expert e for warp w's choices.
  __shared__ int32_t next[kWarps][kMaxRoutingExperts];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t warp_begin = static_cast<int64_t>(blockIdx.x) * kChunk + warp * kPerWarp;
  for (int i = threadIdx.x; i < kWarps * experts; i += kThreads) next[i / experts][i % experts] = 0;
  __syncthreads();
  int32_t ids[kSteps];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int64_t c = warp_begin + s * 32 + lane;
    ids[s] = c < choices ? expert_ids[c] : -1;
    if (ValidExpert(ids[s], experts)) atomicAdd(&next[warp][ids[s]], 1);
  }
  __syncthreads();
  // Exclusive prefix over the warps (choice order), offset by the chunk's first slot.
  for (int e = threadIdx.x; e < experts; e += kThreads) {
    int32_t running = chunk_starts[static_cast<int64_t>(blockIdx.x) * experts + e];
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const int32_t n = next[w][e];
      next[w][e] = running;
      running += n;
    }
  }
  __syncthreads();
  const unsigned lanes_below = (1u << lane) - 1u;
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int64_t c = warp_begin + s * 32 + lane;
    const bool valid = ValidExpert(ids[s], experts);
    // Invalid lanes share one key that no expert has.
    const unsigned peers = __match_any_sync(kFullMask, valid ? ids[s] : -1);
    int32_t slot = -1;
    if (valid) slot = next[warp][ids[s]] + __popc(peers & lanes_below);
    __syncwarp();
    if (valid && (peers & lanes_below) == 0) next[warp][ids[s]] += __popc(peers);
    __syncwarp();
    if (c < choices) {
      slot_of_choice[c] = slot;
      if (valid) choice_of_slot[slot] = static_cast<int32_t>(c);
    }
  }
}

}  // namespace

absl::Status BuildDispatchPlan(const DispatchPlanShape& shape, const int32_t* expert_ids,
                               const DispatchPlan& plan, void* workspace, Stream stream) {
  if (absl::Status s = ValidateDispatchPlanShape(shape); !s.ok()) return s;
  if (plan.expert_offsets == nullptr || workspace == nullptr) {
    return absl::InvalidArgumentError("expert_offsets and workspace must be set");
  }
  const int64_t choices = shape.num_tokens * shape.top_k;
  if (choices > 0 && (expert_ids == nullptr || plan.slot_of_choice == nullptr ||
                      plan.choice_of_slot == nullptr)) {
    return absl::InvalidArgumentError("expert_ids, slot_of_choice and choice_of_slot must be set");
  }
  const int chunks = static_cast<int>(std::max<int64_t>(1, (choices + kChunk - 1) / kChunk));
  auto* chunk_counts = static_cast<int32_t*>(workspace);
  CountKernel<<<chunks, kThreads, 0, stream>>>(expert_ids, choices, shape.num_experts, chunk_counts);
  if (absl::Status s = LaunchStatus("CountKernel"); !s.ok()) return s;
  ScanKernel<<<1, kMaxRoutingExperts, 0, stream>>>(chunk_counts, chunks, shape.num_experts,
                                                   plan.expert_offsets);
  if (absl::Status s = LaunchStatus("ScanKernel"); !s.ok()) return s;
  if (choices == 0) return absl::OkStatus();
  RankKernel<<<chunks, kThreads, 0, stream>>>(expert_ids, choices, shape.num_experts, chunk_counts,
                                              plan.slot_of_choice, plan.choice_of_slot);
  return LaunchStatus("RankKernel");
}

}  // namespace dropless::kernels::cuda
