// The CUDA engine's elementwise kernels (contracts: engine_kernels.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "dropless/kernels/adamw_update.h"
#include "kernels/cuda/cuda_check.h"
#include "worker/engine/cpu/counter_rng.h"
#include "worker/engine/cuda/engine_kernels.h"

namespace dropless::cuda_engine {
namespace {

using kernels::cuda::CudaStatus;
using kernels::cuda::GridStrideBlocks;
using kernels::cuda::LaunchStatus;

constexpr int kThreads = 256;

__device__ __forceinline__ float ToFloat(Bf16 v) {
  return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(&v));
}
__device__ __forceinline__ Bf16 ToBf16(float f) {
  __nv_bfloat16 b = __float2bfloat16_rn(f);
  return *reinterpret_cast<Bf16*>(&b);
}

__global__ void FillNormalKernel(const DeviceNormalFill* fills, float* buffer0, float* buffer1) {
  const DeviceNormalFill fill = fills[blockIdx.y];
  float* out = (fill.buffer == 0 ? buffer0 : buffer1) + fill.offset;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < fill.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<float>(fill.scale * cpu::NormalAt(fill.stream, static_cast<uint64_t>(i)));
  }
}

// One block per token: the latent values first (latent_rank draws), then the hidden row.
__global__ void GenerateTokensKernel(TokenSource source, Bf16* x) {
  __shared__ double latent[16];
  const int64_t t = blockIdx.x;
  const uint64_t step = static_cast<uint64_t>(*source.step_counter + 1);
  const uint64_t token_stream = cpu::MixSeed(cpu::MixSeed(source.seed, step),
                                             static_cast<uint64_t>(source.first_token + t));
  if (threadIdx.x < source.latent_rank) {
    latent[threadIdx.x] = cpu::NormalAt(token_stream, threadIdx.x);
  }
  __syncthreads();
  for (int64_t h = threadIdx.x; h < source.hidden; h += blockDim.x) {
    double v = 0;
    for (int i = 0; i < source.latent_rank; ++i) v += latent[i] * source.basis[i * source.hidden + h];
    x[t * source.hidden + h] = ToBf16(static_cast<float>(v));
  }
}

struct SumInputs {
  const Bf16* in[kMaxSumInputs];  // the first kInputs of SumKernel<kInputs> are read
};

// acc[e] += element e of eight bf16 values (16 bytes), in fp32.
__device__ __forceinline__ void AddBf16x8(const uint4& raw, float acc[8]) {
  const __nv_bfloat162* v = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 f = __bfloat1622float2(v[q]);
    acc[2 * q] += f.x;
    acc[2 * q + 1] += f.y;
  }
}

// Eight fp32 values rounded to bf16 (nearest even), packed into 16 bytes.
__device__ __forceinline__ uint4 PackBf16x8(const float acc[8]) {
  uint4 packed;
  __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
  for (int q = 0; q < 4; ++q) o[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
  return packed;
}

// out[i] = sum of the inputs' element i, added in fp32 in input order. Eight elements (16 bytes)
// per load when every pointer is 16-byte aligned, [vector_end, n) one by one. A thread issues the
// loads of all its inputs before adding (a loop over a runtime count waited on each load in turn:
// the kernel ran at ~1.7 TB/s).
template <int kInputs>
__global__ void SumKernel(int64_t n, int64_t vector_end, SumInputs inputs, Bf16* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t i = 8 * first; i < vector_end; i += 8 * stride) {
    uint4 raw[kInputs];
#pragma unroll
    for (int j = 0; j < kInputs; ++j) raw[j] = *reinterpret_cast<const uint4*>(inputs.in[j] + i);
    float acc[8] = {};
#pragma unroll
    for (int j = 0; j < kInputs; ++j) AddBf16x8(raw[j], acc);
    *reinterpret_cast<uint4*>(out + i) = PackBf16x8(acc);
  }
  for (int64_t i = vector_end + first; i < n; i += stride) {
    float acc = 0;
#pragma unroll
    for (int j = 0; j < kInputs; ++j) acc += ToFloat(inputs.in[j][i]);
    out[i] = ToBf16(acc);
  }
}

