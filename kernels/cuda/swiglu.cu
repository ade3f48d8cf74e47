// SwiGLU forward (bf16 and/or row-wise MXFP8 output) and backward (contracts: swiglu.h).
// Memory-bound: fast exp and division keep the arithmetic under the memory time; outputs are
// written with evict-first stores (nothing reads them back in the kernel).
// One thread owns 8 consecutive output columns of a row; grid-stride over rows * F / 8.
#include <cuda_runtime.h>

#include <algorithm>

#include "absl/status/status.h"
#include "dropless/kernels/swiglu.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.cuh"

namespace dropless::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Tuning knobs; every combination measured on an H200 lands within about 2% of the others
// (docs/kernels.md), so these are not what holds SwiGLU below the copy bandwidth.
struct SwigluConfig {
  int unroll;         // vectors per thread per pass (2 or 4)
  bool prefetch_256;  // loads with the 256-byte L2 prefetch hint
  bool resident;      // grid = blocks resident at once (else 16 per multiprocessor)
};
constexpr SwigluConfig kDefaultConfig{4, false, false};  // H200 pick (docs/kernels.md)

__device__ __forceinline__ int64_t LiveRows(int64_t rows, const int32_t* num_rows) {
  return num_rows == nullptr ? rows : min(rows, static_cast<int64_t>(max(0, *num_rows)));
}

// Element vectors number fewer than 2^32 (checked by the launchers): 32-bit division is cheaper.
__device__ __forceinline__ int64_t RowOf(int64_t i, int64_t vecs_per_row) {
  return static_cast<uint32_t>(i) / static_cast<uint32_t>(vecs_per_row);
}

template <bool kPrefetch256>
__device__ __forceinline__ uint4 Load(const uint4* p) {
  if constexpr (kPrefetch256) {
    return detail::LoadVecStreaming256(p);
  } else {
    return detail::LoadVecStreaming(p);
  }
}

// silu(g) * u with the fast exp and division (a few fp32 ulps from the CPU reference's exact
// formula g / (1 + exp(-g)); the tests bound the difference at one bf16 ulp). The exact forms cost
// more issue slots than the memory system leaves per element.
__device__ __forceinline__ float Sigmoid(float g) { return __fdividef(1.0f, 1.0f + __expf(-g)); }

__device__ __forceinline__ uint4 SwigluVec(uint4 gate, uint4 up) {
  float g[8], u[8], o[8];
  detail::Unpack8(gate, g);
  detail::Unpack8(up, u);
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = __fdividef(g[e], 1.0f + __expf(-g[e])) * u[e];
  return detail::Pack8(o);
}

