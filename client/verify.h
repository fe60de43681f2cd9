// Random inputs and float64-reference checks for gpucompute requests: what
// the CLI's --check and the integration tests use to judge a response.
//
// Tolerance: an element passes when |got - want| <= atol + rtol * |want|, with
// rtol = reference::Rtol(result dtype, accumulation depth) (fp32 accumulation
// plus the rounding of the stored result) and atol = the fp32 accumulation
// error times the magnitude of the accumulated terms, so that results that
// cancel to near zero are judged by the error their terms allow. Attention's
// atol is rtol times max|V| (the output is a convex combination of V's rows).
// Echo and transpose are exact unless the output dtype differs.
#ifndef GPUCOMPUTE_CLIENT_VERIFY_H_
#define GPUCOMPUTE_CLIENT_VERIFY_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "proto/dtype.h"

namespace gpucompute {

// The host dtype of a proto dtype. REQUIRES: dtype != DTYPE_UNSPECIFIED.
DType ToHostDType(v1::DType dtype);

// A tensor of `shape` with elements uniform in [lo, hi), rounded to `dtype`.
// REQUIRES: a valid shape.
v1::Tensor RandomTensor(v1::DType dtype, const std::vector<int64_t>& shape, std::mt19937_64& rng,
                        float lo = -1.f, float hi = 1.f);

// The shape of a matrix operand of `rows` x `cols` as a request carries it:
// [cols, rows] when `transposed`, with a leading batch axis when batch > 0.
std::vector<int64_t> OperandShape(int64_t batch, int64_t rows, int64_t cols, bool transposed);

// The elements as doubles (exact for every dtype). Errors as CheckTensor.
absl::StatusOr<std::vector<double>> TensorToDoubles(const v1::Tensor& tensor,
                                                    const std::string& name);

// A tensor of `dtype` holding `values` rounded to nearest even.
// REQUIRES: values.size() == product(shape).
v1::Tensor TensorFromFloats(v1::DType dtype, const std::vector<int64_t>& shape,
                            const std::vector<float>& values);

// The outcome of comparing one response with the reference.
struct CheckResult {
  bool ok = false;
  // When !ok: which output, the count and the first mismatches (or the wrong
  // shape or dtype). When ok: empty.
  std::string message;
  // Largest |got - want| over every checked element, and the tolerance used.
  double max_abs_error = 0;
  double atol = 0, rtol = 0;
};

// Each computes the float64 reference of `request` and compares `response`
// with it: dtype, shape and values. INVALID_ARGUMENT when the request itself
// is malformed (a request the server must reject cannot be checked).
absl::StatusOr<CheckResult> CheckGemm(const v1::GemmRequest& request,
                                      const v1::GemmResponse& response);
absl::StatusOr<CheckResult> CheckGemv(const v1::GemvRequest& request,
                                      const v1::GemvResponse& response);
absl::StatusOr<CheckResult> CheckReduce(const v1::ReduceRequest& request,
                                        const v1::ReduceResponse& response);
absl::StatusOr<CheckResult> CheckTranspose(const v1::TransposeRequest& request,
                                           const v1::TransposeResponse& response);
// Checks O and, when requested, the log-sum-exp.
absl::StatusOr<CheckResult> CheckAttention(const v1::AttentionRequest& request,
                                           const v1::AttentionResponse& response);
absl::StatusOr<CheckResult> CheckEcho(const v1::EchoRequest& request,
                                      const v1::EchoResponse& response);
// The answer to one successful batch item, by its case. INVALID_ARGUMENT when
// the response's case differs from the request's or the item failed.
absl::StatusOr<CheckResult> CheckBatchItem(const v1::BatchRequest& request,
                                           const v1::BatchResponse& response);

// Bytes and FLOPs an operation must move and do (inputs read once, output
// written once), for throughput figures. Zero FLOPs for memory-bound ops.
struct Work {
  double bytes = 0;
  double flops = 0;
};
Work WorkOf(const v1::GemmRequest& request);
Work WorkOf(const v1::GemvRequest& request);
Work WorkOf(const v1::ReduceRequest& request);
Work WorkOf(const v1::TransposeRequest& request);
Work WorkOf(const v1::AttentionRequest& request);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_CLIENT_VERIFY_H_
