#include "tests/integration/requests.h"

#include <atomic>
#include <chrono>
#include <cstdio>

namespace gpucompute::testing {
std::mt19937_64& Rng() {
  static const uint64_t seed = [] {
    const auto now =
        static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
    std::printf("random seed %llu\n", static_cast<unsigned long long>(now));
    return now;
  }();
  static std::atomic<uint64_t> threads{0};
  thread_local std::mt19937_64 rng(seed + 0x9E3779B97F4A7C15ull * threads.fetch_add(1));
  return rng;
}

v1::GemmRequest MakeGemm(v1::DType dtype, const GemmCase& c) {
  v1::GemmRequest r;
  *r.mutable_a() = RandomTensor(dtype, OperandShape(c.batch, c.m, c.k, c.trans_a), Rng());
  *r.mutable_b() =
      RandomTensor(dtype, OperandShape(c.b_batched ? c.batch : 0, c.k, c.n, c.trans_b), Rng());
  r.set_transpose_a(c.trans_a);
  r.set_transpose_b(c.trans_b);
  if (c.alpha != 1) r.set_alpha(c.alpha);
  r.set_beta(c.beta);
  if (c.beta != 0) {
    *r.mutable_c() =
        RandomTensor(dtype, OperandShape(c.c_batched ? c.batch : 0, c.m, c.n, false), Rng());
  }
  return r;
}

v1::GemvRequest MakeGemv(v1::DType dtype, const GemvCase& c) {
  v1::GemvRequest r;
  *r.mutable_a() = RandomTensor(dtype, OperandShape(0, c.m, c.k, c.trans_a), Rng());
  std::vector<int64_t> x =
      c.ncols == 0 ? std::vector<int64_t>{c.k} : std::vector<int64_t>{c.k, c.ncols};
  *r.mutable_x() = RandomTensor(dtype, x, Rng());
  r.set_transpose_a(c.trans_a);
  if (c.alpha != 1) r.set_alpha(c.alpha);
  r.set_beta(c.beta);
  if (c.beta != 0) {
    std::vector<int64_t> y =
        c.ncols == 0 ? std::vector<int64_t>{c.m} : std::vector<int64_t>{c.m, c.ncols};
    *r.mutable_y() = RandomTensor(dtype, y, Rng());
  }
  return r;
}

v1::ReduceRequest MakeReduce(v1::DType dtype, const std::vector<int64_t>& shape, v1::ReduceOp op,
                             std::optional<int> axis, bool keepdims) {
  v1::ReduceRequest r;
  *r.mutable_input() = RandomTensor(dtype, shape, Rng());
  r.set_op(op);
  if (axis) {
    r.set_has_axis(true);
    r.set_axis(*axis);
  }
  r.set_keepdims(keepdims);
  return r;
}

v1::TransposeRequest MakeTranspose(v1::DType dtype, const std::vector<int64_t>& shape,
                                   const std::vector<int>& perm) {
  v1::TransposeRequest r;
  *r.mutable_input() = RandomTensor(dtype, shape, Rng());
  for (int p : perm) r.add_perm(p);
  return r;
}

v1::AttentionRequest MakeAttention(v1::DType dtype, const AttentionCase& c) {
  v1::AttentionRequest r;
  *r.mutable_q() = RandomTensor(dtype, {c.batch, c.heads_q, c.seq_q, c.head_dim}, Rng());
  *r.mutable_k() = RandomTensor(dtype, {c.batch, c.heads_kv, c.seq_kv, c.head_dim}, Rng());
  *r.mutable_v() = RandomTensor(dtype, {c.batch, c.heads_kv, c.seq_kv, c.head_dim}, Rng());
  r.set_causal(c.causal);
  r.set_scale(c.scale);
  r.set_return_lse(c.lse);
  return r;
}

v1::EchoRequest MakeEcho(v1::DType dtype, const std::vector<int64_t>& shape) {
  v1::EchoRequest r;
  *r.mutable_input() = RandomTensor(dtype, shape, Rng());
  return r;
}

::testing::AssertionResult Passes(const absl::StatusOr<CheckResult>& check) {
  if (!check.ok()) {
    return ::testing::AssertionFailure() << "cannot check: " << check.status().ToString();
  }
  if (!check->ok) return ::testing::AssertionFailure() << check->message;
  return ::testing::AssertionSuccess();
}

}  // namespace gpucompute::testing
