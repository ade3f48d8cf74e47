// Router logits and their backward through cuBLASLt (contract: dropless/kernels/router_gemm.h).
//
// Row-major buffers read as column-major transposes:
//   logits^T [E x T] = (w^T [H x E])^T . x^T [H x T]            A = w (op T), B = x (op N)
//   d_x^T    [H x T] = w^T [H x E] . d_logits^T [E x T]          A = w (op N), B = g (op N)
//   d_w^T    [H x E] = x^T [H x T] . (d_logits^T [E x T])^T      A = x (op N), B = g (op T)
// with g the bf16 copy of d_logits.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dropless/kernels/router_gemm.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.cuh"

namespace dropless::kernels::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;

__global__ void FloatToBf16Kernel(const float* __restrict__ in, int64_t n,
                                  __nv_bfloat16* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(in[i]);
  }
}

// One planned matmul: descriptors and the heuristic's algorithm for fixed shapes.
class Matmul {
 public:
  ~Matmul() {
    for (cublasLtMatrixLayout_t l : {a_, b_, c_}) {
      if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
    }
    if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
  }

  // Column-major C[m x n] = op(A) . op(B); ld of each operand is its stored row count.
  absl::Status Plan(cublasLtHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b,
                    int64_t m, int64_t n, int64_t k, cudaDataType_t c_type) {
    if (absl::Status s = CublasStatus(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                                      "cublasLtMatmulDescCreate");
        !s.ok()) {
      return s;
    }
    for (auto [attribute, op] : {std::pair{CUBLASLT_MATMUL_DESC_TRANSA, &op_a},
                                 std::pair{CUBLASLT_MATMUL_DESC_TRANSB, &op_b}}) {
      if (absl::Status s =
              CublasStatus(cublasLtMatmulDescSetAttribute(desc_, attribute, op, sizeof(*op)),
                           "cublasLtMatmulDescSetAttribute");
          !s.ok()) {
        return s;
      }
    }
    const int64_t a_rows = op_a == CUBLAS_OP_N ? m : k, a_cols = op_a == CUBLAS_OP_N ? k : m;
    const int64_t b_rows = op_b == CUBLAS_OP_N ? k : n, b_cols = op_b == CUBLAS_OP_N ? n : k;
    for (auto [layout, type, rows, cols] :
         {std::tuple{&a_, CUDA_R_16BF, a_rows, a_cols}, std::tuple{&b_, CUDA_R_16BF, b_rows, b_cols},
          std::tuple{&c_, c_type, m, n}}) {
      if (absl::Status s = CublasStatus(
              cublasLtMatrixLayoutCreate(layout, type, static_cast<uint64_t>(rows),
                                         static_cast<uint64_t>(cols), rows),
              "cublasLtMatrixLayoutCreate");
          !s.ok()) {
        return s;
      }
    }
    cublasLtMatmulPreference_t preference = nullptr;
    if (absl::Status s = CublasStatus(cublasLtMatmulPreferenceCreate(&preference),
                                      "cublasLtMatmulPreferenceCreate");
        !s.ok()) {
      return s;
    }
    const size_t workspace = kWorkspaceBytes;
    absl::Status limited = CublasStatus(
        cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace, sizeof(workspace)),
        "cublasLtMatmulPreferenceSetAttribute");
    int found = 0;
    const cublasStatus_t status =
        limited.ok() ? cublasLtMatmulAlgoGetHeuristic(handle, desc_, a_, b_, c_, c_, preference, 1,
                                                      &heuristic_, &found)
                     : CUBLAS_STATUS_SUCCESS;
    // Only the creator's status matters: a preference that fails to be destroyed holds nothing.
    (void)cublasLtMatmulPreferenceDestroy(preference);
    if (!limited.ok()) return limited;
    if (absl::Status s = CublasStatus(status, "cublasLtMatmulAlgoGetHeuristic"); !s.ok()) return s;
    if (found == 0) return absl::InternalError("cuBLASLt found no algorithm for a router GEMM");
    return absl::OkStatus();
  }

  absl::Status Run(cublasLtHandle_t handle, const void* a, const void* b, void* c, float beta,
                   void* workspace, Stream stream) const {
    const float alpha = 1.0f;
    return CublasStatus(cublasLtMatmul(handle, desc_, &alpha, a, a_, b, b_, &beta, c, c_, c, c_,
                                       &heuristic_.algo, workspace, kWorkspaceBytes, stream),
                        "cublasLtMatmul");
  }

 private:
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic_ = {};
};

class RouterGemmImpl final : public RouterGemm {
 public:
  explicit RouterGemmImpl(const RouterGemmShape& shape) : shape_(shape) {}
  ~RouterGemmImpl() override {
    plans_.clear();
    if (workspace_ != nullptr) cudaFree(workspace_);
    if (d_logits_bf16_ != nullptr) cudaFree(d_logits_bf16_);
    if (handle_ != nullptr) cublasLtDestroy(handle_);
  }

