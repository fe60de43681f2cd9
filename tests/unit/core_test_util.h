// Helpers for the compute-core unit tests: random host tensors, spec builders
// and comparisons against the float64 reference.
#ifndef GPUCOMPUTE_TESTS_UNIT_CORE_TEST_UTIL_H_
#define GPUCOMPUTE_TESTS_UNIT_CORE_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "client/reference.h"
#include "proto/dtype.h"
#include "server/common/tensor.h"
#include "server/core/ops.h"

namespace gpucompute::testing {

// A generator per thread, freshly seeded: new inputs every run.
inline std::mt19937_64& Rng() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return rng;
}

// Uniform values in [lo, hi) stored as `dtype`.
inline HostTensor RandomTensor(DType dtype, std::vector<int64_t> shape, double lo = -1.0,
                               double hi = 1.0) {
  HostTensor t = HostTensor::Allocate(dtype, std::move(shape));
  const int64_t n = t.num_elements();
  std::vector<float> values(static_cast<size_t>(n));
  std::uniform_real_distribution<double> dist(lo, hi);
  for (float& v : values) v = static_cast<float>(dist(Rng()));
  FromFloat(dtype, values.data(), t.mutable_data(), n);
  return t;
}

// Sets element i of `t` to `value` (converted to t.dtype).
inline void SetElement(HostTensor& t, int64_t i, float value) {
  FromFloat(t.dtype, &value, static_cast<char*>(t.mutable_data()) + i * DTypeSize(t.dtype), 1);
}

// A tensor whose bytes are all `byte` (0xff: NaN in every dtype).
inline HostTensor FilledTensor(DType dtype, std::vector<int64_t> shape, unsigned char byte) {
  HostTensor t = HostTensor::Allocate(dtype, std::move(shape));
  std::memset(t.mutable_data(), byte, t.data.size());
  return t;
}

inline std::vector<double> Doubles(const HostTensor& t) {
  return reference::ToDoubles(t.dtype, t.data.data(), t.num_elements());
}

// Rounds every value to `dtype` (what a result stored in `dtype` can hold).
inline std::vector<double> RoundTo(DType dtype, const std::vector<double>& values) {
  std::vector<double> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const float f = static_cast<float>(values[i]);
    uint16_t h;
    switch (dtype) {
      case DType::kFloat32:
        out[i] = f;
        break;
      case DType::kFloat16:
        h = FloatToHalf(f);
        out[i] = HalfToFloat(h);
        break;
      case DType::kBFloat16:
        h = FloatToBFloat16(f);
        out[i] = BFloat16ToFloat(h);
        break;
    }
  }
  return out;
}

inline std::string DTypeTag(DType t) {
  return t == DType::kFloat32 ? "f32" : (t == DType::kFloat16 ? "f16" : "bf16");
}

inline constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

// GEMM inputs and the spec that views them (the spec points into the tensors:
// keep the struct alive while the spec is used).
struct GemmCase {
  HostTensor a, b;
  std::optional<HostTensor> c;
  GemmSpec spec;

  std::vector<double> Reference() const {
    std::vector<double> c_values;
    if (c) c_values = Doubles(*c);
    return reference::Gemm(Doubles(a), Doubles(b), c ? &c_values : nullptr, spec.batch, spec.m,
                           spec.n, spec.k, spec.a_batched, spec.b_batched, spec.c_batched,
                           spec.trans_a, spec.trans_b, spec.alpha, spec.beta);
  }
};

inline GemmCase MakeGemm(DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                         bool trans_a = false, bool trans_b = false, double alpha = 1,
                         double beta = 0, bool b_batched = true, bool c_batched = true) {
  GemmCase g;
  const bool batched = batch > 1;
  std::vector<int64_t> a_shape = trans_a ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k};
  std::vector<int64_t> b_shape = trans_b ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n};
  std::vector<int64_t> c_shape = {m, n};
  GemmSpec& s = g.spec;
  s.a_batched = batched;
  s.b_batched = batched && b_batched;
  s.c_batched = batched && c_batched;
  if (s.a_batched) a_shape.insert(a_shape.begin(), batch);
  if (s.b_batched) b_shape.insert(b_shape.begin(), batch);
  if (s.c_batched) c_shape.insert(c_shape.begin(), batch);
  g.a = RandomTensor(dtype, a_shape);
  g.b = RandomTensor(dtype, b_shape);
  if (beta != 0) g.c = RandomTensor(dtype, c_shape);
  s.a = g.a.view();
  s.b = g.b.view();
  if (g.c) s.c = g.c->view();
  s.batch = batch;
  s.m = m;
  s.n = n;
  s.k = k;
  s.trans_a = trans_a;
  s.trans_b = trans_b;
  s.alpha = alpha;
  s.beta = beta;
  s.dtype = dtype;
  s.out_shape = batched ? std::vector<int64_t>{batch, m, n} : std::vector<int64_t>{m, n};
  s.options.output_dtype = dtype;
  return g;
}

struct GemvCase {
  HostTensor a, x;
  std::optional<HostTensor> y;
  GemvSpec spec;

  std::vector<double> Reference() const {
    std::vector<double> y_values;
    if (y) y_values = Doubles(*y);
    return reference::Gemv(Doubles(a), Doubles(x), y ? &y_values : nullptr, spec.m, spec.k,
                           spec.ncols, spec.trans_a, spec.alpha, spec.beta);
  }
};