// SumKernel for more inputs than it has instances (shared experts beyond three): the same sums in
// the same order, the count read at run time, eight elements per thread and input in turn.
__global__ void SumKernelAnyCount(int64_t n, int64_t vector_end, int count, SumInputs inputs,
                                  Bf16* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t i = 8 * first; i < vector_end; i += 8 * stride) {
    float acc[8] = {};
    for (int j = 0; j < count; ++j)
      AddBf16x8(*reinterpret_cast<const uint4*>(inputs.in[j] + i), acc);
    *reinterpret_cast<uint4*>(out + i) = PackBf16x8(acc);
  }
  for (int64_t i = vector_end + first; i < n; i += stride) {
    float acc = 0;
    for (int j = 0; j < count; ++j) acc += ToFloat(inputs.in[j][i]);
    out[i] = ToBf16(acc);
  }
}

__global__ void SquaredErrorKernel(int64_t n, const Bf16* out, const Bf16* target, float grad_scale,
                                   double* squared_error, Bf16* grad) {
  double local = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float diff = ToFloat(out[i]) - ToFloat(target[i]);
    local += static_cast<double>(diff) * diff;
    grad[i] = ToBf16(grad_scale * diff);
  }
  for (int offset = 16; offset > 0; offset /= 2) local += __shfl_down_sync(0xffffffffu, local, offset);
  __shared__ double warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = local;
  __syncthreads();
  if (threadIdx.x == 0) {
    double block = 0;
    for (int w = 0; w < kThreads / 32; ++w) block += warp_sums[w];
    atomicAdd(squared_error, block);
  }
}

__global__ void CastKernel(int64_t n, const float* in, Bf16* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = ToBf16(in[i]);
  }
}

// 32 x 32 tiles through shared memory; blockIdx.z is the matrix of the batch.
template <typename T>
__global__ void TransposeKernel(int64_t rows, int64_t cols, const T* in, T* out) {
  __shared__ T tile[32][33];
  const int64_t matrix = static_cast<int64_t>(blockIdx.z) * rows * cols;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * 32, c0 = static_cast<int64_t>(blockIdx.x) * 32;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = in[matrix + r * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) out[matrix + c * rows + r] = tile[threadIdx.x][i];
  }
}

__global__ void WriteMarkerKernel(int32_t* marker, int32_t value) {
  *reinterpret_cast<volatile int32_t*>(marker) = value;
  __threadfence_system();
}

__global__ void AddRowBiasKernel(int64_t rows, int64_t cols, const float* bias, float* x) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] += bias[i % cols];
  }
}

template <typename T>
absl::Status LaunchTranspose(int64_t batch, int64_t rows, int64_t cols, const T* in, T* out,
                             Stream stream) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return absl::OkStatus();
  if (batch > 65535 || (rows + 31) / 32 > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Transpose: %d matrices of %d rows exceed the grid", batch, rows));
  }
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((rows + 31) / 32),
                  static_cast<unsigned>(batch));
  TransposeKernel<T><<<grid, dim3(32, 8), 0, stream>>>(rows, cols, in, out);
  return LaunchStatus("TransposeKernel");
}

// ---- AdamW ----

using kernels::AdamWElement;
using kernels::AdamWStep;
using kernels::AdamWUpdateFour;
using kernels::LoadFloat;
using kernels::StoreMoments;

struct AdamWHyper {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t warmup_steps;
};

