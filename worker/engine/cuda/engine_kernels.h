// The CUDA engine's own small kernels: what sits between the kernel library's MoE parts (routing,
// permute, SwiGLU, grouped GEMMs) in a training step. All are memory-bound elementwise passes,
// queued on a stream, never synchronizing, capturable in a CUDA graph. Each has a host reference
// in the GPU tests (tests/gpu/engine/engine_kernels_gpu_test.cc) or is the CPU engine's own math
// (parameter fills and tokens: worker/engine/cpu/counter_rng.h, synthetic_task.h; AdamW:
// worker/engine/cpu/adamw.h).
#ifndef DROPLESS_WORKER_ENGINE_CUDA_ENGINE_KERNELS_H_
#define DROPLESS_WORKER_ENGINE_CUDA_ENGINE_KERNELS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "dropless/kernels/adamw.h"
#include "dropless/kernels/fp8_block.h"
#include "dropless/kernels/types.h"

namespace dropless::cuda_engine {

using kernels::Bf16;
using kernels::Stream;

// values[offset + i] = scale * NormalAt(stream, i) for i < count, into buffer 0 or 1
// (MoeParameterLayout::NormalFill). `fills` is a host array; it is copied to the device.
struct DeviceNormalFill {
  int32_t buffer;
  int64_t offset;
  uint64_t stream;
  int64_t count;
  double scale;
};
absl::Status FillNormal(const std::vector<DeviceNormalFill>& fills, float* buffer0, float* buffer1,
                        Stream stream);

// The synthetic task's tokens of step *step_counter + 1 (the step about to run):
// x[t][h] = sum_i NormalAt(MixSeed(MixSeed(seed, step), first_token + t), i) * basis[i][h], in
// fp64, rounded to bf16. basis: device [latent_rank][hidden] doubles.
struct TokenSource {
  uint64_t seed = 0;
  int64_t first_token = 0;
  int64_t tokens = 0;
  int64_t hidden = 0;
  int latent_rank = 0;
  const double* basis = nullptr;
  const int64_t* step_counter = nullptr;
};
absl::Status GenerateTokens(const TokenSource& source, Bf16* x, Stream stream);

// out[i] = sum of inputs[j][i] (fp32 sum in order j = 0, 1, ..., one rounding to bf16). Up to
// kMaxSumInputs inputs: the backward's residual sum has 3 + model.shared_experts of them; out may
// alias inputs[0].
inline constexpr int kMaxSumInputs = 3 + static_cast<int>(kMaxSharedExperts);
absl::Status SumBf16(int64_t n, const std::vector<const Bf16*>& inputs, Bf16* out, Stream stream);

// Mean squared error pieces: *squared_error += sum_i (out_i - target_i)^2 (fp64 atomics) and
// grad_i = bf16(grad_scale * (out_i - target_i)).
absl::Status SquaredErrorAndGrad(int64_t n, const Bf16* out, const Bf16* target, float grad_scale,
                                 double* squared_error, Bf16* grad, Stream stream);

// out[i] = bf16(in[i]).
absl::Status CastToBf16(int64_t n, const float* in, Bf16* out, Stream stream);
// out [cols][rows] = in [rows][cols]^T, for each of `batch` matrices (fp32 -> fp32, bf16 -> bf16).
absl::Status Transpose(int64_t batch, int64_t rows, int64_t cols, const float* in, float* out,
                       Stream stream);
absl::Status Transpose(int64_t batch, int64_t rows, int64_t cols, const Bf16* in, Bf16* out,
                       Stream stream);
// x[r][c] += bias[c] for r < rows (fp32).
absl::Status AddRowBias(int64_t rows, int64_t cols, const float* bias, float* x, Stream stream);

// *marker = value, by one thread, in stream order: the step graph's phase markers. `marker` is
// mapped pinned host memory, so the host reads where the GPU is while it waits for the step.
absl::Status WriteMarker(int32_t* marker, int32_t value, Stream stream);

// AdamW (worker/engine/cpu/adamw.h, same formula in fp32 with the step's scalars in fp64) over
// several tensors in one launch, their moments stored as the optimizer's moment_dtype. A tensor's
// gradient is fp32 or bf16 (widened to fp32 as read). Each tensor may also write a bf16 copy of its
// updated values, transposed when copy_rows > 0 (copy[c][r] = param[r][c] for a copy_rows x
// copy_cols tensor). The step number lives on the device (the counter is incremented by each Step),
// so a captured graph replays correctly step after step.
struct AdamWTensor {
  float* param = nullptr;
  // Exactly one of the two when n > 0: fp32, or bf16 (the routed experts' with
  // LayerDims::bf16_expert_grad).
  const float* grad = nullptr;
  const Bf16* grad_bf16 = nullptr;
  kernels::AdamWMoments moments;  // bf16 exactly when optimizer.moment_dtype is bf16
  int64_t n = 0;
  Bf16* bf16_copy = nullptr;
  int64_t copy_rows = 0;
  int64_t copy_cols = 0;
};

class FusedAdamW {
 public:
  // step_counter: device int64, the steps done so far (owned by the caller).
  static absl::StatusOr<std::unique_ptr<FusedAdamW>> Create(const OptimizerSpec& optimizer,
                                                            const std::vector<AdamWTensor>& tensors,
                                                            int64_t* step_counter);
  virtual ~FusedAdamW() = default;
  // Increments the step counter and computes the step's scalars (one single-thread launch); every
  // Update of the step must be ordered after it.
  virtual absl::Status PrepareStep(Stream stream) = 0;
  // Updates tensors [first, first + count) of the list given to Create (one launch), so that each
  // tensor's update can run as soon as its gradient is complete, beside other work.
  virtual absl::Status Update(int first, int count, Stream stream) = 0;
  // Updates tensor `tensor`, an [E][k][n] expert weight (shape; k, n multiples of 128, 16-byte
  // aligned, no transposed copy), fused with its fp8-block quantization into `out` for the next
  // step's fp8-block GEMMs: one launch, one block per 128x128 block, the same bits as Update then
  // QuantizeFp8BlockWeights of the bf16 copy. The bf16 copy itself is not written (the fp8-block
  // GEMMs read only the quantized forms), which saves 4 of the 34 bytes per parameter that the
  // two passes move. fp32 gradients only.
  virtual absl::Status UpdateFp8Block(int tensor, const kernels::Fp8BlockWeightShape& shape,
                                      const kernels::Fp8BlockWeights& out, Stream stream) = 0;
  // The step's scalars on the device, written by PrepareStep: for kernels that fuse a tensor's
  // update into what produces its gradient (kernels::GroupedWgradAdamW).
  virtual const kernels::AdamWStep* step_scalars() const = 0;
  // PrepareStep, then every tensor.
  absl::Status Step(Stream stream) {
    if (absl::Status s = PrepareStep(stream); !s.ok()) return s;
    return Update(0, num_tensors(), stream);
  }
  virtual int num_tensors() const = 0;
};

}  // namespace dropless::cuda_engine

#endif  // DROPLESS_WORKER_ENGINE_CUDA_ENGINE_KERNELS_H_