  absl::Status Init() {
    if (absl::Status s = CublasStatus(cublasLtCreate(&handle_), "cublasLtCreate"); !s.ok()) return s;
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMalloc(&workspace_, kWorkspaceBytes));
    const size_t g_bytes = sizeof(__nv_bfloat16) * std::max<int64_t>(1, shape_.max_tokens) *
                           shape_.num_experts;
    DROPLESS_CUDA_RETURN_IF_ERROR(cudaMalloc(&d_logits_bf16_, g_bytes));
    return absl::OkStatus();
  }

  absl::Status Logits(int64_t tokens, const Bf16* x, const Bf16* w, float* logits,
                      Stream stream) override {
    if (absl::Status s = ValidateRouterGemmShape(shape_, tokens); !s.ok()) return s;
    if (tokens == 0) return absl::OkStatus();
    if (x == nullptr || w == nullptr || logits == nullptr) {
      return absl::InvalidArgumentError("x, w and logits must be set");
    }
    absl::StatusOr<const Matmul*> mm =
        Get(kForward, tokens, CUBLAS_OP_T, CUBLAS_OP_N, shape_.num_experts, tokens, shape_.hidden,
            CUDA_R_32F);
    if (!mm.ok()) return mm.status();
    return (*mm)->Run(handle_, w, x, logits, 0.0f, workspace_, stream);
  }

  absl::Status LogitsBackward(int64_t tokens, const Bf16* x, const Bf16* w, const float* d_logits,
                              Bf16* d_x, bool accumulate_d_x, float* d_w, Stream stream) override {
    if (absl::Status s = ValidateRouterGemmShape(shape_, tokens); !s.ok()) return s;
    if (x == nullptr || w == nullptr || d_logits == nullptr || d_x == nullptr || d_w == nullptr) {
      return absl::InvalidArgumentError("x, w, d_logits, d_x and d_w must be set");
    }
    if (tokens == 0) {
      DROPLESS_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(d_w, 0, sizeof(float) * shape_.num_experts * shape_.hidden, stream));
      return absl::OkStatus();
    }
    const int64_t n = tokens * shape_.num_experts;
    FloatToBf16Kernel<<<GridStrideBlocks(n, 256), 256, 0, stream>>>(d_logits, n, d_logits_bf16_);
    if (absl::Status s = LaunchStatus("FloatToBf16Kernel"); !s.ok()) return s;
    absl::StatusOr<const Matmul*> dx = Get(kBackwardData, tokens, CUBLAS_OP_N, CUBLAS_OP_N,
                                           shape_.hidden, tokens, shape_.num_experts, CUDA_R_16BF);
    if (!dx.ok()) return dx.status();
    if (absl::Status s = (*dx)->Run(handle_, w, d_logits_bf16_, d_x, accumulate_d_x ? 1.0f : 0.0f,
                                    workspace_, stream);
        !s.ok()) {
      return s;
    }
    absl::StatusOr<const Matmul*> dw = Get(kBackwardWeight, tokens, CUBLAS_OP_N, CUBLAS_OP_T,
                                           shape_.hidden, shape_.num_experts, tokens, CUDA_R_32F);
    if (!dw.ok()) return dw.status();
    return (*dw)->Run(handle_, x, d_logits_bf16_, d_w, 0.0f, workspace_, stream);
  }

 private:
  enum Product { kForward, kBackwardData, kBackwardWeight };

  // Plans are made once per (product, token count) and reused: calls after the first do no
  // cuBLASLt planning work.
  absl::StatusOr<const Matmul*> Get(Product product, int64_t tokens, cublasOperation_t op_a,
                                    cublasOperation_t op_b, int64_t m, int64_t n, int64_t k,
                                    cudaDataType_t c_type) {
    auto& slot = plans_[{product, tokens}];
    if (slot == nullptr) {
      auto plan = std::make_unique<Matmul>();
      if (absl::Status s = plan->Plan(handle_, op_a, op_b, m, n, k, c_type); !s.ok()) return s;
      slot = std::move(plan);
    }
    return slot.get();
  }

  RouterGemmShape shape_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  __nv_bfloat16* d_logits_bf16_ = nullptr;
  std::map<std::pair<int, int64_t>, std::unique_ptr<Matmul>> plans_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RouterGemm>> RouterGemm::Create(const RouterGemmShape& shape) {
  if (absl::Status s = ValidateRouterGemmShape(shape, 0); !s.ok()) return s;
  auto gemm = std::make_unique<RouterGemmImpl>(shape);
  if (absl::Status s = gemm->Init(); !s.ok()) return s;
  return std::unique_ptr<RouterGemm>(std::move(gemm));
}

}  // namespace dropless::kernels::cuda