// One thread: the step's scalars, in fp64 as the CPU engine computes them (adamw.cc).
__global__ void AdamWStepKernel(AdamWHyper hyper, int64_t* step_counter, AdamWStep* out) {
  const int64_t step = ++*step_counter;
  const double t = static_cast<double>(step);
  const double lr = hyper.warmup_steps <= 0
                        ? hyper.lr
                        : hyper.lr * fmin(1.0, t / static_cast<double>(hyper.warmup_steps));
  out->beta1 = static_cast<float>(hyper.beta1);
  out->beta2 = static_cast<float>(hyper.beta2);
  out->eps = static_cast<float>(hyper.eps);
  out->decay = static_cast<float>(1.0 - lr * hyper.weight_decay);
  out->step_size = static_cast<float>(lr);
  out->m_correction = static_cast<float>(1.0 / (1.0 - pow(hyper.beta1, t)));
  out->v_correction = static_cast<float>(1.0 / (1.0 - pow(hyper.beta2, t)));
  out->step = step;
}

constexpr int64_t kAdamWChunk = 16384;  // elements per block

struct AdamWChunk {
  int32_t tensor;
  int64_t begin;
};

// Elements [begin, end) of tensor t, whose gradient `grad` has elements G (float, or
// __nv_bfloat16 widened to fp32); M: the moments' element type. With a plain bf16 copy (or none)
// and aligned pointers four values per thread with vector loads and stores (a bf16 gradient's four
// in one 8-byte load); the others (a transposed copy, unaligned) take the scalar loop.
template <typename M, typename G>
__device__ __forceinline__ void AdamWRange(const AdamWStep& s, const AdamWTensor& t, const G* grad,
                                           int64_t begin, int64_t end) {
  const M* const m_state = static_cast<const M*>(t.moments.m);
  const M* const v_state = static_cast<const M*>(t.moments.v);
  const bool vector =
      t.copy_rows == 0 && begin % 4 == 0 && reinterpret_cast<uintptr_t>(t.param) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(grad) % (4 * sizeof(G)) == 0 &&
      ((reinterpret_cast<uintptr_t>(m_state) | reinterpret_cast<uintptr_t>(v_state)) %
       (4 * sizeof(M))) == 0 &&
      reinterpret_cast<uintptr_t>(t.bf16_copy) % 8 == 0;
  int64_t scalar_begin = begin;
  if (vector) {
    const int64_t vector_end = begin + (end - begin) / 4 * 4;
    for (int64_t i = begin + 4 * static_cast<int64_t>(threadIdx.x); i < vector_end;
         i += 4 * static_cast<int64_t>(blockDim.x)) {
      const uint2 packed = AdamWUpdateFour<M>(s, i, grad, t.param, t.moments);
      if (t.bf16_copy != nullptr) *reinterpret_cast<uint2*>(t.bf16_copy + i) = packed;
    }
    scalar_begin = vector_end;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < end; i += blockDim.x) {
    const float g = LoadFloat(grad, i);
    float m = LoadFloat(m_state, i), v = LoadFloat(v_state, i);
    const float p = AdamWElement(s, g, m, v, t.param[i]);
    StoreMoments<M>(s, t.moments, i, m, v);
    t.param[i] = p;
    if (t.bf16_copy != nullptr) {
      if (t.copy_rows > 0) {
        const int64_t r = i / t.copy_cols, c = i % t.copy_cols;
        t.bf16_copy[c * t.copy_rows + r] = ToBf16(p);
      } else {
        t.bf16_copy[i] = ToBf16(p);
      }
    }
  }
}

// One block per chunk of one tensor; M: the moments' element type (every tensor of the launch has
// the job's moment_dtype). Memory-bound (30 bytes per parameter with an fp32 gradient, the bf16
// copy and fp32 moments, 22 with bf16 moments; 2 fewer with a bf16 gradient).
template <typename M>
__global__ void AdamWKernel(const AdamWTensor* tensors, const AdamWChunk* chunks,
                            const AdamWStep* scalars_ptr) {
  const AdamWStep s = *scalars_ptr;
  const AdamWChunk chunk = chunks[blockIdx.x];
  const AdamWTensor t = tensors[chunk.tensor];
  const int64_t end = min(chunk.begin + kAdamWChunk, t.n);
  if (t.grad_bf16 != nullptr) {
    AdamWRange<M>(s, t, reinterpret_cast<const __nv_bfloat16*>(t.grad_bf16), chunk.begin, end);
  } else {
    AdamWRange<M>(s, t, t.grad, chunk.begin, end);
  }
}

