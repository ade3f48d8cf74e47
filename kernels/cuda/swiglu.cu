// SwiGLU forward (bf16 and/or row-wise MXFP8 output) and backward (contracts: swiglu.h).
// One thread owns 8 consecutive output columns of a row; grid-stride over rows * F / 8.
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "dropless/kernels/swiglu.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.cuh"

namespace dropless::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 2;

__device__ __forceinline__ int64_t LiveRows(int64_t rows, const int32_t* num_rows) {
  return num_rows == nullptr ? rows : min(rows, static_cast<int64_t>(max(0, *num_rows)));
}

// Element vectors number fewer than 2^32 (checked by the launchers): 32-bit division is cheaper.
__device__ __forceinline__ int64_t RowOf(int64_t i, int64_t vecs_per_row) {
  return static_cast<uint32_t>(i) / static_cast<uint32_t>(vecs_per_row);
}

// Same fp32 formula as the CPU reference: silu(g) * u with silu(g) = g / (1 + exp(-g)).
__device__ __forceinline__ uint4 SwigluVec(uint4 gate, uint4 up) {
  float g[8], u[8], o[8];
  detail::Unpack8(gate, g);
  detail::Unpack8(up, u);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float silu = __fdiv_rn(g[e], __fadd_rn(1.0f, expf(-g[e])));
    o[e] = __fmul_rn(silu, u[e]);
  }
  return detail::Pack8(o);
}

template <bool kBf16Out, bool kMxOut>
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
        gate[u] = detail::LoadVecStreaming(h + row * 2 * vecs_per_row + c);
        up[u] = detail::LoadVecStreaming(h + row * 2 * vecs_per_row + vecs_per_row + c);
      } else {
        gate[u] = up[u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads + threadIdx.x;
      const uint4 o = SwigluVec(gate[u], up[u]);
      if (kBf16Out && i < total) out[i] = o;
      if (kMxOut) {
        const detail::MxQuad q = detail::QuantizeMxQuad(o);
        if (i < total) {
          mx_data[i] = q.data;
          if ((threadIdx.x & 3) == 0) mx_scales[i / 4] = static_cast<uint8_t>(q.scale);
        }
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    SwigluBackwardKernel(const uint4* __restrict__ h, const uint4* __restrict__ d_out, int64_t rows,
                         const int32_t* __restrict__ num_rows, int64_t vecs_per_row,
                         uint4* __restrict__ d_h) {
  const int64_t total = LiveRows(rows, num_rows) * vecs_per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t row = RowOf(i, vecs_per_row), c = i - row * vecs_per_row;
    const int64_t gate_at = row * 2 * vecs_per_row + c;
    float g[8], u[8], dy[8], dg[8], du[8];
    detail::Unpack8(detail::LoadVecStreaming(h + gate_at), g);
    detail::Unpack8(detail::LoadVecStreaming(h + gate_at + vecs_per_row), u);
    detail::Unpack8(detail::LoadVecStreaming(d_out + i), dy);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      // Same operation order as the CPU reference.
      const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g[e])));
      const float inner = __fadd_rn(1.0f, __fmul_rn(g[e], __fsub_rn(1.0f, s)));
      dg[e] = __fmul_rn(__fmul_rn(__fmul_rn(dy[e], u[e]), s), inner);
      du[e] = __fmul_rn(__fmul_rn(dy[e], g[e]), s);
    }
    d_h[gate_at] = detail::Pack8(dg);
    d_h[gate_at + vecs_per_row] = detail::Pack8(du);
  }
}

}  // namespace

absl::Status SwigluForward(const SwigluShape& shape, const int32_t* num_rows, const Bf16* h,
                           Bf16* out, const MxRowwise* out_mx, Stream stream) {
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
  const int64_t vecs = shape.ffn / 8;
  const int blocks = GridStrideBlocks(shape.rows * vecs, kThreads * kUnroll);
  const auto* hv = reinterpret_cast<const uint4*>(h);
  auto* ov = reinterpret_cast<uint4*>(out);
  auto* md = out_mx == nullptr ? nullptr : reinterpret_cast<uint2*>(out_mx->data);
  uint8_t* ms = out_mx == nullptr ? nullptr : out_mx->scales;
  if (out != nullptr && out_mx != nullptr) {
    SwigluForwardKernel<true, true><<<blocks, kThreads, 0, stream>>>(hv, shape.rows, num_rows, vecs, ov, md, ms);
  } else if (out != nullptr) {
    SwigluForwardKernel<true, false><<<blocks, kThreads, 0, stream>>>(hv, shape.rows, num_rows, vecs, ov, md, ms);
  } else {
    SwigluForwardKernel<false, true><<<blocks, kThreads, 0, stream>>>(hv, shape.rows, num_rows, vecs, ov, md, ms);
  }
  return LaunchStatus("SwigluForwardKernel");
}

absl::Status SwigluBackward(const SwigluShape& shape, const int32_t* num_rows, const Bf16* h,
                            const Bf16* d_out, Bf16* d_h, Stream stream) {
  if (absl::Status s = ValidateSwigluShape(shape, false); !s.ok()) return s;
  if (shape.rows == 0) return absl::OkStatus();
  if (h == nullptr || d_out == nullptr || d_h == nullptr) {
    return absl::InvalidArgumentError("h, d_out and d_h must be set");
  }
  if (shape.rows * (shape.ffn / 8) > 0xffffffffll) return absl::InvalidArgumentError("rows: too many");
  const int64_t vecs = shape.ffn / 8;
  SwigluBackwardKernel<<<GridStrideBlocks(shape.rows * vecs, kThreads), kThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(h), reinterpret_cast<const uint4*>(d_out), shape.rows,
      num_rows, vecs, reinterpret_cast<uint4*>(d_h));
  return LaunchStatus("SwigluBackwardKernel");
}

}  // namespace dropless::kernels::cuda
