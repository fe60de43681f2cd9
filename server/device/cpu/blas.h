// fp32 GEMM and GEMV for the CPU kernels: CBLAS (OpenBLAS, single-threaded
// calls), or plain loops for the "naive" variant and for dimensions beyond
// CBLAS's int. beta == 0 never reads C or y, so stale NaNs cannot leak.
#ifndef GPUCOMPUTE_SERVER_DEVICE_CPU_BLAS_H_
#define GPUCOMPUTE_SERVER_DEVICE_CPU_BLAS_H_

#include <cstdint>
#include <vector>

#include "proto/dtype.h"

namespace gpucompute::cpu {

// C[m, n] = alpha * op(A) op(B) + beta * C (row-major, leading dimensions
// lda, ldb, ldc). k == 0 gives beta * C.
void Sgemm(bool naive, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc);

// y[rows] = alpha * op(A) x + beta * y for one column x (stride incx) and one
// column y (stride incy). A is [rows, k] (lda) or, when trans_a, [k, rows].
void Sgemv(bool naive, bool trans_a, int64_t rows, int64_t k, float alpha, const float* a,
           int64_t lda, const float* x, int64_t incx, float beta, float* y, int64_t incy);

// A block of op(A) rows [i0, i1) of one batch entry as fp32: a pointer and a
// leading dimension usable with the trans flag unchanged. fp32 inputs are used
// in place; half inputs are converted into `scratch`.
struct FloatBlock {
  const float* data = nullptr;
  int64_t ld = 0;
};

// op(A) rows [i0, i1) of A = `a` ([m, k], or [k, m] when trans_a).
FloatBlock RowsOfOpA(DType dtype, const void* a, bool trans_a, int64_t m, int64_t k, int64_t i0,
                     int64_t i1, std::vector<float>& scratch);

}  // namespace gpucompute::cpu

#endif  // GPUCOMPUTE_SERVER_DEVICE_CPU_BLAS_H_