class FusedAdamWImpl final : public FusedAdamW {
 public:
  ~FusedAdamWImpl() override {
    // Teardown: a destructor has no caller to report a failed release to.
    (void)cudaFree(tensors_);
    (void)cudaFree(chunks_);
    (void)cudaFree(scalars_);
  }

  absl::Status Init(const OptimizerSpec& optimizer, const std::vector<AdamWTensor>& tensors,
                    int64_t* step_counter) {
    hyper_ = AdamWHyper{optimizer.lr, optimizer.beta1, optimizer.beta2, optimizer.eps,
                        optimizer.weight_decay, optimizer.warmup_steps};
    bf16_moments_ = optimizer.moment_dtype == MomentDtype::kBf16;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].moments.bf16 != bf16_moments_) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "FusedAdamW: tensor %d has %s moments, optimizer.moment_dtype is %s", i,
            tensors[i].moments.bf16 ? "bf16" : "fp32", bf16_moments_ ? "bf16" : "fp32"));
      }
    }
    host_tensors_ = tensors;
    step_counter_ = step_counter;
    std::vector<AdamWChunk> chunks;
    for (size_t i = 0; i < tensors.size(); ++i) {
      first_chunk_.push_back(static_cast<int64_t>(chunks.size()));
      for (int64_t begin = 0; begin < tensors[i].n; begin += kAdamWChunk) {
        chunks.push_back(AdamWChunk{static_cast<int32_t>(i), begin});
      }
    }
    first_chunk_.push_back(static_cast<int64_t>(chunks.size()));
    num_chunks_ = static_cast<int64_t>(chunks.size());
    if (num_chunks_ > (int64_t{1} << 31) - 1) {
      return absl::InvalidArgumentError("FusedAdamW: too many parameters for one launch");
    }
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMalloc(&tensors_, sizeof(AdamWTensor) * std::max<size_t>(1, tensors.size())));
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMalloc(&chunks_, sizeof(AdamWChunk) * std::max<int64_t>(1, num_chunks_)));
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMalloc(&scalars_, sizeof(AdamWStep)));
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemcpy(tensors_, tensors.data(),
                                             sizeof(AdamWTensor) * tensors.size(),
                                             cudaMemcpyHostToDevice));
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMemcpy(chunks_, chunks.data(),
                                             sizeof(AdamWChunk) * chunks.size(),
                                             cudaMemcpyHostToDevice));
    return absl::OkStatus();
  }

  absl::Status PrepareStep(Stream stream) override {
    AdamWStepKernel<<<1, 1, 0, stream>>>(hyper_, step_counter_, scalars_);
    return LaunchStatus("AdamWStepKernel");
  }

  absl::Status Update(int first, int count, Stream stream) override {
    if (first < 0 || count < 0 || first + count > num_tensors()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "FusedAdamW::Update: tensors [%d, %d) of %d", first, first + count, num_tensors()));
    }
    const int64_t begin = first_chunk_[first], end = first_chunk_[first + count];
    if (end == begin) return absl::OkStatus();
    auto kernel = bf16_moments_ ? AdamWKernel<__nv_bfloat16> : AdamWKernel<float>;
    kernel<<<static_cast<unsigned>(end - begin), 512, 0, stream>>>(tensors_, chunks_ + begin,
                                                                   scalars_);
    return LaunchStatus("AdamWKernel");
  }

  absl::Status UpdateFp8Block(int tensor, const kernels::Fp8BlockWeightShape& shape,
                              const kernels::Fp8BlockWeights& out, Stream stream) override {
    if (tensor < 0 || tensor >= num_tensors()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "FusedAdamW::UpdateFp8Block: tensor %d of %d", tensor, num_tensors()));
    }
    const AdamWTensor& t = host_tensors_[tensor];
    if (t.n != int64_t{shape.num_experts} * shape.k * shape.n || t.copy_rows != 0 ||
        t.grad == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "FusedAdamW::UpdateFp8Block: tensor %d (%d values) is not a [%d][%d][%d] weight "
          "with an fp32 gradient and without a transposed copy",
          tensor, t.n, shape.num_experts, shape.k, shape.n));
    }
    return kernels::cuda::AdamWQuantizeFp8BlockWeights(shape, scalars_, t.grad, t.param, t.moments,
                                                       out, stream);
  }

  int num_tensors() const override { return static_cast<int>(first_chunk_.size()) - 1; }
  const kernels::AdamWStep* step_scalars() const override { return scalars_; }

 private:
  AdamWHyper hyper_{};
  bool bf16_moments_ = false;
  int64_t* step_counter_ = nullptr;
  AdamWTensor* tensors_ = nullptr;
  AdamWChunk* chunks_ = nullptr;
  AdamWStep* scalars_ = nullptr;
  int64_t num_chunks_ = 0;
  std::vector<int64_t> first_chunk_;  // per tensor, and the total at the end
  std::vector<AdamWTensor> host_tensors_;
};

}  // namespace

