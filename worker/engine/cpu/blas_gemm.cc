#include "worker/engine/cpu/blas_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>

namespace dropless::cpu {
namespace {

// BLAS rejects a leading dimension of 0 even when the matrix is empty.
blasint Ld(int64_t ld) { return static_cast<blasint>(std::max<int64_t>(ld, 1)); }

template <typename T>
void ScaleOrZero(int64_t m, int64_t n, T beta, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    if (beta == T(0)) {
      std::fill(row, row + n, T(0));  // 0 * NaN must not survive: C is overwritten
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
  }
}

}  // namespace

template <>
void Gemm<float>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) return ScaleOrZero(m, n, beta, c, ldc);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, Ld(lda), b, Ld(ldb),
              beta, c, Ld(ldc));
}

template <>
void Gemm<double>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                  const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                  double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) return ScaleOrZero(m, n, beta, c, ldc);
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, Ld(lda), b, Ld(ldb),
              beta, c, Ld(ldc));
}

void UseSingleThreadedBlas() {
  // Once per process: ranks that are threads of one process (tests) all create engines.
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace dropless::cpu
