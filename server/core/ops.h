// The operation vocabulary: validated operation descriptions, plain data, no
// protobuf. The service layer builds these from requests
// (server/service/validate.h) after every check; the planner, the cost model,
// the devices and the engine take them as given.
#ifndef GPUCOMPUTE_SERVER_CORE_OPS_H_
#define GPUCOMPUTE_SERVER_CORE_OPS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "proto/dtype.h"
#include "server/common/tensor.h"

namespace gpucompute {

enum class OpKind : int { kGemm = 0, kGemv, kReduce, kTranspose, kAttention };
inline constexpr std::array<OpKind, 5> kAllOps = {OpKind::kGemm, OpKind::kGemv, OpKind::kReduce,
                                                  OpKind::kTranspose, OpKind::kAttention};

// "gemm", "gemv", "reduce", "transpose", "attention".
std::string_view OpName(OpKind op);

// True once nobody waits for an operation's result any more (its caller
// cancelled or passed its deadline, or the server is stopping its calls).
// Thread-safe; cheap enough to ask every few milliseconds.
using CancelCheck = std::function<bool()>;

// Options every operation carries (see proto OpOptions).
struct OpOptions {
  std::string variant;                   // empty: the device's fastest
  std::vector<int> devices;              // empty: every healthy device
  DType output_dtype = DType::kFloat32;  // resolved: never unspecified here
  bool allow_tf32 = false;
  // Keep the results on the server as resident tensors.
  bool keep_output = false;
  // Not from the wire: the engine sets it from its call (CallContext) for
  // the devices, which ask it between blocks of work and give up with
  // CANCELLED once it turns true. Empty: never cancelled.
  CancelCheck cancelled;
};

// C = alpha * op(A) * op(B) + beta * C over `batch` entries.
// A is [batch_a, M, K] ([batch_a, K, M] when trans_a) with batch_a 1 or batch
// (1 = shared); likewise B and C. All three share one dtype (`dtype`).
struct GemmSpec {
  TensorView a, b;
  std::optional<TensorView> c;  // present iff beta != 0
  int64_t batch = 1, m = 0, n = 0, k = 0;
  bool a_batched = false, b_batched = false, c_batched = false;
  bool trans_a = false, trans_b = false;
  double alpha = 1, beta = 0;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> out_shape;  // [M, N] or [batch, M, N]
  OpOptions options;
};

// y = alpha * op(A) * x + beta * y. A is [M, K] ([K, M] when trans_a); x is
// [K, ncols] (stored as [K] when ncols == 1 and x was 1-D); y like x with M rows.
struct GemvSpec {
  TensorView a, x;
  std::optional<TensorView> y;  // present iff beta != 0
  int64_t m = 0, k = 0, ncols = 1;
  bool trans_a = false;
  double alpha = 1, beta = 0;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> out_shape;  // [M] or [M, ncols]
  OpOptions options;
};

enum class ReduceKind : int { kSum = 0, kMax, kMin, kMean };

// Reduction of the input viewed as [outer, axis_len, inner]: out has
// outer * inner elements. A full reduction is outer = inner = 1.
struct ReduceSpec {
  TensorView input;
  ReduceKind kind = ReduceKind::kSum;
  int64_t outer = 1, axis_len = 1, inner = 1;
  std::vector<int64_t> out_shape;
  OpOptions options;
};

// Axis permutation of a rank-1..4 tensor: out.shape[i] = in.shape[perm[i]].
struct TransposeSpec {
  TensorView input;
  int rank = 0;
  std::array<int64_t, 4> in_shape{};
  std::array<int, 4> perm{};
  std::vector<int64_t> out_shape;
  OpOptions options;
};

// Attention head dims both backends implement: every multiple of 8 from 8
// to 256, ascending.
std::vector<int64_t> AttentionHeadDims();

// O = softmax(scale * Q K^T + mask) V with Q [B, Hq, Sq, D], K and V
// [B, Hkv, Skv, D], Hq % Hkv == 0, causal mask aligned bottom-right.
struct AttentionSpec {
  TensorView q, k, v;
  int64_t batch = 0, heads_q = 0, heads_kv = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  bool causal = false;
  double scale = 0;  // resolved: > 0
  bool return_lse = false;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> out_shape;  // [B, Hq, Sq, D]
  OpOptions options;
};

// Bytes that must move and FLOPs that must be done for an operation or one
// shard of it (inputs read once, outputs written once); server/core/cost.h
// computes them.
struct WorkCost {
  double bytes = 0;
  double flops = 0;
  // The part of `bytes` that crosses between host and device memory: the
  // operands in host memory and results going there (resident ones stay).
  double host_bytes = 0;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_CORE_OPS_H_