absl::Status FillNormal(const std::vector<DeviceNormalFill>& fills, float* buffer0, float* buffer1,
                        Stream stream) {
  if (fills.empty()) return absl::OkStatus();
  DeviceNormalFill* device = nullptr;
  DROPLESS_CUDA_RETURN_IF_ERROR(cudaMalloc(&device, sizeof(DeviceNormalFill) * fills.size()));
  absl::Status status = CudaStatus(
      cudaMemcpyAsync(device, fills.data(), sizeof(DeviceNormalFill) * fills.size(),
                      cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync(fills)");
  for (size_t first = 0; status.ok() && first < fills.size(); first += 65535) {
    const size_t count = std::min<size_t>(65535, fills.size() - first);
    int64_t longest = 0;
    for (size_t i = first; i < first + count; ++i) longest = std::max(longest, fills[i].count);
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(1024, (longest + kThreads - 1) / kThreads)),
                    static_cast<unsigned>(count));
    FillNormalKernel<<<grid, kThreads, 0, stream>>>(device + first, buffer0, buffer1);
    status.Update(LaunchStatus("FillNormalKernel"));
  }
  if (status.ok()) status.Update(CudaStatus(cudaStreamSynchronize(stream), "FillNormal"));
  (void)cudaFree(device);  // the fill's status is the one to report
  return status;
}

absl::Status GenerateTokens(const TokenSource& source, Bf16* x, Stream stream) {
  if (source.latent_rank < 1 || source.latent_rank > 16) {
    return absl::InvalidArgumentError("GenerateTokens: latent_rank must be in [1, 16]");
  }
  if (source.tokens <= 0) return absl::OkStatus();
  GenerateTokensKernel<<<static_cast<unsigned>(source.tokens), kThreads, 0, stream>>>(source, x);
  return LaunchStatus("GenerateTokensKernel");
}

