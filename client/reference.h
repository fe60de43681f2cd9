// Float64 reference implementations of every operation, on plain row-major
// arrays of doubles: the client's oracle (the CLI's --check) and the tests'.
// The server never uses it.
#ifndef GPUCOMPUTE_CLIENT_REFERENCE_H_
#define GPUCOMPUTE_CLIENT_REFERENCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "proto/dtype.h"

namespace gpucompute::reference {

// C = alpha * op(A) * op(B) + beta * C for `batch` entries. a holds batch_a
// (1 or batch, per a_batched) matrices [M, K] ([K, M] when trans_a); b
// likewise [K, N] ([N, K]); c (may be null when beta == 0) [batch_c, M, N].
// Returns [batch, M, N].
std::vector<double> Gemm(const std::vector<double>& a, const std::vector<double>& b,
                         const std::vector<double>* c, int64_t batch, int64_t m, int64_t n,
                         int64_t k, bool a_batched, bool b_batched, bool c_batched, bool trans_a,
                         bool trans_b, double alpha, double beta);

// y = alpha * op(A) * x + beta * y; A [M, K] ([K, M] when trans_a), x
// [K, ncols], y (may be null when beta == 0) [M, ncols]. Returns [M, ncols].
std::vector<double> Gemv(const std::vector<double>& a, const std::vector<double>& x,
                         const std::vector<double>* y, int64_t m, int64_t k, int64_t ncols,
                         bool trans_a, double alpha, double beta);

enum class ReduceOp : int { kSum = 0, kMax, kMin, kMean };

// Reduces `in` viewed as [outer, axis_len, inner] along the middle axis.
// MAX/MIN propagate NaN. Returns [outer, inner].
std::vector<double> Reduce(const std::vector<double>& in, int64_t outer, int64_t axis_len,
                           int64_t inner, ReduceOp op);

// numpy.transpose(in.reshape(shape), perm).ravel().
std::vector<double> Transpose(const std::vector<double>& in, const std::vector<int64_t>& shape,
                              const std::vector<int>& perm);

struct AttentionResult {
  std::vector<double> o;    // [B, Hq, Sq, D]
  std::vector<double> lse;  // [B, Hq, Sq], natural log; -inf for rows with no key
};

// Attention forward with a causal mask aligned bottom-right (query i sees
// keys j <= i + Skv - Sq); rows with no visible key give zeros.
AttentionResult Attention(const std::vector<double>& q, const std::vector<double>& k,
                          const std::vector<double>& v, int64_t batch, int64_t heads_q,
                          int64_t heads_kv, int64_t seq_q, int64_t seq_kv, int64_t head_dim,
                          bool causal, double scale);

// Reads a host buffer of `n` elements of `dtype` into doubles.
std::vector<double> ToDoubles(DType dtype, const void* data, int64_t n);

// Relative tolerance for a result stored in `dtype` that accumulated `depth`
// products in fp32 (grows slowly with depth for fp32).
double Rtol(DType dtype, int64_t depth = 1);

// Empty when |got[i] - want[i]| <= atol + rtol * |want[i]| for every i (NaN
// matches NaN, Inf matches the same Inf); otherwise a message naming the
// count and the first few mismatches.
std::string CompareClose(const std::vector<double>& got, const std::vector<double>& want,
                         double atol, double rtol);

}  // namespace gpucompute::reference

#endif  // GPUCOMPUTE_CLIENT_REFERENCE_H_
