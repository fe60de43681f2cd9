// The operation subcommands (gemm, gemv, reduce, transpose, attention), echo
// and info: build a request from flags (random inputs or .npy files), call
// the server (with --resident: on uploaded operands, keeping the result
// there), print latency, throughput and shard timings, optionally check
// against the float64 reference and write the result.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/cli.h"

// Sizes. -1 means the operation's default (shown in each flag's help).
ABSL_FLAG(int64_t, m, -1, "gemm, gemv: rows of the result (default 512 / 2048).");
ABSL_FLAG(int64_t, n, -1,
          "gemm: columns of the result (default 512); gemv: columns of x, 1..8, or 0 for a "
          "vector x (default 0).");
ABSL_FLAG(int64_t, k, -1, "gemm, gemv: the inner dimension (default 512 / 2048).");
ABSL_FLAG(int64_t, batch, -1,
          "gemm: batch entries of A, 0 for a plain matrix (default 0); attention: B (default 1).");
ABSL_FLAG(bool, batch_b, false, "gemm: B is batched too ([batch, K, N]).");
ABSL_FLAG(bool, transpose_a, false, "gemm, gemv: op(A) = A^T.");
ABSL_FLAG(bool, transpose_b, false, "gemm: op(B) = B^T.");
ABSL_FLAG(double, alpha, 1.0, "gemm, gemv: scale of the product.");
ABSL_FLAG(double, beta, 0.0, "gemm, gemv: scale of C / y (a random C / y is sent when != 0).");
ABSL_FLAG(std::string, shape, "", "reduce, transpose, echo, upload: input shape, e.g. 1000,33.");
ABSL_FLAG(std::string, op, "sum", "reduce: sum, max, min or mean.");
ABSL_FLAG(std::string, axis, "", "reduce: the axis (negative counts from the end); empty: all.");
ABSL_FLAG(bool, keepdims, false, "reduce: keep the reduced axis with size 1.");
ABSL_FLAG(std::string, perm, "", "transpose: a permutation such as 2,0,1 (empty: reverse).");
ABSL_FLAG(int64_t, heads_q, 8, "attention: query heads Hq.");
ABSL_FLAG(int64_t, heads_kv, 0, "attention: key/value heads Hkv (0: Hq).");
ABSL_FLAG(int64_t, seq_q, 256, "attention: query length Sq.");
ABSL_FLAG(int64_t, seq_kv, 0, "attention: key length Skv (0: Sq).");
ABSL_FLAG(int64_t, head_dim, 64, "attention: head dimension D.");
ABSL_FLAG(bool, causal, false, "attention: causal mask (aligned bottom-right).");
ABSL_FLAG(double, scale, 0.0, "attention: softmax scale (0: 1/sqrt(D)).");
ABSL_FLAG(bool, lse, false, "attention: also return the log-sum-exp.");
ABSL_FLAG(std::string, a, "", "gemm, gemv: A from this .npy file.");
ABSL_FLAG(std::string, b, "", "gemm: B from this .npy file.");
ABSL_FLAG(std::string, c, "", "gemm: C from this .npy file (with --beta).");
ABSL_FLAG(std::string, x, "", "gemv: x from this .npy file.");
ABSL_FLAG(std::string, y, "", "gemv: y from this .npy file (with --beta).");
ABSL_FLAG(std::string, input, "", "reduce, transpose, echo: the input from this .npy file.");
ABSL_FLAG(std::string, query, "", "attention: Q from this .npy file.");
ABSL_FLAG(std::string, key, "", "attention: K from this .npy file.");
ABSL_FLAG(std::string, value, "", "attention: V from this .npy file.");
ABSL_FLAG(bool, check, false,
          "Check the result against the float64 reference; exit 3 on a mismatch.");
ABSL_FLAG(std::string, out, "",
          "Write the result (download: the resident tensor) to this .npy file.");
ABSL_FLAG(std::string, lse_out, "", "attention: write the log-sum-exp to this .npy file.");
ABSL_FLAG(int, repeat, 1, "Send the request this many times; latency is reported over all.");
ABSL_FLAG(std::string, service, "",
          "health: the service whose status is asked (empty: the whole server; "
          "gpucompute.v1.Compute: the compute service, NOT_SERVING while draining).");

