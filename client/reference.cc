#include "client/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace gpucompute::reference {

std::vector<double> Gemm(const std::vector<double>& a, const std::vector<double>& b,
                         const std::vector<double>* c, int64_t batch, int64_t m, int64_t n,
                         int64_t k, bool a_batched, bool b_batched, bool c_batched, bool trans_a,
                         bool trans_b, double alpha, double beta) {
  std::vector<double> out(static_cast<size_t>(batch * m * n));
  for (int64_t e = 0; e < batch; ++e) {
    const double* ae = a.data() + (a_batched ? e : 0) * m * k;
    const double* be = b.data() + (b_batched ? e : 0) * k * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double aip = trans_a ? ae[p * m + i] : ae[i * k + p];
          const double bpj = trans_b ? be[j * k + p] : be[p * n + j];
          s += aip * bpj;
        }
        double v = alpha * s;
        if (beta != 0) v += beta * (*c)[size_t((c_batched ? e : 0) * m * n + i * n + j)];
        out[size_t(e * m * n + i * n + j)] = v;
      }
    }
  }
  return out;
}

std::vector<double> Gemv(const std::vector<double>& a, const std::vector<double>& x,
                         const std::vector<double>* y, int64_t m, int64_t k, int64_t ncols,
                         bool trans_a, double alpha, double beta) {
  std::vector<double> out(static_cast<size_t>(m * ncols));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t c = 0; c < ncols; ++c) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        s += (trans_a ? a[size_t(p * m + i)] : a[size_t(i * k + p)]) * x[size_t(p * ncols + c)];
      }
      double v = alpha * s;
      if (beta != 0) v += beta * (*y)[size_t(i * ncols + c)];
      out[size_t(i * ncols + c)] = v;
    }
  }
  return out;
}

std::vector<double> Reduce(const std::vector<double>& in, int64_t outer, int64_t axis_len,
                           int64_t inner, ReduceOp kind) {
  std::vector<double> out(static_cast<size_t>(outer * inner));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      double acc = 0;
      if (kind == ReduceOp::kMax) acc = -std::numeric_limits<double>::infinity();
      if (kind == ReduceOp::kMin) acc = std::numeric_limits<double>::infinity();
      bool nan = false;
      for (int64_t a = 0; a < axis_len; ++a) {
        const double x = in[size_t((o * axis_len + a) * inner + i)];
        nan = nan || std::isnan(x);
        switch (kind) {
          case ReduceOp::kSum:
          case ReduceOp::kMean:
            acc += x;
            break;
          case ReduceOp::kMax:
            acc = std::max(acc, x);
            break;
          case ReduceOp::kMin:
            acc = std::min(acc, x);
            break;
        }
      }
      if (nan) acc = std::numeric_limits<double>::quiet_NaN();
      if (kind == ReduceOp::kMean) acc /= static_cast<double>(axis_len);
      out[size_t(o * inner + i)] = acc;
    }
  }
  return out;
}

