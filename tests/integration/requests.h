// Random requests of every operation for the integration tests, and
// assertions on responses checked against the float64 reference.
#ifndef GPUCOMPUTE_TESTS_INTEGRATION_REQUESTS_H_
#define GPUCOMPUTE_TESTS_INTEGRATION_REQUESTS_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/verify.h"
#include "gtest/gtest.h"

namespace gpucompute::testing {

// The calling thread's generator, seeded from the clock: fresh inputs every
// run. The seed is printed by the first call so that a failure can be
// replayed; the first thread to call draws from that seed, each further
// thread (tests call from several at once) from the seed and the order in
// which it first called.
std::mt19937_64& Rng();

inline constexpr v1::DType kAllDTypes[] = {v1::FLOAT32, v1::FLOAT16, v1::BFLOAT16};

struct GemmCase {
  int64_t batch = 0;  // 0: plain matrices
  int64_t m = 1, n = 1, k = 1;
  bool trans_a = false, trans_b = false;
  bool b_batched = false;
  double alpha = 1, beta = 0;
  bool c_batched = false;
};
v1::GemmRequest MakeGemm(v1::DType dtype, const GemmCase& c);

struct GemvCase {
  int64_t m = 1, k = 1;
  int64_t ncols = 0;  // 0: x is a vector [K]
  bool trans_a = false;
  double alpha = 1, beta = 0;
};
v1::GemvRequest MakeGemv(v1::DType dtype, const GemvCase& c);

v1::ReduceRequest MakeReduce(v1::DType dtype, const std::vector<int64_t>& shape, v1::ReduceOp op,
                             std::optional<int> axis = std::nullopt, bool keepdims = false);

v1::TransposeRequest MakeTranspose(v1::DType dtype, const std::vector<int64_t>& shape,
                                   const std::vector<int>& perm = {});

struct AttentionCase {
  int64_t batch = 1, heads_q = 1, heads_kv = 1, seq_q = 1, seq_kv = 1, head_dim = 64;
  bool causal = false;
  double scale = 0;
  bool lse = false;
};
v1::AttentionRequest MakeAttention(v1::DType dtype, const AttentionCase& c);

v1::EchoRequest MakeEcho(v1::DType dtype, const std::vector<int64_t>& shape);

// gtest assertion helper: the check ran and passed.
::testing::AssertionResult Passes(const absl::StatusOr<CheckResult>& check);

}  // namespace gpucompute::testing

#endif  // GPUCOMPUTE_TESTS_INTEGRATION_REQUESTS_H_
