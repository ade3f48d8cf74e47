// CublasLtGroupedGemm: one cuBLASLt matmul per non-empty group. cuBLASLt is column-major, so each
// row-major product R = P . Q is issued as R^T = Q^T . P^T, which reads the same memory.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dropless/kernels/grouped_gemm.h"

namespace dropless::kernels {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

absl::Status CublasError(const char* what, cublasStatus_t status) {
  return absl::InternalError(absl::StrCat("cublasLt grouped gemm: ", what, ": ",
                                          cublasLtGetStatusString(status)));
}

#define RETURN_IF_CUBLAS(expr)                                  \
  do {                                                          \
    cublasStatus_t s_ = (expr);                                 \
    if (s_ != CUBLAS_STATUS_SUCCESS) return CublasError(#expr, s_); \
  } while (0)

// One column-major matmul D[m, n] = op(A) . op(B) with fp32 accumulation.
struct MatmulSpec {
  bool transpose_a = false;
  bool transpose_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* d = nullptr;
  int64_t ldd = 0;
  cudaDataType_t d_type = CUDA_R_16BF;
};

class Layout {
 public:
  absl::Status Init(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
    RETURN_IF_CUBLAS(cublasLtMatrixLayoutCreate(&layout_, type, rows, cols, ld));
    return absl::OkStatus();
  }
  ~Layout() {
    if (layout_ != nullptr) cublasLtMatrixLayoutDestroy(layout_);
  }
  cublasLtMatrixLayout_t get() const { return layout_; }

 private:
  cublasLtMatrixLayout_t layout_ = nullptr;
};

class CublasLtGroupedGemmImpl final : public CublasLtGroupedGemm {
 public:
  CublasLtGroupedGemmImpl(int num_groups, int k, int n) : num_groups_(num_groups), k_(k), n_(n) {}

  ~CublasLtGroupedGemmImpl() override {
    if (workspace_ != nullptr) cudaFree(workspace_);
    if (handle_ != nullptr) cublasLtDestroy(handle_);
  }

  absl::Status Init() {
    RETURN_IF_CUBLAS(cublasLtCreate(&handle_));
    cudaError_t err = cudaMalloc(&workspace_, kWorkspaceBytes);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // reported here, not by the next launch check
      workspace_ = nullptr;
      return absl::ResourceExhaustedError(
          absl::StrCat("cublasLt grouped gemm: workspace: ", cudaGetErrorString(err)));
    }
    return absl::OkStatus();
  }

  absl::Status Forward(const __nv_bfloat16* x, const __nv_bfloat16* w,
                       const std::vector<int32_t>& offsets, __nv_bfloat16* y,
                       cudaStream_t stream) override {
    if (absl::Status s = CheckOffsets(offsets); !s.ok()) return s;
    for (int e = 0; e < num_groups_; ++e) {
      const int64_t begin = offsets[e], rows = offsets[e + 1] - offsets[e];
      if (rows == 0) continue;
      // Y_e^T [n, m] = W[e]^T [n, k] . X_e^T [k, m]
      MatmulSpec spec{false, false, n_, rows, k_, w + WeightOffset(e), n_, x + begin * k_, k_,
                      y + begin * n_, n_, CUDA_R_16BF};
      if (absl::Status s = Matmul(spec, stream); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status BackwardData(const __nv_bfloat16* dy, const __nv_bfloat16* w,
                            const std::vector<int32_t>& offsets, __nv_bfloat16* dx,
                            cudaStream_t stream) override {
    if (absl::Status s = CheckOffsets(offsets); !s.ok()) return s;
    for (int e = 0; e < num_groups_; ++e) {
      const int64_t begin = offsets[e], rows = offsets[e + 1] - offsets[e];
      if (rows == 0) continue;
      // dX_e^T [k, m] = W[e] [k, n] . dY_e^T [n, m]
      MatmulSpec spec{true, false, k_, rows, n_, w + WeightOffset(e), n_, dy + begin * n_, n_,
                      dx + begin * k_, k_, CUDA_R_16BF};
      if (absl::Status s = Matmul(spec, stream); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status BackwardWeight(const __nv_bfloat16* x, const __nv_bfloat16* dy,
                              const std::vector<int32_t>& offsets, float* dw,
                              cudaStream_t stream) override {
    return Wgrad(x, dy, offsets, dw, sizeof(float), CUDA_R_32F, stream);
  }

  absl::Status BackwardWeight(const __nv_bfloat16* x, const __nv_bfloat16* dy,
                              const std::vector<int32_t>& offsets, __nv_bfloat16* dw,
                              cudaStream_t stream) override {
    return Wgrad(x, dy, offsets, dw, sizeof(__nv_bfloat16), CUDA_R_16BF, stream);
  }

 private:
  int64_t WeightOffset(int e) const { return static_cast<int64_t>(e) * k_ * n_; }

  absl::Status CheckOffsets(const std::vector<int32_t>& offsets) const {
    if (offsets.size() != static_cast<size_t>(num_groups_) + 1 || offsets[0] != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cublasLt grouped gemm: host_offsets must have num_groups + 1 = ", num_groups_ + 1,
          " entries starting at 0, got ", offsets.size()));
    }
    for (int e = 0; e < num_groups_; ++e) {
      if (offsets[e + 1] < offsets[e]) {
        return absl::InvalidArgumentError(
            absl::StrCat("cublasLt grouped gemm: host_offsets decrease at group ", e));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Wgrad(const __nv_bfloat16* x, const __nv_bfloat16* dy,
                     const std::vector<int32_t>& offsets, void* dw, size_t element_bytes,
                     cudaDataType_t type, cudaStream_t stream) {
    if (absl::Status s = CheckOffsets(offsets); !s.ok()) return s;
    const size_t group_bytes = static_cast<size_t>(k_) * n_ * element_bytes;
    for (int e = 0; e < num_groups_; ++e) {
      const int64_t begin = offsets[e], rows = offsets[e + 1] - offsets[e];
      char* group = static_cast<char*>(dw) + e * group_bytes;
      if (rows == 0) {
        cudaError_t err = cudaMemsetAsync(group, 0, group_bytes, stream);
        if (err != cudaSuccess) {
          return absl::InternalError(
              absl::StrCat("cublasLt grouped gemm: memset: ", cudaGetErrorString(err)));
        }
        continue;
      }
      // dW[e]^T [n, k] = dY_e^T [n, m] . X_e [m, k]
      MatmulSpec spec{false, true, n_, k_, rows, dy + begin * n_, n_, x + begin * k_, k_,
                      group, n_, type};
      if (absl::Status s = Matmul(spec, stream); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status Matmul(const MatmulSpec& spec, cudaStream_t stream) {
    cublasLtMatmulDesc_t desc = nullptr;
    RETURN_IF_CUBLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    std::unique_ptr<cublasLtMatmulDescOpaque_t, cublasStatus_t (*)(cublasLtMatmulDesc_t)> owned(
        desc, cublasLtMatmulDescDestroy);
    const cublasOperation_t op_a = spec.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = spec.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    RETURN_IF_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                                    sizeof(op_a)));
    RETURN_IF_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                                    sizeof(op_b)));
    Layout a, b, d;
    // Layouts describe the stored matrices: op(A) is m x k, op(B) is k x n.
    absl::Status s = a.Init(CUDA_R_16BF, spec.transpose_a ? spec.k : spec.m,
                            spec.transpose_a ? spec.m : spec.k, spec.lda);
    if (s.ok()) {
      s = b.Init(CUDA_R_16BF, spec.transpose_b ? spec.n : spec.k,
                 spec.transpose_b ? spec.k : spec.n, spec.ldb);
    }
    if (s.ok()) s = d.Init(spec.d_type, spec.m, spec.n, spec.ldd);
    if (!s.ok()) return s;

    cublasLtMatmulPreference_t pref = nullptr;
    RETURN_IF_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    std::unique_ptr<cublasLtMatmulPreferenceOpaque_t,
                    cublasStatus_t (*)(cublasLtMatmulPreference_t)>
        owned_pref(pref, cublasLtMatmulPreferenceDestroy);
    const size_t workspace = kWorkspaceBytes;
    RETURN_IF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    RETURN_IF_CUBLAS(cublasLtMatmulAlgoGetHeuristic(handle_, desc, a.get(), b.get(), d.get(),
                                                    d.get(), pref, 1, &result, &found));
    if (found == 0) {
      return absl::InternalError(absl::StrCat("cublasLt grouped gemm: no algorithm for m=", spec.m,
                                              " n=", spec.n, " k=", spec.k));
    }
    const float alpha = 1.0f, beta = 0.0f;
    RETURN_IF_CUBLAS(cublasLtMatmul(handle_, desc, &alpha, spec.a, a.get(), spec.b, b.get(), &beta,
                                    spec.d, d.get(), spec.d, d.get(), &result.algo, workspace_,
                                    kWorkspaceBytes, stream));
    return absl::OkStatus();
  }

  const int num_groups_;
  const int64_t k_;
  const int64_t n_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CublasLtGroupedGemm>> CublasLtGroupedGemm::Create(int num_groups,
                                                                                 int k, int n) {
  if (num_groups < 0 || k <= 0 || n <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cublasLt grouped gemm: need num_groups >= 0, k > 0, n > 0; got ", num_groups, ", ", k,
        ", ", n));
  }
  auto gemm = std::make_unique<CublasLtGroupedGemmImpl>(num_groups, k, n);
  if (absl::Status s = gemm->Init(); !s.ok()) return s;
  return std::unique_ptr<CublasLtGroupedGemm>(std::move(gemm));
}

}  // namespace dropless::kernels