absl::Status SumBf16(int64_t n, const std::vector<const Bf16*>& inputs, Bf16* out, Stream stream) {
  if (inputs.empty() || inputs.size() > static_cast<size_t>(kMaxSumInputs)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SumBf16: 1 to %d inputs (got %d)", kMaxSumInputs, inputs.size()));
  }
  if (n <= 0) return absl::OkStatus();
  SumInputs args{};
  uintptr_t addresses = reinterpret_cast<uintptr_t>(out);
  for (size_t j = 0; j < inputs.size(); ++j) {
    args.in[j] = inputs[j];
    addresses |= reinterpret_cast<uintptr_t>(inputs[j]);
  }
  const int64_t vector_end = addresses % 16 == 0 ? n / 8 * 8 : 0;
  const int blocks = GridStrideBlocks(std::max<int64_t>(n / 8, 1), kThreads);
  switch (inputs.size()) {
    case 1: SumKernel<1><<<blocks, kThreads, 0, stream>>>(n, vector_end, args, out); break;
    case 2: SumKernel<2><<<blocks, kThreads, 0, stream>>>(n, vector_end, args, out); break;
    case 3: SumKernel<3><<<blocks, kThreads, 0, stream>>>(n, vector_end, args, out); break;
    case 4: SumKernel<4><<<blocks, kThreads, 0, stream>>>(n, vector_end, args, out); break;
    case 5: SumKernel<5><<<blocks, kThreads, 0, stream>>>(n, vector_end, args, out); break;
    case 6:
      SumKernel<6><<<blocks, kThreads, 0, stream>>>(n, vector_end, args, out);
      break;
    default:
      SumKernelAnyCount<<<blocks, kThreads, 0, stream>>>(
          n, vector_end, static_cast<int>(inputs.size()), args, out);
      return LaunchStatus("SumKernelAnyCount");
  }
  return LaunchStatus("SumKernel");
}

absl::Status SquaredErrorAndGrad(int64_t n, const Bf16* out, const Bf16* target, float grad_scale,
                                 double* squared_error, Bf16* grad, Stream stream) {
  if (n <= 0) return absl::OkStatus();
  SquaredErrorKernel<<<GridStrideBlocks(n, kThreads * 8), kThreads, 0, stream>>>(
      n, out, target, grad_scale, squared_error, grad);
  return LaunchStatus("SquaredErrorKernel");
}

absl::Status CastToBf16(int64_t n, const float* in, Bf16* out, Stream stream) {
  if (n <= 0) return absl::OkStatus();
  CastKernel<<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(n, in, out);
  return LaunchStatus("CastKernel");
}

absl::Status Transpose(int64_t batch, int64_t rows, int64_t cols, const float* in, float* out,
                       Stream stream) {
  return LaunchTranspose<float>(batch, rows, cols, in, out, stream);
}

absl::Status Transpose(int64_t batch, int64_t rows, int64_t cols, const Bf16* in, Bf16* out,
                       Stream stream) {
  return LaunchTranspose<Bf16>(batch, rows, cols, in, out, stream);
}

absl::Status WriteMarker(int32_t* marker, int32_t value, Stream stream) {
  WriteMarkerKernel<<<1, 1, 0, stream>>>(marker, value);
  return LaunchStatus("WriteMarkerKernel");
}

absl::Status AddRowBias(int64_t rows, int64_t cols, const float* bias, float* x, Stream stream) {
  if (rows <= 0 || cols <= 0) return absl::OkStatus();
  AddRowBiasKernel<<<GridStrideBlocks(rows * cols, kThreads), kThreads, 0, stream>>>(rows, cols,
                                                                                      bias, x);
  return LaunchStatus("AddRowBiasKernel");
}

absl::StatusOr<std::unique_ptr<FusedAdamW>> FusedAdamW::Create(
    const OptimizerSpec& optimizer, const std::vector<AdamWTensor>& tensors, int64_t* step_counter) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamWTensor& t = tensors[i];
    const bool one_grad = (t.grad != nullptr) != (t.grad_bf16 != nullptr);
    if (t.n < 0 || (t.n > 0 && (!t.param || !one_grad || !t.moments.m || !t.moments.v)) ||
        (t.copy_rows > 0 && t.copy_rows * t.copy_cols != t.n)) {
      return absl::InvalidArgumentError(absl::StrFormat("FusedAdamW: tensor %d is malformed", i));
    }
  }
  auto adamw = std::make_unique<FusedAdamWImpl>();
  if (absl::Status s = adamw->Init(optimizer, tensors, step_counter); !s.ok()) return s;
  return std::unique_ptr<FusedAdamW>(std::move(adamw));
}

}  // namespace dropless::cuda_engine
