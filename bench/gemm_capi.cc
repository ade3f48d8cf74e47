// libdropless_gemm_capi.so: a C entry point to the grouped GEMMs (bf16 GroupedGemm,
// MxGroupedGemm and Fp8BlockGroupedGemm) for bench/peers/interleaved_gemm.py, which times them and torch's grouped GEMMs
// in one process, alternating round by round, so both see the same GPU clock and temperature (an
// H200's clock moves by 15-20% between an idle start and a few seconds of sustained GEMMs, which
// two processes run one after the other do not share). Benchmark-only: not part of the runtime.
//
// Every pointer is a device pointer (a torch tensor's data_ptr()); `stream` is a cudaStream_t or 0.
// Functions return 0 on success; on failure, non-zero and the message in dl_last_error().
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "dropless/kernels/fp8_block_grouped_gemm.h"
#include "dropless/kernels/grouped_gemm.h"
#include "dropless/kernels/mx_grouped_gemm.h"
#include "dropless/kernels/mxfp8.h"

namespace {

namespace k = ::dropless::kernels;

thread_local std::string last_error;

int Report(const absl::Status& status) {
  if (status.ok()) return 0;
  last_error = status.ToString();
  return 1;
}

struct Bf16Gemm {
  std::unique_ptr<k::GroupedGemm> gemm;
  bool fp32_wgrad = false;
  std::string names[3];
};

struct MxGemm {
  std::unique_ptr<k::MxGroupedGemm> gemm;
  std::string name;
  std::string core_name;
};

struct Fp8BlockGemm {
  std::unique_ptr<k::Fp8BlockGroupedGemm> gemm;
  std::string name;
};

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }
const __nv_bfloat16* Bf16In(const void* p) { return static_cast<const __nv_bfloat16*>(p); }
const uint8_t* Bytes(const void* p) { return static_cast<const uint8_t*>(p); }
k::Fp8BlockOperand Fp8Block(const void* data, const void* scales) {
  return {Bytes(data), static_cast<const float*>(scales)};
}

}  // namespace