namespace gpucompute::cli {
namespace {

int64_t FlagOr(int64_t value, int64_t fallback) { return value >= 0 ? value : fallback; }

absl::StatusOr<v1::BatchRequest> BuildGemm(v1::DType dtype, std::mt19937_64& rng) {
  v1::BatchRequest request;
  v1::GemmRequest& g = *request.mutable_gemm();
  g.set_transpose_a(absl::GetFlag(FLAGS_transpose_a));
  g.set_transpose_b(absl::GetFlag(FLAGS_transpose_b));
  int64_t m = FlagOr(absl::GetFlag(FLAGS_m), 512);
  int64_t n = FlagOr(absl::GetFlag(FLAGS_n), 512);
  int64_t k = FlagOr(absl::GetFlag(FLAGS_k), 512);
  int64_t batch = FlagOr(absl::GetFlag(FLAGS_batch), 0);
  // Sizes come from the files when given, so that the random operands fit.
  absl::StatusOr<v1::Tensor> a;
  if (!absl::GetFlag(FLAGS_a).empty()) {
    a = LoadNpyTensor(absl::GetFlag(FLAGS_a), dtype);
    if (!a.ok()) return a.status();
    const auto& s = a->shape();
    if (s.size() == 2 || s.size() == 3) {
      int o = s.size() == 3 ? 1 : 0;
      batch = o ? s[0] : 0;
      m = g.transpose_a() ? s[o + 1] : s[o];
      k = g.transpose_a() ? s[o] : s[o + 1];
    }
  } else {
    a = RandomTensor(dtype, OperandShape(batch, m, k, g.transpose_a()), rng);
  }
  bool b_batched = batch > 0 && absl::GetFlag(FLAGS_batch_b);
  auto b =
      absl::GetFlag(FLAGS_b).empty()
          ? RandomTensor(dtype, OperandShape(b_batched ? batch : 0, k, n, g.transpose_b()), rng)
          : LoadNpyTensor(absl::GetFlag(FLAGS_b), dtype);
  if (!b.ok()) return b.status();
  if (!absl::GetFlag(FLAGS_b).empty() && b->shape_size() >= 2) {
    n = g.transpose_b() ? b->shape(b->shape_size() - 2) : b->shape(b->shape_size() - 1);
  }
  *g.mutable_a() = *std::move(a);
  *g.mutable_b() = *std::move(b);
  if (absl::GetFlag(FLAGS_alpha) != 1.0) g.set_alpha(absl::GetFlag(FLAGS_alpha));
  g.set_beta(absl::GetFlag(FLAGS_beta));
  if (g.beta() != 0 || !absl::GetFlag(FLAGS_c).empty()) {
    std::vector<int64_t> c_shape = OperandShape(batch, m, n, false);
    auto c = LoadOrRandom(absl::GetFlag(FLAGS_c), dtype, c_shape, rng);
    if (!c.ok()) return c.status();
    *g.mutable_c() = *std::move(c);
  }
  return request;
}

absl::StatusOr<v1::BatchRequest> BuildGemv(v1::DType dtype, std::mt19937_64& rng) {
  v1::BatchRequest request;
  v1::GemvRequest& g = *request.mutable_gemv();
  g.set_transpose_a(absl::GetFlag(FLAGS_transpose_a));
  int64_t m = FlagOr(absl::GetFlag(FLAGS_m), 2048);
  int64_t k = FlagOr(absl::GetFlag(FLAGS_k), 2048);
  int64_t ncols = FlagOr(absl::GetFlag(FLAGS_n), 0);
  auto a = LoadOrRandom(absl::GetFlag(FLAGS_a), dtype, OperandShape(0, m, k, g.transpose_a()), rng);
  if (!a.ok()) return a.status();
  if (!absl::GetFlag(FLAGS_a).empty() && a->shape_size() == 2) {
    m = g.transpose_a() ? a->shape(1) : a->shape(0);
    k = g.transpose_a() ? a->shape(0) : a->shape(1);
  }
  std::vector<int64_t> x_shape =
      ncols == 0 ? std::vector<int64_t>{k} : std::vector<int64_t>{k, ncols};
  auto x = LoadOrRandom(absl::GetFlag(FLAGS_x), dtype, x_shape, rng);
  if (!x.ok()) return x.status();
  *g.mutable_a() = *std::move(a);
  if (absl::GetFlag(FLAGS_alpha) != 1.0) g.set_alpha(absl::GetFlag(FLAGS_alpha));
  g.set_beta(absl::GetFlag(FLAGS_beta));
  if (g.beta() != 0 || !absl::GetFlag(FLAGS_y).empty()) {
    std::vector<int64_t> y_shape =
        x->shape_size() == 2 ? std::vector<int64_t>{m, x->shape(1)} : std::vector<int64_t>{m};
    auto y = LoadOrRandom(absl::GetFlag(FLAGS_y), dtype, y_shape, rng);
    if (!y.ok()) return y.status();
    *g.mutable_y() = *std::move(y);
  }
  *g.mutable_x() = *std::move(x);
  return request;
}

absl::StatusOr<v1::Tensor> ShapedInput(v1::DType dtype, const std::string& default_shape,
                                       std::mt19937_64& rng) {
  std::string text =
      absl::GetFlag(FLAGS_shape).empty() ? default_shape : absl::GetFlag(FLAGS_shape);
  auto shape = ParseShape(text, "shape");
  if (!shape.ok()) return shape.status();
  return LoadOrRandom(absl::GetFlag(FLAGS_input), dtype, *shape, rng);
}

absl::StatusOr<v1::BatchRequest> BuildReduce(v1::DType dtype, std::mt19937_64& rng) {
  v1::BatchRequest request;
  v1::ReduceRequest& r = *request.mutable_reduce();
  auto input = ShapedInput(dtype, "1000,33", rng);
  if (!input.ok()) return input.status();
  *r.mutable_input() = *std::move(input);
  std::string op = absl::AsciiStrToLower(absl::GetFlag(FLAGS_op));
  if (op == "sum") {
    r.set_op(v1::SUM);
  } else if (op == "max") {
    r.set_op(v1::MAX);
  } else if (op == "min") {
    r.set_op(v1::MIN);
  } else if (op == "mean") {
    r.set_op(v1::MEAN);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--op: \"", op, "\" is not one of sum, max, min, mean"));
  }
  if (!absl::GetFlag(FLAGS_axis).empty()) {
    int axis = 0;
    if (!absl::SimpleAtoi(absl::GetFlag(FLAGS_axis), &axis)) {
      return absl::InvalidArgumentError("--axis: not an integer");
    }
    r.set_has_axis(true);
    r.set_axis(axis);
  }
  r.set_keepdims(absl::GetFlag(FLAGS_keepdims));
  return request;
}