std::vector<double> Transpose(const std::vector<double>& in, const std::vector<int64_t>& shape,
                              const std::vector<int>& perm) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int64_t> in_strides(rank, 1);
  for (int i = rank - 2; i >= 0; --i) in_strides[i] = in_strides[i + 1] * shape[i + 1];
  std::vector<int64_t> out_shape(rank);
  for (int i = 0; i < rank; ++i) out_shape[i] = shape[perm[i]];
  int64_t total = 1;
  for (int64_t d : shape) total *= d;
  std::vector<double> out(static_cast<size_t>(total));
  std::vector<int64_t> idx(rank, 0);  // output coordinates
  for (int64_t flat = 0; flat < total; ++flat) {
    int64_t src = 0;
    for (int i = 0; i < rank; ++i) src += idx[i] * in_strides[perm[i]];
    out[size_t(flat)] = in[size_t(src)];
    for (int i = rank - 1; i >= 0; --i) {
      if (++idx[i] < out_shape[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}

AttentionResult Attention(const std::vector<double>& q, const std::vector<double>& k,
                          const std::vector<double>& v, int64_t batch, int64_t heads_q,
                          int64_t heads_kv, int64_t seq_q, int64_t seq_kv, int64_t head_dim,
                          bool causal, double scale) {
  AttentionResult r;
  r.o.assign(size_t(batch * heads_q * seq_q * head_dim), 0.0);
  r.lse.assign(size_t(batch * heads_q * seq_q), -std::numeric_limits<double>::infinity());
  const int64_t group = heads_q / heads_kv;
  std::vector<double> logits(static_cast<size_t>(seq_kv));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads_q; ++h) {
      const int64_t hk = h / group;
      const double* kh = k.data() + (b * heads_kv + hk) * seq_kv * head_dim;
      const double* vh = v.data() + (b * heads_kv + hk) * seq_kv * head_dim;
      for (int64_t i = 0; i < seq_q; ++i) {
        const int64_t row = (b * heads_q + h) * seq_q + i;
        const double* qi = q.data() + row * head_dim;
        const int64_t visible =
            causal ? std::clamp<int64_t>(i + seq_kv - seq_q + 1, 0, seq_kv) : seq_kv;
        if (visible == 0) continue;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          double s = 0;
          for (int64_t d = 0; d < head_dim; ++d) s += qi[d] * kh[j * head_dim + d];
          logits[size_t(j)] = scale * s;
          mx = std::max(mx, logits[size_t(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j < visible; ++j) {
          logits[size_t(j)] = std::exp(logits[size_t(j)] - mx);
          sum += logits[size_t(j)];
        }
        double* oi = r.o.data() + row * head_dim;
        for (int64_t j = 0; j < visible; ++j) {
          const double p = logits[size_t(j)] / sum;
          for (int64_t d = 0; d < head_dim; ++d) oi[d] += p * vh[j * head_dim + d];
        }
        r.lse[size_t(row)] = mx + std::log(sum);
      }
    }
  }
  return r;
}

std::vector<double> ToDoubles(DType dtype, const void* data, int64_t n) {
  std::vector<double> out(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = LoadAsDouble(dtype, data, i);
  return out;
}

double Rtol(DType dtype, int64_t depth) {
  // fp32 accumulation of `depth` terms (pairwise or blocked orders grow about
  // with sqrt(depth)) plus the rounding of the stored result.
  const double accumulate =
      4e-7 * (2.0 + std::sqrt(static_cast<double>(std::max<int64_t>(depth, 1))));
  switch (dtype) {
    case DType::kFloat32:
      return accumulate;
    case DType::kFloat16:
      return 2.0 * std::ldexp(1.0, -11) + accumulate;  // 2 half-ulps of binary16
    case DType::kBFloat16:
      return 2.0 * std::ldexp(1.0, -8) + accumulate;  // 2 half-ulps of bfloat16
  }
  return accumulate;
}

std::string CompareClose(const std::vector<double>& got, const std::vector<double>& want,
                         double atol, double rtol) {
  if (got.size() != want.size()) {
    return absl::StrCat("size mismatch: got ", got.size(), " values, want ", want.size());
  }
  int64_t bad = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    bool ok;
    if (std::isnan(w) || std::isnan(g)) {
      ok = std::isnan(w) && std::isnan(g);
    } else if (std::isinf(w) || std::isinf(g)) {
      ok = g == w;
    } else {
      ok = std::abs(g - w) <= atol + rtol * std::abs(w);
    }
    if (!ok) {
      if (bad < 5) absl::StrAppend(&first, bad == 0 ? "" : "; ", "[", i, "] got ", g, " want ", w);
      ++bad;
    }
  }
  if (bad == 0) return "";
  return absl::StrCat(bad, " of ", got.size(), " values differ beyond atol ", atol, " + rtol ",
                      rtol, ": ", first);
}

}  // namespace gpucompute::reference