extern "C" {

const char* dl_last_error() { return last_error.c_str(); }

// bf16 grouped GEMM over `experts` groups, W[e] of k x n; the weight gradient is fp32 when
// fp32_wgrad, else bf16. Each kernel name (null or "": the default) forces that product's kernel.
void* dl_gemm_create(int experts, int k, int n, int64_t max_rows, int64_t expected_rows,
                     int fp32_wgrad, const char* fwd_kernel, const char* dgrad_kernel,
                     const char* wgrad_kernel) {
  k::GroupedGemmOptions options;
  options.num_groups = experts;
  options.k = k;
  options.n = n;
  options.max_rows = max_rows;
  options.expected_rows_per_group = expected_rows;
  options.weight_grad_type = fp32_wgrad ? k::GradType::kFloat32 : k::GradType::kBFloat16;
  if (fwd_kernel != nullptr) options.forward_kernel = fwd_kernel;
  if (dgrad_kernel != nullptr) options.backward_data_kernel = dgrad_kernel;
  if (wgrad_kernel != nullptr) options.backward_weight_kernel = wgrad_kernel;
  absl::StatusOr<std::unique_ptr<k::GroupedGemm>> gemm = k::GroupedGemm::Create(options);
  if (!gemm.ok()) {
    Report(gemm.status());
    return nullptr;
  }
  auto* h = new Bf16Gemm{std::move(*gemm), fp32_wgrad != 0, {}};
  h->names[0] = h->gemm->KernelName(k::GroupedGemmOp::kForward);
  h->names[1] = h->gemm->KernelName(k::GroupedGemmOp::kBackwardData);
  h->names[2] = h->gemm->KernelName(k::GroupedGemmOp::kBackwardWeight);
  return h;
}

// op: 0 forward, 1 data gradient, 2 weight gradient.
const char* dl_gemm_kernel(void* handle, int op) {
  return op >= 0 && op < 3 ? static_cast<Bf16Gemm*>(handle)->names[op].c_str() : "";
}

int dl_gemm_forward(void* handle, const void* x, const void* w, const void* offsets, void* y,
                    void* stream) {
  return Report(static_cast<Bf16Gemm*>(handle)->gemm->Forward(
      Bf16In(x), Bf16In(w), static_cast<const int32_t*>(offsets), static_cast<__nv_bfloat16*>(y),
      AsStream(stream)));
}

int dl_gemm_backward_data(void* handle, const void* dy, const void* w, const void* offsets,
                          void* dx, void* stream) {
  return Report(static_cast<Bf16Gemm*>(handle)->gemm->BackwardData(
      Bf16In(dy), Bf16In(w), static_cast<const int32_t*>(offsets),
      static_cast<__nv_bfloat16*>(dx), AsStream(stream)));
}

// dw is fp32 or bf16 as chosen at creation.
int dl_gemm_backward_weight(void* handle, const void* x, const void* dy, const void* offsets,
                            void* dw, void* stream) {
  auto* h = static_cast<Bf16Gemm*>(handle);
  const auto* off = static_cast<const int32_t*>(offsets);
  return Report(h->fp32_wgrad ? h->gemm->BackwardWeight(Bf16In(x), Bf16In(dy), off,
                                                        static_cast<float*>(dw), AsStream(stream))
                              : h->gemm->BackwardWeight(Bf16In(x), Bf16In(dy), off,
                                                        static_cast<__nv_bfloat16*>(dw),
                                                        AsStream(stream)));
}

void dl_gemm_destroy(void* handle) { delete static_cast<Bf16Gemm*>(handle); }

// MXFP8 grouped GEMM (mx_grouped_gemm.h); `kernel` as for dl_gemm_create.
void* dl_mxgemm_create(int experts, int k, int n, int64_t max_rows, int64_t padded_rows,
                       int64_t expected_rows, const char* kernel) {
  k::MxGroupedGemmOptions options;
  options.num_groups = experts;
  options.k = k;
  options.n = n;
  options.max_rows = max_rows;
  options.padded_rows = padded_rows;
  options.expected_rows_per_group = expected_rows;
  if (kernel != nullptr) options.kernel = kernel;
  absl::StatusOr<std::unique_ptr<k::MxGroupedGemm>> gemm = k::MxGroupedGemm::Create(options);
  if (!gemm.ok()) {
    Report(gemm.status());
    return nullptr;
  }
  auto* h = new MxGemm{std::move(*gemm), {}, {}};
  h->name = h->gemm->KernelName();
  return h;
}

const char* dl_mxgemm_kernel(void* handle) { return static_cast<MxGemm*>(handle)->name.c_str(); }

// The bf16-core variant the image products run (MxGroupedGemm::CoreKernelName).
const char* dl_mxgemm_core_kernel(void* handle) {
  auto* h = static_cast<MxGemm*>(handle);
  h->core_name = h->gemm->CoreKernelName();
  return h->core_name.c_str();
}

int dl_mxgemm_forward(void* handle, const void* x, const void* x_scales, const void* w_t,
                      const void* w_t_scales, const void* offsets, void* y, void* stream) {
  return Report(static_cast<MxGemm*>(handle)->gemm->Forward(
      {Bytes(x), Bytes(x_scales)}, {Bytes(w_t), Bytes(w_t_scales)},
      static_cast<const int32_t*>(offsets), static_cast<k::Bf16*>(y), AsStream(stream)));
}

int dl_mxgemm_backward_data(void* handle, const void* dy, const void* dy_scales, const void* w,
                            const void* w_scales, const void* offsets, void* dx, void* stream) {
  return Report(static_cast<MxGemm*>(handle)->gemm->BackwardData(
      {Bytes(dy), Bytes(dy_scales)}, {Bytes(w), Bytes(w_scales)},
      static_cast<const int32_t*>(offsets), static_cast<k::Bf16*>(dx), AsStream(stream)));
}

// The bf16-core products on weight images (mx_grouped_gemm.h), and the image itself (mxfp8.h:
// rows x cols of a row-wise MXFP8 operand, e.g. experts * n x k for W^T quantized along k).
int dl_mx_weight_image(int64_t rows, int64_t cols, const void* data, const void* scales,
                       void* image, void* stream) {
  return Report(k::cuda::MxWeightImage(rows, cols, Bytes(data), Bytes(scales),
                                       static_cast<k::Bf16*>(image), AsStream(stream)));
}

int dl_mxgemm_forward_image(void* handle, const void* x, const void* x_scales,
                            const void* w_t_image, const void* offsets, void* y, void* stream) {
  return Report(static_cast<MxGemm*>(handle)->gemm->Forward(
      {Bytes(x), Bytes(x_scales)}, static_cast<const k::Bf16*>(w_t_image),
      static_cast<const int32_t*>(offsets), static_cast<k::Bf16*>(y), AsStream(stream)));
}

int dl_mxgemm_backward_data_image(void* handle, const void* dy, const void* dy_scales,
                                  const void* w_image, const void* offsets, void* dx,
                                  void* stream) {
  return Report(static_cast<MxGemm*>(handle)->gemm->BackwardData(
      {Bytes(dy), Bytes(dy_scales)}, static_cast<const k::Bf16*>(w_image),
      static_cast<const int32_t*>(offsets), static_cast<k::Bf16*>(dx), AsStream(stream)));
}

// Column-wise block-major operands and padded offsets (mx_grouped_gemm.h); dw is fp32 when
// fp32_out, else bf16.
int dl_mxgemm_backward_weight(void* handle, const void* x, const void* x_scales, const void* dy,
                              const void* dy_scales, const void* padded_offsets, void* dw,
                              int fp32_out, void* stream) {
  auto* h = static_cast<MxGemm*>(handle);
  const k::MxOperand xa{Bytes(x), Bytes(x_scales)}, dya{Bytes(dy), Bytes(dy_scales)};
  const auto* off = static_cast<const int32_t*>(padded_offsets);
  return Report(fp32_out ? h->gemm->BackwardWeight(xa, dya, off, static_cast<float*>(dw),
                                                   AsStream(stream))
                         : h->gemm->BackwardWeight(xa, dya, off, static_cast<k::Bf16*>(dw),
                                                   AsStream(stream)));
}

void dl_mxgemm_destroy(void* handle) { delete static_cast<MxGemm*>(handle); }

// FP8 blockwise-scaled grouped GEMM (fp8_block_grouped_gemm.h): operands and fp32 scales in the
// layouts of fp8_block.h; padded_rows as Fp8BlockGroupedGemmOptions (0: the default bound);
// m_kernel and wgrad_kernel (null or "": the default) force the forward / data-gradient kernel
// and the weight-gradient kernel; x_block_scales != 0: the weight gradient's X scales per
// 128 x 128 block ([P/128][k/128], Fp8ColwiseScaling::kPerBlock).
void* dl_fp8block_create(int experts, int k, int n, int64_t max_rows, int64_t padded_rows,
                         const char* m_kernel, const char* wgrad_kernel, int x_block_scales) {
  k::Fp8BlockGroupedGemmOptions options;
  options.x_scaling = x_block_scales != 0 ? k::Fp8ColwiseScaling::kPerBlock
                                          : k::Fp8ColwiseScaling::kPerColumn;
  options.num_groups = experts;
  options.k = k;
  options.n = n;
  options.max_rows = max_rows;
  options.padded_rows = padded_rows;
  if (m_kernel != nullptr) options.m_grouped_kernel = m_kernel;
  if (wgrad_kernel != nullptr) options.weight_gradient_kernel = wgrad_kernel;
  absl::StatusOr<std::unique_ptr<k::Fp8BlockGroupedGemm>> gemm =
      k::Fp8BlockGroupedGemm::Create(options);
  if (!gemm.ok()) {
    Report(gemm.status());
    return nullptr;
  }
  auto* h = new Fp8BlockGemm{std::move(*gemm), {}};
  h->name = h->gemm->KernelName();
  return h;
}

const char* dl_fp8block_kernel(void* handle) {
  return static_cast<Fp8BlockGemm*>(handle)->name.c_str();
}

int dl_fp8block_forward(void* handle, const void* x, const void* x_scales, const void* w_t,
                        const void* w_t_scales, const void* offsets, void* y, void* stream) {
  return Report(static_cast<Fp8BlockGemm*>(handle)->gemm->Forward(
      Fp8Block(x, x_scales), Fp8Block(w_t, w_t_scales), static_cast<const int32_t*>(offsets),
      static_cast<k::Bf16*>(y), AsStream(stream)));
}

int dl_fp8block_backward_data(void* handle, const void* dy, const void* dy_scales, const void* w,
                              const void* w_scales, const void* offsets, void* dx, void* stream) {
  return Report(static_cast<Fp8BlockGemm*>(handle)->gemm->BackwardData(
      Fp8Block(dy, dy_scales), Fp8Block(w, w_scales), static_cast<const int32_t*>(offsets),
      static_cast<k::Bf16*>(dx), AsStream(stream)));
}

// Column-wise operands [cols][P] with [P/128][cols] scales (X's [P/128][k/128] when created with
// x_block_scales) and the padded offsets; dw fp32.
int dl_fp8block_backward_weight(void* handle, const void* x, const void* x_scales, const void* dy,
                                const void* dy_scales, const void* padded_offsets, void* dw,
                                void* stream) {
  return Report(static_cast<Fp8BlockGemm*>(handle)->gemm->BackwardWeight(
      Fp8Block(x, x_scales), Fp8Block(dy, dy_scales),
      static_cast<const int32_t*>(padded_offsets), static_cast<float*>(dw), AsStream(stream)));
}

void dl_fp8block_destroy(void* handle) { delete static_cast<Fp8BlockGemm*>(handle); }

}  // extern "C"