absl::StatusOr<v1::BatchRequest> BuildTranspose(v1::DType dtype, std::mt19937_64& rng) {
  v1::BatchRequest request;
  v1::TransposeRequest& t = *request.mutable_transpose();
  auto input = ShapedInput(dtype, "1024,1024", rng);
  if (!input.ok()) return input.status();
  *t.mutable_input() = *std::move(input);
  auto perm = ParseShape(absl::GetFlag(FLAGS_perm), "perm");
  if (!perm.ok()) return perm.status();
  for (int64_t p : *perm) t.add_perm(static_cast<int32_t>(p));
  return request;
}

absl::StatusOr<v1::BatchRequest> BuildAttention(v1::DType dtype, std::mt19937_64& rng) {
  v1::BatchRequest request;
  v1::AttentionRequest& at = *request.mutable_attention();
  int64_t b = FlagOr(absl::GetFlag(FLAGS_batch), 1);
  int64_t hq = absl::GetFlag(FLAGS_heads_q);
  int64_t hkv = absl::GetFlag(FLAGS_heads_kv) > 0 ? absl::GetFlag(FLAGS_heads_kv) : hq;
  int64_t sq = absl::GetFlag(FLAGS_seq_q);
  int64_t skv = absl::GetFlag(FLAGS_seq_kv) > 0 ? absl::GetFlag(FLAGS_seq_kv) : sq;
  int64_t d = absl::GetFlag(FLAGS_head_dim);
  auto q = LoadOrRandom(absl::GetFlag(FLAGS_query), dtype, {b, hq, sq, d}, rng);
  auto k = LoadOrRandom(absl::GetFlag(FLAGS_key), dtype, {b, hkv, skv, d}, rng);
  auto v = LoadOrRandom(absl::GetFlag(FLAGS_value), dtype, {b, hkv, skv, d}, rng);
  if (!q.ok()) return q.status();
  if (!k.ok()) return k.status();
  if (!v.ok()) return v.status();
  *at.mutable_q() = *std::move(q);
  *at.mutable_k() = *std::move(k);
  *at.mutable_v() = *std::move(v);
  at.set_causal(absl::GetFlag(FLAGS_causal));
  at.set_scale(absl::GetFlag(FLAGS_scale));
  at.set_return_lse(absl::GetFlag(FLAGS_lse));
  return request;
}