template <bool kBf16Out, bool kMxOut, int kUnroll, bool kPrefetch256>
__global__ void __launch_bounds__(kThreads)
    SwigluForwardKernel(const uint4* __restrict__ h, int64_t rows, const int32_t* __restrict__ num_rows,
                        int64_t vecs_per_row, uint4* __restrict__ out, uint2* __restrict__ mx_data,
                        uint8_t* __restrict__ mx_scales) {
  const int64_t total = LiveRows(rows, num_rows) * vecs_per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads * kUnroll;
  // Block-uniform loop so every lane reaches the MX quad shuffles; vecs_per_row % 4 == 0 keeps a
  // quad's lanes valid or invalid together.
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll; base < total;
       base += stride) {
    uint4 gate[kUnroll], up[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads + threadIdx.x;
      if (i < total) {
        const int64_t row = RowOf(i, vecs_per_row), c = i - row * vecs_per_row;
        gate[u] = Load<kPrefetch256>(h + row * 2 * vecs_per_row + c);
        up[u] = Load<kPrefetch256>(h + row * 2 * vecs_per_row + vecs_per_row + c);
      } else {
        gate[u] = up[u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads + threadIdx.x;
      const uint4 o = SwigluVec(gate[u], up[u]);
      if (kBf16Out && i < total) __stcs(out + i, o);
      if (kMxOut) {
        const detail::MxQuad q = detail::QuantizeMxQuad(o);
        if (i < total) {
          __stcs(mx_data + i, q.data);
          if ((threadIdx.x & 3) == 0) mx_scales[i / 4] = static_cast<uint8_t>(q.scale);
        }
      }
    }
  }
}

template <int kUnroll, bool kPrefetch256>
__global__ void __launch_bounds__(kThreads)
    SwigluBackwardKernel(const uint4* __restrict__ h, const uint4* __restrict__ d_out, int64_t rows,
                         const int32_t* __restrict__ num_rows, int64_t vecs_per_row,
                         uint4* __restrict__ d_h) {
  const int64_t total = LiveRows(rows, num_rows) * vecs_per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads * kUnroll;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll; base < total;
       base += stride) {
    uint4 gate[kUnroll], up[kUnroll], dy[kUnroll];
    int64_t gate_at[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads + threadIdx.x;
      const int64_t row = RowOf(i, vecs_per_row);
      gate_at[u] = row * 2 * vecs_per_row + (i - row * vecs_per_row);
      if (i < total) {
        gate[u] = Load<kPrefetch256>(h + gate_at[u]);
        up[u] = Load<kPrefetch256>(h + gate_at[u] + vecs_per_row);
        dy[u] = Load<kPrefetch256>(d_out + i);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads + threadIdx.x;
      if (i >= total) continue;
      float g[8], up_f[8], dy_f[8], dg[8], du[8];
      detail::Unpack8(gate[u], g);
      detail::Unpack8(up[u], up_f);
      detail::Unpack8(dy[u], dy_f);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float s = Sigmoid(g[e]);
        dg[e] = dy_f[e] * up_f[e] * s * (1.0f + g[e] * (1.0f - s));
        du[e] = dy_f[e] * g[e] * s;
      }
      __stcs(d_h + gate_at[u], detail::Pack8(dg));
      __stcs(d_h + gate_at[u] + vecs_per_row, detail::Pack8(du));
    }
  }
}

// `resident`: blocks of the kernel that fit on the device at once (0 if unknown).
int Blocks(const SwigluConfig& config, int resident, int64_t vecs) {
  const int64_t per_block = int64_t{kThreads} * config.unroll;
  if (!config.resident || resident <= 0) return GridStrideBlocks(vecs, per_block);
  const int64_t needed = (vecs + per_block - 1) / per_block;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(needed, resident)));
}

template <bool kBf16Out, bool kMxOut, int kUnroll, bool kPrefetch256>
absl::Status LaunchForward(const SwigluConfig& config, const SwigluShape& shape,
                           const int32_t* num_rows, const Bf16* h, Bf16* out, const MxRowwise* out_mx,
                           Stream stream) {
  const int64_t vecs = shape.ffn / 8;
  auto kernel = SwigluForwardKernel<kBf16Out, kMxOut, kUnroll, kPrefetch256>;
  static const int resident = detail::ResidentBlocks(kernel, kThreads, 0);  // once per instance
  kernel<<<Blocks(config, resident, shape.rows * vecs), kThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(h), shape.rows, num_rows, vecs, reinterpret_cast<uint4*>(out),
      out_mx == nullptr ? nullptr : reinterpret_cast<uint2*>(out_mx->data),
      out_mx == nullptr ? nullptr : out_mx->scales);
  return LaunchStatus("SwigluForwardKernel");
}

template <bool kBf16Out, bool kMxOut>
absl::Status DispatchForward(const SwigluConfig& config, const SwigluShape& shape,
                             const int32_t* num_rows, const Bf16* h, Bf16* out,
                             const MxRowwise* out_mx, Stream stream) {
  if (config.unroll == 4) {
    return config.prefetch_256
               ? LaunchForward<kBf16Out, kMxOut, 4, true>(config, shape, num_rows, h, out, out_mx, stream)
               : LaunchForward<kBf16Out, kMxOut, 4, false>(config, shape, num_rows, h, out, out_mx, stream);
  }
  return config.prefetch_256
             ? LaunchForward<kBf16Out, kMxOut, 2, true>(config, shape, num_rows, h, out, out_mx, stream)
             : LaunchForward<kBf16Out, kMxOut, 2, false>(config, shape, num_rows, h, out, out_mx, stream);
}

