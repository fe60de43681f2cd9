#include "server/device/cpu/blas.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <initializer_list>

#include "server/device/cpu/elements.h"

namespace gpucompute::cpu {
namespace {

bool FitsBlasInt(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) {
    if (d > INT_MAX) return false;
  }
  return true;
}

// C[m, n] = alpha * op(A) op(B) + beta * C with fp32 accumulation, plain loops.
// beta == 0 never reads C.
void NaiveSgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc) {
  std::vector<float> acc(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    if (!trans_b) {
      for (int64_t p = 0; p < k; ++p) {
        const float aip = trans_a ? a[p * lda + i] : a[i * lda + p];
        const float* brow = b + p * ldb;
        for (int64_t j = 0; j < n; ++j) acc[j] += aip * brow[j];
      }
    } else {
      for (int64_t j = 0; j < n; ++j) {
        const float* bcol = b + j * ldb;
        float s = 0.0f;
        for (int64_t p = 0; p < k; ++p) s += (trans_a ? a[p * lda + i] : a[i * lda + p]) * bcol[p];
        acc[j] = s;
      }
    }
    float* crow = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) {
      crow[j] = beta == 0.0f ? alpha * acc[j] : alpha * acc[j] + beta * crow[j];
    }
  }
}

}  // namespace

// C = alpha * op(A) op(B) + beta * C through CBLAS (or the loops when
// `naive`, or when a dimension does not fit CBLAS's int). beta == 0 never
// reads C; k == 0 gives beta * C.
void Sgemm(bool naive, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    }
    return;
  }
  if (naive || !FitsBlasInt({m, n, k, lda, ldb, ldc})) {
    NaiveSgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (beta == 0.0f) {
    // OpenBLAS scales C by beta first; clear it so stale NaNs cannot leak.
    for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), alpha, a, int(lda), b,
              int(ldb), beta, c, int(ldc));
}

// y[rows] = alpha * op(A) x + beta * y for one column x (stride incx) and one
// column y (stride incy). A is [rows, k] (lda) or, when trans_a, [k, rows].
void Sgemv(bool naive, bool trans_a, int64_t rows, int64_t k, float alpha, const float* a,
           int64_t lda, const float* x, int64_t incx, float beta, float* y, int64_t incy) {
  if (rows == 0) return;
  if (k == 0 || naive || !FitsBlasInt({rows, k, lda, incx, incy})) {
    if (!trans_a) {
      for (int64_t i = 0; i < rows; ++i) {
        const float* arow = a + i * lda;
        float s = 0.0f;
        for (int64_t p = 0; p < k; ++p) s += arow[p] * x[p * incx];
        y[i * incy] = beta == 0.0f ? alpha * s : alpha * s + beta * y[i * incy];
      }
    } else {
      std::vector<float> acc(size_t(rows), 0.0f);
      for (int64_t p = 0; p < k; ++p) {
        const float xp = x[p * incx];
        const float* arow = a + p * lda;
        for (int64_t i = 0; i < rows; ++i) acc[i] += arow[i] * xp;
      }
      for (int64_t i = 0; i < rows; ++i) {
        y[i * incy] = beta == 0.0f ? alpha * acc[i] : alpha * acc[i] + beta * y[i * incy];
      }
    }
    return;
  }
  if (beta == 0.0f) {
    for (int64_t i = 0; i < rows; ++i) y[i * incy] = 0.0f;
  }
  if (!trans_a) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, int(rows), int(k), alpha, a, int(lda), x, int(incx),
                beta, y, int(incy));
  } else {
    cblas_sgemv(CblasRowMajor, CblasTrans, int(k), int(rows), alpha, a, int(lda), x, int(incx),
                beta, y, int(incy));
  }
}

// op(A) rows [i0, i1) of A = `a` ([m, k], or [k, m] when trans_a).
FloatBlock RowsOfOpA(DType dtype, const void* a, bool trans_a, int64_t m, int64_t k, int64_t i0,
                     int64_t i1, std::vector<float>& scratch) {
  const int64_t rows = i1 - i0;
  if (dtype == DType::kFloat32) {
    const float* af = static_cast<const float*>(a);
    return trans_a ? FloatBlock{af + i0, m} : FloatBlock{af + i0 * k, k};
  }
  scratch.resize(size_t(rows * k));
  if (!trans_a) {
    ToFloat(dtype, ElementAt(a, dtype, i0 * k), scratch.data(), rows * k);
    return {scratch.data(), k};
  }
  for (int64_t p = 0; p < k; ++p) {
    ToFloat(dtype, ElementAt(a, dtype, p * m + i0), scratch.data() + p * rows, rows);
  }
  return {scratch.data(), rows};
}

}  // namespace gpucompute::cpu