std::string Describe(const v1::Tensor& t) { return absl::StrCat(ShapeString(ShapeOf(t))); }

// One line naming the operation and its operands.
std::string Summary(const v1::BatchRequest& r, uint64_t seed) {
  std::string s;
  switch (r.op_case()) {
    case v1::BatchRequest::kGemm: {
      const auto& g = r.gemm();
      s = absl::StrCat("gemm ", DTypeName(g.a().dtype()), " a", Describe(g.a()),
                       g.transpose_a() ? "^T" : "", " b", Describe(g.b()),
                       g.transpose_b() ? "^T" : "");
      if (g.beta() != 0) absl::StrAppend(&s, " c", Describe(g.c()), " beta=", g.beta());
      if (g.has_alpha()) absl::StrAppend(&s, " alpha=", g.alpha());
      break;
    }
    case v1::BatchRequest::kGemv: {
      const auto& g = r.gemv();
      s = absl::StrCat("gemv ", DTypeName(g.a().dtype()), " a", Describe(g.a()),
                       g.transpose_a() ? "^T" : "", " x", Describe(g.x()));
      if (g.beta() != 0) absl::StrAppend(&s, " y", Describe(g.y()), " beta=", g.beta());
      break;
    }
    case v1::BatchRequest::kReduce: {
      const auto& red = r.reduce();
      s = absl::StrCat("reduce ", absl::AsciiStrToLower(v1::ReduceOp_Name(red.op())), " ",
                       DTypeName(red.input().dtype()), " input", Describe(red.input()),
                       red.has_axis() ? absl::StrCat(" axis=", red.axis()) : " (all)",
                       red.keepdims() ? " keepdims" : "");
      break;
    }
    case v1::BatchRequest::kTranspose: {
      const auto& t = r.transpose();
      s = absl::StrCat("transpose ", DTypeName(t.input().dtype()), " input", Describe(t.input()),
                       " perm=[", absl::StrJoin(t.perm(), ","), "]");
      break;
    }
    case v1::BatchRequest::kAttention: {
      const auto& at = r.attention();
      s = absl::StrCat("attention ", DTypeName(at.q().dtype()), " q", Describe(at.q()), " k",
                       Describe(at.k()), at.causal() ? " causal" : "",
                       at.return_lse() ? " lse" : "");
      break;
    }
    default:
      break;
  }
  absl::StrAppend(&s, " (seed ", seed, ")");
  return s;
}

const v1::Timings* TimingsOf(const v1::BatchResponse& r) {
  switch (r.result_case()) {
    case v1::BatchResponse::kGemm:
      return &r.gemm().timings();
    case v1::BatchResponse::kGemv:
      return &r.gemv().timings();
    case v1::BatchResponse::kReduce:
      return &r.reduce().timings();
    case v1::BatchResponse::kTranspose:
      return &r.transpose().timings();
    case v1::BatchResponse::kAttention:
      return &r.attention().timings();
    default:
      return nullptr;
  }
}

const v1::Tensor* ResultOf(const v1::BatchResponse& r) {
  switch (r.result_case()) {
    case v1::BatchResponse::kGemm:
      return &r.gemm().c();
    case v1::BatchResponse::kGemv:
      return &r.gemv().y();
    case v1::BatchResponse::kReduce:
      return &r.reduce().output();
    case v1::BatchResponse::kTranspose:
      return &r.transpose().output();
    case v1::BatchResponse::kAttention:
      return &r.attention().o();
    default:
      return nullptr;
  }
}