inline GemvCase MakeGemv(DType dtype, int64_t m, int64_t k, int64_t ncols, bool trans_a = false,
                         double alpha = 1, double beta = 0) {
  GemvCase g;
  g.a = RandomTensor(dtype, trans_a ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k});
  g.x = RandomTensor(dtype, ncols == 1 ? std::vector<int64_t>{k} : std::vector<int64_t>{k, ncols});
  GemvSpec& s = g.spec;
  s.out_shape = ncols == 1 ? std::vector<int64_t>{m} : std::vector<int64_t>{m, ncols};
  if (beta != 0) g.y = RandomTensor(dtype, s.out_shape);
  s.a = g.a.view();
  s.x = g.x.view();
  if (g.y) s.y = g.y->view();
  s.m = m;
  s.k = k;
  s.ncols = ncols;
  s.trans_a = trans_a;
  s.alpha = alpha;
  s.beta = beta;
  s.dtype = dtype;
  s.options.output_dtype = dtype;
  return g;
}

// The reference's name for a reduction.
inline reference::ReduceOp ReferenceOp(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::kSum:
      return reference::ReduceOp::kSum;
    case ReduceKind::kMax:
      return reference::ReduceOp::kMax;
    case ReduceKind::kMin:
      return reference::ReduceOp::kMin;
    case ReduceKind::kMean:
      return reference::ReduceOp::kMean;
  }
  return reference::ReduceOp::kSum;
}

struct ReduceCase {
  HostTensor input;
  ReduceSpec spec;

  std::vector<double> Reference() const {
    return reference::Reduce(Doubles(input), spec.outer, spec.axis_len, spec.inner,
                             ReferenceOp(spec.kind));
  }
};

// Reduces `shape` along `axis` (-1: every element), keepdims off.
inline ReduceCase MakeReduce(DType dtype, std::vector<int64_t> shape, int axis, ReduceKind kind,
                             double lo = -1.0, double hi = 1.0) {
  ReduceCase r;
  r.input = RandomTensor(dtype, shape, lo, hi);
  ReduceSpec& s = r.spec;
  s.input = r.input.view();
  s.kind = kind;
  if (axis < 0) {
    s.outer = 1;
    s.inner = 1;
    s.axis_len = NumElements(shape);
  } else {
    s.outer = 1;
    s.inner = 1;
    for (int i = 0; i < axis; ++i) s.outer *= shape[i];
    for (size_t i = axis + 1; i < shape.size(); ++i) s.inner *= shape[i];
    s.axis_len = shape[axis];
    for (size_t i = 0; i < shape.size(); ++i) {
      if (int(i) != axis) s.out_shape.push_back(shape[i]);
    }
  }
  s.options.output_dtype = dtype;
  return r;
}

struct TransposeCase {
  HostTensor input;
  TransposeSpec spec;
  std::vector<int> perm;

  std::vector<double> Reference() const {
    return reference::Transpose(Doubles(input), input.shape, perm);
  }
};

inline TransposeCase MakeTranspose(DType dtype, std::vector<int64_t> shape, std::vector<int> perm) {
  TransposeCase t;
  t.input = RandomTensor(dtype, shape);
  t.perm = perm;
  TransposeSpec& s = t.spec;
  s.input = t.input.view();
  s.rank = static_cast<int>(shape.size());
  for (int i = 0; i < s.rank; ++i) {
    s.in_shape[i] = shape[i];
    s.perm[i] = perm[i];
    s.out_shape.push_back(shape[perm[i]]);
  }
  s.options.output_dtype = dtype;
  return t;
}

struct AttentionCase {
  HostTensor q, k, v;
  AttentionSpec spec;

  reference::AttentionResult Reference() const {
    return reference::Attention(Doubles(q), Doubles(k), Doubles(v), spec.batch, spec.heads_q,
                                spec.heads_kv, spec.seq_q, spec.seq_kv, spec.head_dim, spec.causal,
                                spec.scale);
  }
};

inline AttentionCase MakeAttention(DType dtype, int64_t batch, int64_t heads_q, int64_t heads_kv,
                                   int64_t seq_q, int64_t seq_kv, int64_t head_dim, bool causal,
                                   bool return_lse = true) {
  AttentionCase a;
  a.q = RandomTensor(dtype, {batch, heads_q, seq_q, head_dim});
  a.k = RandomTensor(dtype, {batch, heads_kv, seq_kv, head_dim});
  a.v = RandomTensor(dtype, {batch, heads_kv, seq_kv, head_dim});
  AttentionSpec& s = a.spec;
  s.q = a.q.view();
  s.k = a.k.view();
  s.v = a.v.view();
  s.batch = batch;
  s.heads_q = heads_q;
  s.heads_kv = heads_kv;
  s.seq_q = seq_q;
  s.seq_kv = seq_kv;
  s.head_dim = head_dim;
  s.causal = causal;
  s.scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  s.return_lse = return_lse;
  s.dtype = dtype;
  s.out_shape = {batch, heads_q, seq_q, head_dim};
  s.options.output_dtype = dtype;
  return a;
}

}  // namespace gpucompute::testing

#endif  // GPUCOMPUTE_TESTS_UNIT_CORE_TEST_UTIL_H_
