#include "client/verify.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/reference.h"

namespace gpucompute {
namespace {

double MaxAbs(const std::vector<double>& values) {
  double m = 0;
  for (double v : values) {
    if (std::isfinite(v)) m = std::max(m, std::abs(v));
  }
  return m;
}

// Relative error of an fp32 accumulation of `depth` terms: times the terms'
// magnitude, the absolute error a result may carry whatever its own size.
double AccumulationTolerance(int64_t depth) { return reference::Rtol(DType::kFloat32, depth); }

v1::DType OutputDType(const v1::OpOptions& options, v1::DType input) {
  return options.output_dtype() == v1::DTYPE_UNSPECIFIED ? input : options.output_dtype();
}

absl::Status Invalid(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// Rank of a tensor's shape.
int RankOf(const v1::Tensor& t) { return t.shape_size(); }

// Compares `got` (a response tensor) with `want` of `want_shape` in
// `want_dtype`; accumulates into `result` (the first failure wins).
void Compare(const std::string& name, const v1::Tensor& got, v1::DType want_dtype,
             const std::vector<int64_t>& want_shape, const std::vector<double>& want, double atol,
             double rtol, CheckResult& result) {
  if (!result.ok) return;
  result.atol = std::max(result.atol, atol);
  result.rtol = std::max(result.rtol, rtol);
  if (got.dtype() != want_dtype) {
    result.ok = false;
    result.message = absl::StrCat(name, ".dtype: ", DTypeName(got.dtype()), ", expected ",
                                  DTypeName(want_dtype));
    return;
  }
  if (ShapeOf(got) != want_shape) {
    result.ok = false;
    result.message = absl::StrCat(name, ".shape: ", ShapeString(ShapeOf(got)), ", expected ",
                                  ShapeString(want_shape));
    return;
  }
  auto values = TensorToDoubles(got, name);
  if (!values.ok()) {
    result.ok = false;
    result.message = std::string(values.status().message());
    return;
  }
  for (size_t i = 0; i < want.size(); ++i) {
    double err = std::abs((*values)[i] - want[i]);
    if (std::isfinite(err)) result.max_abs_error = std::max(result.max_abs_error, err);
  }
  std::string mismatch = reference::CompareClose(*values, want, atol, rtol);
  if (!mismatch.empty()) {
    result.ok = false;
    result.message = absl::StrCat(name, ": ", mismatch);
  }
}

CheckResult Passing() {
  CheckResult result;
  result.ok = true;
  return result;
}

// The shape of a GEMM request, resolved as the server does.
struct GemmDims {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  bool a_batched = false, b_batched = false, c_batched = false;
  std::vector<int64_t> out_shape;
};

absl::StatusOr<GemmDims> ResolveGemm(const v1::GemmRequest& r) {
  GemmDims d;
  for (const auto& [t, name] : {std::pair{&r.a(), "a"}, std::pair{&r.b(), "b"}}) {
    if (absl::Status s = CheckTensor(*t, name); !s.ok()) return s;
    if (RankOf(*t) != 2 && RankOf(*t) != 3) return Invalid(absl::StrCat(name, ".shape"), "rank");
  }
  d.a_batched = RankOf(r.a()) == 3;
  d.b_batched = RankOf(r.b()) == 3;
  const auto& as = r.a().shape();
  const auto& bs = r.b().shape();
  int ao = d.a_batched ? 1 : 0, bo = d.b_batched ? 1 : 0;
  d.m = r.transpose_a() ? as[ao + 1] : as[ao];
  d.k = r.transpose_a() ? as[ao] : as[ao + 1];
  int64_t kb = r.transpose_b() ? bs[bo + 1] : bs[bo];
  d.n = r.transpose_b() ? bs[bo] : bs[bo + 1];
  if (kb != d.k) return Invalid("b.shape", "inner dimension does not match a");
  int64_t batch_a = d.a_batched ? as[0] : 1, batch_b = d.b_batched ? bs[0] : 1;
  if (d.a_batched && d.b_batched && batch_a != batch_b) return Invalid("b.shape", "batch");
  d.batch = std::max(batch_a, batch_b);
  if (r.beta() != 0) {
    if (absl::Status s = CheckTensor(r.c(), "c"); !s.ok()) return s;
    d.c_batched = RankOf(r.c()) == 3;
    std::vector<int64_t> want = {d.m, d.n};
    if (d.c_batched) want.insert(want.begin(), d.batch);
    if (ShapeOf(r.c()) != want) return Invalid("c.shape", "does not match the result");
  }
  if (d.a_batched || d.b_batched) {
    d.out_shape = {d.batch, d.m, d.n};
  } else {
    d.out_shape = {d.m, d.n};
  }
  return d;
}

}  // namespace

DType ToHostDType(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT16:
      return DType::kFloat16;
    case v1::BFLOAT16:
      return DType::kBFloat16;
    default:
      return DType::kFloat32;
  }
}

std::vector<int64_t> OperandShape(int64_t batch, int64_t rows, int64_t cols, bool transposed) {
  std::vector<int64_t> shape;
  if (batch > 0) shape.push_back(batch);
  shape.push_back(transposed ? cols : rows);
  shape.push_back(transposed ? rows : cols);
  return shape;
}

v1::Tensor RandomTensor(v1::DType dtype, const std::vector<int64_t>& shape, std::mt19937_64& rng,
                        float lo, float hi) {
  int64_t n = ElementCount(shape).value();
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> values(n);
  for (float& v : values) v = dist(rng);
  return TensorFromFloats(dtype, shape, values);
}

v1::Tensor TensorFromFloats(v1::DType dtype, const std::vector<int64_t>& shape,
                            const std::vector<float>& values) {
  std::string data(values.size() * ElementSize(dtype), '\0');
  FromFloat(ToHostDType(dtype), values.data(), data.data(), static_cast<int64_t>(values.size()));
  return MakeTensor(dtype, shape, std::move(data));
}

absl::StatusOr<std::vector<double>> TensorToDoubles(const v1::Tensor& tensor,
                                                    const std::string& name) {
  if (absl::Status s = CheckTensor(tensor, name); !s.ok()) return s;
  int64_t n = ElementCount(ShapeOf(tensor)).value();
  return reference::ToDoubles(ToHostDType(tensor.dtype()), tensor.data().data(), n);
}

absl::StatusOr<CheckResult> CheckGemm(const v1::GemmRequest& request,
                                      const v1::GemmResponse& response) {
  auto dims = ResolveGemm(request);
  if (!dims.ok()) return dims.status();
  auto a = TensorToDoubles(request.a(), "a");
  auto b = TensorToDoubles(request.b(), "b");
  if (!a.ok()) return a.status();
  if (!b.ok()) return b.status();
  std::vector<double> c;
  if (request.beta() != 0) {
    auto cv = TensorToDoubles(request.c(), "c");
    if (!cv.ok()) return cv.status();
    c = *std::move(cv);
  }
  double alpha = request.has_alpha() ? request.alpha() : 1.0;
  std::vector<double> want =
      reference::Gemm(*a, *b, request.beta() != 0 ? &c : nullptr, dims->batch, dims->m, dims->n,
                      dims->k, dims->a_batched, dims->b_batched, dims->c_batched,
                      request.transpose_a(), request.transpose_b(), alpha, request.beta());
  v1::DType out = OutputDType(request.options(), request.a().dtype());
  double rtol = reference::Rtol(ToHostDType(out), dims->k);
  double terms = std::abs(alpha) * MaxAbs(*a) * MaxAbs(*b) * std::sqrt(double(dims->k)) +
                 std::abs(request.beta()) * MaxAbs(c);
  CheckResult result = Passing();
  Compare("c", response.c(), out, dims->out_shape, want, AccumulationTolerance(dims->k) * terms,
          rtol, result);
  return result;
}

absl::StatusOr<CheckResult> CheckGemv(const v1::GemvRequest& request,
                                      const v1::GemvResponse& response) {
  for (const auto& [t, name] : {std::pair{&request.a(), "a"}, std::pair{&request.x(), "x"}}) {
    if (absl::Status s = CheckTensor(*t, name); !s.ok()) return s;
  }
  if (RankOf(request.a()) != 2) return Invalid("a.shape", "rank must be 2");
  if (RankOf(request.x()) != 1 && RankOf(request.x()) != 2) {
    return Invalid("x.shape", "rank must be 1 or 2");
  }
  const auto& as = request.a().shape();
  int64_t m = request.transpose_a() ? as[1] : as[0];
  int64_t k = request.transpose_a() ? as[0] : as[1];
  int64_t ncols = RankOf(request.x()) == 2 ? request.x().shape(1) : 1;
  if (request.x().shape(0) != k) return Invalid("x.shape", "does not match a");
  auto a = TensorToDoubles(request.a(), "a");
  auto x = TensorToDoubles(request.x(), "x");
  if (!a.ok()) return a.status();
  if (!x.ok()) return x.status();
  std::vector<double> y;
  if (request.beta() != 0) {
    auto yv = TensorToDoubles(request.y(), "y");
    if (!yv.ok()) return yv.status();
    if (static_cast<int64_t>(yv->size()) != m * ncols) {
      return Invalid("y.shape", "does not match the result");
    }
    y = *std::move(yv);
  }
  double alpha = request.has_alpha() ? request.alpha() : 1.0;
  std::vector<double> want = reference::Gemv(*a, *x, request.beta() != 0 ? &y : nullptr, m, k,
                                             ncols, request.transpose_a(), alpha, request.beta());
  std::vector<int64_t> out_shape =
      RankOf(request.x()) == 2 ? std::vector<int64_t>{m, ncols} : std::vector<int64_t>{m};
  v1::DType out = OutputDType(request.options(), request.a().dtype());
  double rtol = reference::Rtol(ToHostDType(out), k);
  double terms = std::abs(alpha) * MaxAbs(*a) * MaxAbs(*x) * std::sqrt(double(k)) +
                 std::abs(request.beta()) * MaxAbs(y);
  CheckResult result = Passing();
  Compare("y", response.y(), out, out_shape, want, AccumulationTolerance(k) * terms, rtol, result);
  return result;
}

absl::StatusOr<CheckResult> CheckReduce(const v1::ReduceRequest& request,
                                        const v1::ReduceResponse& response) {
  auto in = TensorToDoubles(request.input(), "input");
  if (!in.ok()) return in.status();
  std::vector<int64_t> shape = ShapeOf(request.input());
  const int rank = static_cast<int>(shape.size());
  int64_t outer = 1, axis_len = 1, inner = 1;
  std::vector<int64_t> out_shape;
  if (request.has_axis()) {
    int axis = request.axis() < 0 ? request.axis() + rank : request.axis();
    if (axis < 0 || axis >= rank) return Invalid("axis", "out of range");
    for (int i = 0; i < rank; ++i) {
      if (i < axis) outer *= shape[i];
      if (i > axis) inner *= shape[i];
      if (i == axis) {
        axis_len = shape[i];
        if (request.keepdims()) out_shape.push_back(1);
      } else {
        out_shape.push_back(shape[i]);
      }
    }
  } else {
    axis_len = static_cast<int64_t>(in->size());
    if (request.keepdims()) out_shape.assign(rank, 1);
  }
  reference::ReduceOp kind;
  switch (request.op()) {
    case v1::SUM:
      kind = reference::ReduceOp::kSum;
      break;
    case v1::MAX:
      kind = reference::ReduceOp::kMax;
      break;
    case v1::MIN:
      kind = reference::ReduceOp::kMin;
      break;
    case v1::MEAN:
      kind = reference::ReduceOp::kMean;
      break;
    default:
      return Invalid("op", "unspecified");
  }
  std::vector<double> want = reference::Reduce(*in, outer, axis_len, inner, kind);
  v1::DType out = OutputDType(request.options(), request.input().dtype());
  double rtol = reference::Rtol(ToHostDType(out), axis_len);
  double terms = 0;
  double depth = static_cast<double>(std::max<int64_t>(axis_len, 1));
  if (kind == reference::ReduceOp::kSum) terms = MaxAbs(*in) * std::sqrt(depth);
  if (kind == reference::ReduceOp::kMean) terms = MaxAbs(*in) / std::sqrt(depth);
  CheckResult result = Passing();
  Compare("output", response.output(), out, out_shape, want,
          AccumulationTolerance(axis_len) * terms, rtol, result);
  return result;
}

absl::StatusOr<CheckResult> CheckTranspose(const v1::TransposeRequest& request,
                                           const v1::TransposeResponse& response) {
  auto in = TensorToDoubles(request.input(), "input");
  if (!in.ok()) return in.status();
  std::vector<int64_t> shape = ShapeOf(request.input());
  const int rank = static_cast<int>(shape.size());
  std::vector<int> perm(request.perm().begin(), request.perm().end());
  if (perm.empty()) {
    for (int i = rank - 1; i >= 0; --i) perm.push_back(i);
  }
  if (static_cast<int>(perm.size()) != rank) return Invalid("perm", "size != rank");
  std::vector<bool> seen(rank, false);
  std::vector<int64_t> out_shape;
  for (int& p : perm) {
    if (p < 0) p += rank;  // numpy: negative axes count from the end
    if (p < 0 || p >= rank || seen[p]) return Invalid("perm", "not a permutation");
    seen[p] = true;
    out_shape.push_back(shape[p]);
  }
  std::vector<double> want = reference::Transpose(*in, shape, perm);
  v1::DType out = OutputDType(request.options(), request.input().dtype());
  double rtol = out == request.input().dtype() ? 0 : reference::Rtol(ToHostDType(out));
  CheckResult result = Passing();
  Compare("output", response.output(), out, out_shape, want, 0, rtol, result);
  return result;
}

absl::StatusOr<CheckResult> CheckAttention(const v1::AttentionRequest& request,
                                           const v1::AttentionResponse& response) {
  for (const auto& [t, name] :
       {std::pair{&request.q(), "q"}, std::pair{&request.k(), "k"}, std::pair{&request.v(), "v"}}) {
    if (absl::Status s = CheckTensor(*t, name); !s.ok()) return s;
    if (RankOf(*t) != 4) return Invalid(absl::StrCat(name, ".shape"), "rank must be 4");
  }
  const auto& qs = request.q().shape();
  const auto& ks = request.k().shape();
  int64_t batch = qs[0], heads_q = qs[1], seq_q = qs[2], head_dim = qs[3];
  int64_t heads_kv = ks[1], seq_kv = ks[2];
  if (ks[0] != batch || ks[3] != head_dim || heads_kv <= 0 || heads_q % heads_kv != 0 ||
      ShapeOf(request.v()) != ShapeOf(request.k())) {
    return Invalid("k.shape", "does not match q");
  }
  auto q = TensorToDoubles(request.q(), "q");
  auto k = TensorToDoubles(request.k(), "k");
  auto v = TensorToDoubles(request.v(), "v");
  if (!q.ok()) return q.status();
  if (!k.ok()) return k.status();
  if (!v.ok()) return v.status();
  double scale = request.scale() != 0 ? request.scale() : 1.0 / std::sqrt(double(head_dim));
  reference::AttentionResult want = reference::Attention(
      *q, *k, *v, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, request.causal(), scale);
  v1::DType out = OutputDType(request.options(), request.q().dtype());
  // The probabilities may be rounded to the inputs' dtype before P V (see
  // AttentionResponse.o): the coarser of the two dtypes bounds the error.
  double rtol = std::max(reference::Rtol(ToHostDType(out), seq_kv),
                         reference::Rtol(ToHostDType(request.q().dtype()), seq_kv));
  CheckResult result = Passing();
  Compare("o", response.o(), out, {batch, heads_q, seq_q, head_dim}, want.o, rtol * MaxAbs(*v),
          rtol, result);
  if (request.return_lse()) {
    // Logits are fp32 dot products of the (exact) inputs; their error bounds
    // the log-sum-exp's.
    double lse_rtol = reference::Rtol(DType::kFloat32, head_dim);
    double logit = scale * MaxAbs(*q) * MaxAbs(*k) * std::sqrt(double(head_dim));
    Compare("lse", response.lse(), v1::FLOAT32, {batch, heads_q, seq_q}, want.lse,
            lse_rtol * (1 + logit), lse_rtol, result);
  }
  return result;
}

absl::StatusOr<CheckResult> CheckEcho(const v1::EchoRequest& request,
                                      const v1::EchoResponse& response) {
  if (absl::Status s = CheckTensor(request.input(), "input"); !s.ok()) return s;
  CheckResult result = Passing();
  const v1::Tensor& got = response.output();
  if (got.dtype() != request.input().dtype() || ShapeOf(got) != ShapeOf(request.input())) {
    result.ok = false;
    result.message =
        absl::StrCat("output: ", DTypeName(got.dtype()), ShapeString(ShapeOf(got)), ", expected ",
                     DTypeName(request.input().dtype()), ShapeString(ShapeOf(request.input())));
  } else if (got.data() != request.input().data()) {
    result.ok = false;
    result.message = "output.data: differs from the input";
  }
  return result;
}

absl::StatusOr<CheckResult> CheckBatchItem(const v1::BatchRequest& request,
                                           const v1::BatchResponse& response) {
  if (response.code() != 0) {
    return Invalid("response.code", absl::StrCat(response.code(), ": ", response.message()));
  }
  if (static_cast<int>(request.op_case()) != static_cast<int>(response.result_case()) - 2) {
    return Invalid("response.result", "does not answer the request's operation");
  }
  switch (request.op_case()) {
    case v1::BatchRequest::kGemm:
      return CheckGemm(request.gemm(), response.gemm());
    case v1::BatchRequest::kGemv:
      return CheckGemv(request.gemv(), response.gemv());
    case v1::BatchRequest::kReduce:
      return CheckReduce(request.reduce(), response.reduce());
    case v1::BatchRequest::kTranspose:
      return CheckTranspose(request.transpose(), response.transpose());
    case v1::BatchRequest::kAttention:
      return CheckAttention(request.attention(), response.attention());
    default:
      return Invalid("request.op", "not set");
  }
}

Work WorkOf(const v1::GemmRequest& request) {
  Work w;
  auto dims = ResolveGemm(request);
  if (!dims.ok()) return w;
  int64_t out_size = ElementSize(OutputDType(request.options(), request.a().dtype()));
  w.bytes = double(PayloadBytes(request.a()) + PayloadBytes(request.b())) +
            double(dims->batch * dims->m * dims->n * out_size);
  if (request.beta() != 0) w.bytes += double(PayloadBytes(request.c()));
  w.flops = 2.0 * double(dims->batch) * double(dims->m) * double(dims->n) * double(dims->k);
  return w;
}

Work WorkOf(const v1::GemvRequest& request) {
  Work w;
  if (request.a().shape_size() != 2 || request.x().shape_size() < 1) return w;
  int64_t m = request.transpose_a() ? request.a().shape(1) : request.a().shape(0);
  int64_t k = request.transpose_a() ? request.a().shape(0) : request.a().shape(1);
  int64_t ncols = request.x().shape_size() == 2 ? request.x().shape(1) : 1;
  int64_t out_size = ElementSize(OutputDType(request.options(), request.a().dtype()));
  w.bytes = double(PayloadBytes(request.a()) + PayloadBytes(request.x()) + m * ncols * out_size);
  if (request.beta() != 0) w.bytes += double(PayloadBytes(request.y()));
  w.flops = 2.0 * double(m) * double(k) * double(ncols);
  return w;
}

Work WorkOf(const v1::ReduceRequest& request) {
  Work w;
  w.bytes = double(PayloadBytes(request.input()));
  return w;
}

Work WorkOf(const v1::TransposeRequest& request) {
  Work w;
  int64_t in_size = ElementSize(request.input().dtype());
  int64_t out_size = ElementSize(OutputDType(request.options(), request.input().dtype()));
  w.bytes = in_size == 0 ? 0
                         : double(PayloadBytes(request.input())) *
                               (1.0 + double(out_size) / double(in_size));
  return w;
}

Work WorkOf(const v1::AttentionRequest& request) {
  Work w;
  if (request.q().shape_size() != 4 || request.k().shape_size() != 4) return w;
  double b = double(request.q().shape(0)), hq = double(request.q().shape(1));
  double sq = double(request.q().shape(2)), d = double(request.q().shape(3));
  double skv = double(request.k().shape(2));
  w.bytes =
      double(PayloadBytes(request.q()) + PayloadBytes(request.k()) + PayloadBytes(request.v())) +
      double(PayloadBytes(request.q())) *
          double(ElementSize(OutputDType(request.options(), request.q().dtype()))) /
          double(std::max<int64_t>(1, ElementSize(request.q().dtype())));
  w.flops = 4.0 * b * hq * sq * skv * d;
  if (request.causal()) w.flops /= 2;
  return w;
}

}  // namespace gpucompute