void PrintTimings(const v1::Timings& t) {
  std::cout << absl::StrFormat("server %.3f ms  queue %.3f ms  receive %.3f ms\n",
                               t.server_seconds() * 1e3, t.queue_seconds() * 1e3,
                               t.receive_seconds() * 1e3);
  if (t.decode_seconds() + t.host_to_device_seconds() + t.kernel_seconds() +
          t.device_to_host_seconds() + t.encode_seconds() >
      0) {
    std::cout << absl::StrFormat(
        "stages decode %.3f ms  h2d %.3f ms  kernel %.3f ms  d2h %.3f ms  encode %.3f ms\n",
        t.decode_seconds() * 1e3, t.host_to_device_seconds() * 1e3, t.kernel_seconds() * 1e3,
        t.device_to_host_seconds() * 1e3, t.encode_seconds() * 1e3);
  }
  if (t.shards().empty()) return;
  int variant_width = 7;
  for (const v1::ShardTiming& s : t.shards()) {
    variant_width = std::max(variant_width, static_cast<int>(s.variant().size()));
  }
  std::cout << absl::StrFormat("  %-6s %-*s %-10s %-21s %10s %10s %10s %10s\n", "device",
                               variant_width, "variant", "axis", "range", "kernel ms", "xfer ms",
                               "GB/s", "GFLOP/s");
  for (const v1::ShardTiming& s : t.shards()) {
    std::cout << absl::StrFormat("  %-6d %-*s %-10s %-21s %10.3f %10.3f %10.2f %10.2f\n",
                                 s.device(), variant_width, s.variant(), s.axis(),
                                 absl::StrCat("[", s.begin(), ",", s.end(), ")"),
                                 s.kernel_seconds() * 1e3, s.transfer_seconds() * 1e3,
                                 s.bytes_per_second() / 1e9, s.flops_per_second() / 1e9);
  }
}

}  // namespace

absl::StatusOr<v1::BatchRequest> BuildRequest(const std::string& op, std::mt19937_64& rng) {
  auto dtype = InputDType();
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<v1::BatchRequest> request;
  if (op == "gemm") {
    request = BuildGemm(*dtype, rng);
  } else if (op == "gemv") {
    request = BuildGemv(*dtype, rng);
  } else if (op == "reduce") {
    request = BuildReduce(*dtype, rng);
  } else if (op == "transpose") {
    request = BuildTranspose(*dtype, rng);
  } else if (op == "attention") {
    request = BuildAttention(*dtype, rng);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown operation \"", op, "\""));
  }
  if (!request.ok()) return request.status();
  auto options = MakeOpOptions();
  if (!options.ok()) return options.status();
  *MutableOptions(*request) = *std::move(options);
  request->set_id(op);
  return request;
}

