#pragma once
// Row-major matrix products for float and double behind one overloaded name, so the
// layers can be written once as templates and checked in double precision.

#include <cblas.h>

namespace troupe::blas {

/// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, all row-major with leading
/// dimensions lda, ldb, ldc; op transposes when the flag is set.
inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A,
                 int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace troupe::blas
