// Row-major GEMM through OpenBLAS for the CPU engine: C = alpha * op(A) * op(B) + beta * C.
// float goes to cblas_sgemm (the engine), double to cblas_dgemm (fp64 gradient checks).
#ifndef DROPLESS_WORKER_ENGINE_CPU_BLAS_GEMM_H_
#define DROPLESS_WORKER_ENGINE_CPU_BLAS_GEMM_H_

#include <cstdint>

namespace dropless::cpu {

// op(A) is m x k, op(B) is k x n, C is m x n; lda/ldb/ldc are the row strides of A, B, C as stored.
// m, n or k may be 0 (empty expert groups): with k == 0, C becomes beta * C.
template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// Several ranks of one machine share few cores: each GEMM runs on the calling thread only.
void UseSingleThreadedBlas();

}  // namespace dropless::cpu

#endif  // DROPLESS_WORKER_ENGINE_CPU_BLAS_GEMM_H_