int RunOp(const std::string& op) {
  uint64_t seed = 0;
  std::mt19937_64 rng = MakeRng(seed);
  auto request = BuildRequest(op, rng);
  if (!request.ok()) {
    PrintError(op, request.status());
    return kExitUsage;
  }
  auto client = MakeClient();
  if (!client.ok()) {
    PrintError("client", client.status());
    return kExitUsage;
  }
  std::cout << Summary(*request, seed) << "\n";

  // With --resident the operands go first and the call names them by handle;
  // `request` keeps the inline operands for --check.
  const bool resident = ResidentMode();
  HandleScope handles(**client);
  v1::BatchRequest sent = *request;
  TransferCost upload;
  if (resident) {
    auto cost = MakeResident(**client, sent, handles);
    if (!cost.ok()) {
      PrintError("upload", cost.status());
      return kExitCallFailed;
    }
    upload = *cost;
  }

  const int repeat = std::max(1, absl::GetFlag(FLAGS_repeat));
  std::vector<double> latencies;
  v1::BatchResponse response;
  for (int i = 0; i < repeat; ++i) {
    auto start = std::chrono::steady_clock::now();
    response = CallUnary(**client, sent, MakeCallOptions());
    latencies.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (response.code() != 0) {
      PrintError(op,
                 absl::Status(static_cast<absl::StatusCode>(response.code()), response.message()));
      return kExitCallFailed;
    }
    const std::vector<std::string> kept = KeptHandles(response);
    handles.Add(kept);
    if (i + 1 < repeat) {  // only the last result is used
      if (absl::Status s = handles.Free(kept); !s.ok()) {
        PrintError("free", s);
        return kExitCallFailed;
      }
    }
  }
  const bool want_result = absl::GetFlag(FLAGS_check) || !absl::GetFlag(FLAGS_out).empty() ||
                           !absl::GetFlag(FLAGS_lse_out).empty();
  if (resident) {
    std::string line = absl::StrCat("resident: upload ", FormatCost(upload),
                                    absl::StrFormat("  call %.3f ms", latencies.back() * 1e3));
    if (want_result) {
      auto download = DownloadKept(**client, response);
      if (!download.ok()) {
        PrintError("download", download.status());
        return kExitCallFailed;
      }
      absl::StrAppend(&line, "  download ", FormatCost(*download));
    }
    std::cout << line << "\n";
  }
  std::sort(latencies.begin(), latencies.end());
  double median = latencies[latencies.size() / 2];
  Work work = WorkOfRequest(*request);
  std::cout << absl::StrFormat("latency %.3f ms", median * 1e3);
  if (repeat > 1) {
    std::cout << absl::StrFormat(" (median of %d; min %.3f ms, max %.3f ms)", repeat,
                                 latencies.front() * 1e3, latencies.back() * 1e3);
  }
  std::cout << absl::StrFormat("  |  %.3f GB/s", work.bytes / median / 1e9);
  if (work.flops > 0) std::cout << absl::StrFormat("  %.3f GFLOP/s", work.flops / median / 1e9);
  std::cout << "\n";
  const v1::Tensor* result = ResultOf(response);
  std::cout << "result " << DTypeName(result->dtype()) << ShapeString(ShapeOf(*result)) << "\n";
  if (const v1::Timings* t = TimingsOf(response)) PrintTimings(*t);

  int exit_code = kExitOk;
  if (absl::GetFlag(FLAGS_check)) {
    auto check = CheckBatchItem(*request, response);
    if (!check.ok()) {
      PrintError("check", check.status());
      exit_code = kExitMismatch;
    } else if (!check->ok) {
      std::cout << "check: MISMATCH " << check->message << "\n";
      exit_code = kExitMismatch;
    } else {
      std::cout << absl::StrFormat("check: OK (max |err| %.3g, atol %.3g, rtol %.3g)\n",
                                   check->max_abs_error, check->atol, check->rtol);
    }
  }
  if (!absl::GetFlag(FLAGS_out).empty()) {
    if (absl::Status s = SaveNpyTensor(absl::GetFlag(FLAGS_out), *result); !s.ok()) {
      PrintError("--out", s);
      return kExitUsage;
    }
    std::cout << "wrote " << absl::GetFlag(FLAGS_out) << "\n";
  }
  if (!absl::GetFlag(FLAGS_lse_out).empty()) {
    if (response.result_case() != v1::BatchResponse::kAttention ||
        !response.attention().has_lse()) {
      PrintError("--lse_out", absl::InvalidArgumentError("needs attention with --lse"));
      return kExitUsage;
    }
    if (absl::Status s = SaveNpyTensor(absl::GetFlag(FLAGS_lse_out), response.attention().lse());
        !s.ok()) {
      PrintError("--lse_out", s);
      return kExitUsage;
    }
    std::cout << "wrote " << absl::GetFlag(FLAGS_lse_out) << "\n";
  }
  if (absl::Status s = handles.FreeAll(); !s.ok()) {
    PrintError("free", s);
    return kExitCallFailed;
  }
  return exit_code;
}

absl::StatusOr<v1::Tensor> BuildEchoInput(std::mt19937_64& rng) {
  auto dtype = InputDType();
  if (!dtype.ok()) return dtype.status();
  return ShapedInput(*dtype, "1048576", rng);
}