absl::Status Forward(const SwigluConfig& config, const SwigluShape& shape, const int32_t* num_rows,
                     const Bf16* h, Bf16* out, const MxRowwise* out_mx, Stream stream) {
  if (absl::Status s = ValidateSwigluShape(shape, out_mx != nullptr); !s.ok()) return s;
  if (out == nullptr && out_mx == nullptr) {
    return absl::InvalidArgumentError("out: and out_mx are both null: nothing to produce");
  }
  if (out_mx != nullptr && (out_mx->data == nullptr || out_mx->scales == nullptr)) {
    return absl::InvalidArgumentError("out_mx: data and scales must be set");
  }
  if (shape.rows == 0) return absl::OkStatus();
  if (h == nullptr) return absl::InvalidArgumentError("h: is null");
  if (shape.rows * (shape.ffn / 8) > 0xffffffffll) return absl::InvalidArgumentError("rows: too many");
  if (out != nullptr && out_mx != nullptr) {
    return DispatchForward<true, true>(config, shape, num_rows, h, out, out_mx, stream);
  }
  if (out != nullptr) return DispatchForward<true, false>(config, shape, num_rows, h, out, out_mx, stream);
  return DispatchForward<false, true>(config, shape, num_rows, h, out, out_mx, stream);
}

template <int kUnroll, bool kPrefetch256>
absl::Status LaunchBackward(const SwigluConfig& config, const SwigluShape& shape,
                            const int32_t* num_rows, const Bf16* h, const Bf16* d_out, Bf16* d_h,
                            Stream stream) {
  const int64_t vecs = shape.ffn / 8;
  auto kernel = SwigluBackwardKernel<kUnroll, kPrefetch256>;
  static const int resident = detail::ResidentBlocks(kernel, kThreads, 0);  // once per instance
  kernel<<<Blocks(config, resident, shape.rows * vecs), kThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(h), reinterpret_cast<const uint4*>(d_out), shape.rows,
      num_rows, vecs, reinterpret_cast<uint4*>(d_h));
  return LaunchStatus("SwigluBackwardKernel");
}

absl::Status Backward(const SwigluConfig& config, const SwigluShape& shape, const int32_t* num_rows,
                      const Bf16* h, const Bf16* d_out, Bf16* d_h, Stream stream) {
  if (absl::Status s = ValidateSwigluShape(shape, false); !s.ok()) return s;
  if (shape.rows == 0) return absl::OkStatus();
  if (h == nullptr || d_out == nullptr || d_h == nullptr) {
    return absl::InvalidArgumentError("h, d_out and d_h must be set");
  }
  if (shape.rows * (shape.ffn / 8) > 0xffffffffll) return absl::InvalidArgumentError("rows: too many");
  if (config.unroll == 4) {
    return config.prefetch_256 ? LaunchBackward<4, true>(config, shape, num_rows, h, d_out, d_h, stream)
                               : LaunchBackward<4, false>(config, shape, num_rows, h, d_out, d_h, stream);
  }
  return config.prefetch_256 ? LaunchBackward<2, true>(config, shape, num_rows, h, d_out, d_h, stream)
                             : LaunchBackward<2, false>(config, shape, num_rows, h, d_out, d_h, stream);
}

}  // namespace

absl::Status SwigluForward(const SwigluShape& shape, const int32_t* num_rows, const Bf16* h,
                           Bf16* out, const MxRowwise* out_mx, Stream stream) {
  return Forward(kDefaultConfig, shape, num_rows, h, out, out_mx, stream);
}

absl::Status SwigluBackward(const SwigluShape& shape, const int32_t* num_rows, const Bf16* h,
                            const Bf16* d_out, Bf16* d_h, Stream stream) {
  return Backward(kDefaultConfig, shape, num_rows, h, d_out, d_h, stream);
}

}  // namespace dropless::kernels::cuda