int RunEcho() {
  uint64_t seed = 0;
  std::mt19937_64 rng = MakeRng(seed);
  v1::EchoRequest request;
  auto input = BuildEchoInput(rng);
  if (!input.ok()) {
    PrintError("echo", input.status());
    return kExitUsage;
  }
  *request.mutable_input() = *std::move(input);
  auto client = MakeClient();
  if (!client.ok()) {
    PrintError("client", client.status());
    return kExitUsage;
  }
  std::cout << "echo " << DTypeName(request.input().dtype())
            << ShapeString(ShapeOf(request.input())) << " (" << PayloadBytes(request.input())
            << " bytes, seed " << seed << ")\n";
  const int repeat = std::max(1, absl::GetFlag(FLAGS_repeat));
  std::vector<double> latencies;
  absl::StatusOr<v1::EchoResponse> response;
  for (int i = 0; i < repeat; ++i) {
    auto start = std::chrono::steady_clock::now();
    response = (*client)->Echo(request, MakeCallOptions());
    latencies.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (!response.ok()) {
      PrintError("echo", response.status());
      return kExitCallFailed;
    }
  }
  std::sort(latencies.begin(), latencies.end());
  double median = latencies[latencies.size() / 2];
  std::cout << absl::StrFormat("latency %.3f ms  |  %.3f GB/s (request + response)\n", median * 1e3,
                               2.0 * double(PayloadBytes(request.input())) / median / 1e9);
  PrintTimings(response->timings());
  int exit_code = kExitOk;
  if (absl::GetFlag(FLAGS_check)) {
    auto check = CheckEcho(request, *response);
    if (!check.ok() || !check->ok) {
      std::cout << "check: MISMATCH "
                << (check.ok() ? check->message : std::string(check.status().message())) << "\n";
      exit_code = kExitMismatch;
    } else {
      std::cout << "check: OK (identical)\n";
    }
  }
  if (!absl::GetFlag(FLAGS_out).empty()) {
    if (absl::Status s = SaveNpyTensor(absl::GetFlag(FLAGS_out), response->output()); !s.ok()) {
      PrintError("--out", s);
      return kExitUsage;
    }
    std::cout << "wrote " << absl::GetFlag(FLAGS_out) << "\n";
  }
  return exit_code;
}

int RunInfo() {
  auto client = MakeClient();
  if (!client.ok()) {
    PrintError("client", client.status());
    return kExitUsage;
  }
  auto info = (*client)->GetServerInfo(MakeCallOptions());
  if (!info.ok()) {
    PrintError("info", info.status());
    return kExitCallFailed;
  }
  auto health = (*client)->Health(absl::GetFlag(FLAGS_service), MakeCallOptions());
  std::cout << "server " << (*client)->options().target << "\n";
  std::cout << "version " << info->version() << "\n";
  std::cout << "backend " << info->backend() << "\n";
  std::cout << "health "
            << (health.ok() ? grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*health)
                            : absl::StrCat("unknown (", health.status().message(), ")"))
            << "\n";
  std::cout << absl::StrFormat("max_message_bytes %d\nmax_inflight_bytes %d\n",
                               info->max_message_bytes(), info->max_inflight_bytes());
  std::cout << "devices " << info->devices_size() << "\n";
  for (const v1::DeviceInfo& d : info->devices()) {
    std::cout << absl::StrFormat(
        "  %d  %-4s %-40s memory %.1f GiB  units %d  weight %g  peers [%s]%s\n", d.index(),
        d.kind(), d.name(), double(d.memory_bytes()) / double(1 << 30), d.compute_units(),
        d.weight(), absl::StrJoin(d.peers(), ","), d.healthy() ? "" : "  UNHEALTHY");
  }
  std::cout << "variants\n";
  for (const v1::OperationVariants& op : info->operations()) {
    std::cout << absl::StrFormat("  %-10s %s\n", op.operation(), absl::StrJoin(op.variants(), " "));
  }
  return kExitOk;
}

int RunHealth() {
  auto client = MakeClient();
  if (!client.ok()) {
    PrintError("client", client.status());
    return kExitUsage;
  }
  auto health = (*client)->Health(absl::GetFlag(FLAGS_service), MakeCallOptions());
  if (!health.ok()) {
    PrintError("health", health.status());
    return kExitCallFailed;
  }
  std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*health) << "\n";
  return *health == grpc::health::v1::HealthCheckResponse::SERVING ? kExitOk : kExitCallFailed;
}

}  // namespace gpucompute::cli
